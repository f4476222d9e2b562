"""lowering/model.py: ``Model.apply`` and ``Model.loss`` called directly are compiled programs
(issue 41): the README's functional example, run as written, gives the numbers of the caller's
own ``jax.jit`` of it, compiled once per input signature."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import caffe2jax
from tests.golden import ROOT

LENET = ROOT / "examples" / "digits" / "lenet_train_test.prototxt"
SHAPES = {"data": (4, 1, 8, 8), "label": (4,)}


@pytest.fixture(scope="module")
def lenet():
    model = caffe2jax.compile(str(LENET), phase="TRAIN", input_shapes=SHAPES)
    params, state = model.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    inputs = {
        "data": rng.standard_normal(SHAPES["data"]).astype(np.float32),
        "label": rng.integers(0, 10, SHAPES["label"]).astype(np.float32),
    }
    return model, params, state, inputs


def _traces(model, name: str, calls) -> int:
    """How many times the graph is traced while ``calls`` runs on a fresh compiled program."""
    count = 0
    inner = model.graph.apply

    def counting(*args, **kwargs):
        nonlocal count
        count += 1
        return inner(*args, **kwargs)

    model.graph.apply = counting
    model._compiled.clear()
    try:
        calls()
    finally:
        del model.graph.apply
        model._compiled.clear()
    return count


def test_direct_apply_returns_the_jitted_numbers(lenet):
    model, params, state, inputs = lenet
    direct, _ = model.apply(params, state, inputs)
    jitted, _ = jax.jit(model.apply)(params, state, inputs)
    assert set(direct) == set(jitted)
    for name in direct:
        np.testing.assert_array_equal(np.asarray(direct[name]), np.asarray(jitted[name]), name)
    # the op-by-op path (the documented debugging switch) computes the same forward
    with jax.disable_jit():
        eager, _ = model.apply(params, state, inputs)
    np.testing.assert_allclose(eager["loss"], direct["loss"], rtol=1e-5)


def test_direct_loss_and_its_grad_equal_the_jitted_ones(lenet):
    model, params, state, inputs = lenet
    value, (blobs, _) = model.loss(params, state, inputs)
    jvalue, _ = jax.jit(model.loss)(params, state, inputs)
    np.testing.assert_array_equal(np.asarray(value), np.asarray(jvalue))
    np.testing.assert_array_equal(np.asarray(value), np.asarray(blobs["loss"]))
    grads = jax.grad(lambda p: model.loss(p, state, inputs)[0])(params)
    jgrads = jax.jit(jax.grad(lambda p: model.loss(p, state, inputs)[0]))(params)
    for layer in grads:
        for g, jg in zip(grads[layer], jgrads[layer]):
            np.testing.assert_allclose(np.asarray(g), np.asarray(jg), rtol=1e-6, atol=1e-7)


def test_apply_compiles_once_per_signature(lenet):
    model, params, state, inputs = lenet

    def three_calls():
        for _ in range(3):
            model.apply(params, state, inputs)

    assert _traces(model, "apply", three_calls) == 1

    def with_and_without_rng():
        model.apply(params, state, inputs)
        model.apply(params, state, inputs, jax.random.key(1))
        model.apply(params, state, inputs, jax.random.key(2))

    assert _traces(model, "apply", with_and_without_rng) == 2


def test_a_callers_jit_traces_the_net_once(lenet):
    model, params, state, inputs = lenet
    step = jax.jit(lambda p: model.loss(p, state, inputs)[0])
    assert _traces(model, "loss", lambda: [step(params) for _ in range(2)]) == 1


def test_lists_and_scalars_are_fed_as_arrays(lenet):
    model, params, state, inputs = lenet
    listed = {name: value.tolist() for name, value in inputs.items()}
    a, _ = model.apply(params, state, listed)
    b, _ = model.apply(params, state, inputs)
    np.testing.assert_array_equal(np.asarray(a["loss"]), np.asarray(b["loss"]))


def test_vmap_over_a_batch_of_param_sets(lenet):
    model, params, state, inputs = lenet
    stacked = jax.tree.map(lambda x: jnp.stack([x, 2 * x]), params)
    losses = jax.vmap(lambda p: model.loss(p, state, inputs)[0])(stacked)
    doubled = jax.tree.map(lambda x: 2 * x, params)
    np.testing.assert_allclose(losses[0], model.loss(params, state, inputs)[0], rtol=1e-6)
    np.testing.assert_allclose(losses[1], model.loss(doubled, state, inputs)[0], rtol=1e-5)
