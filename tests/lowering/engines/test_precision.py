"""Compute precision (lowering/engines/precision.py): fp32 is Caffe's; bf16 computes the heavy
layers in bfloat16 while params, gradients and returned blobs stay float32."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from caffe2jax.runtime.formats.weights import load_weights
from caffe2jax.runtime.train.loop import SolverLoop
from tests.golden import GOLDEN, require

NETS = require(GOLDEN / "nets")
SOLVERS = require(GOLDEN / "solvers")
LENET = NETS / "lenet_train.prototxt"
SHAPES = {"data": (8, 1, 28, 28), "label": (8,)}


def lenet(precision=None):
    model = caffe2jax.compile(LENET, "TRAIN", input_shapes=SHAPES, precision=precision)
    params, state = load_weights(NETS / "lenet_train.caffemodel", model)
    rng = np.random.default_rng(0)
    inputs = {"data": rng.uniform(0, 1, SHAPES["data"]).astype(np.float32),
              "label": rng.integers(0, 10, 8).astype(np.float32)}  # fmt: skip
    return model, params, state, inputs


def loss_and_grads(model, params, state, inputs):
    (loss, (blobs, _)), grads = jax.value_and_grad(model.loss, has_aux=True)(params, state, inputs)
    return loss, blobs, grads


def test_bf16_keeps_fp32_params_grads_and_blobs_close_to_fp32():
    model, params, state, inputs = lenet("bf16")
    loss, blobs, grads = loss_and_grads(model, params, state, inputs)
    ref_loss, ref_blobs, ref_grads = loss_and_grads(lenet("fp32")[0], params, state, inputs)
    assert model.precision == "bf16"
    for g in jax.tree.leaves(grads):
        assert g.dtype == jnp.float32  # master weights' gradients stay fp32
    for name, value in blobs.items():
        assert value.dtype == ref_blobs[name].dtype, name
    # bfloat16 keeps 8 mantissa bits: about 3 significant digits through two conv layers
    assert abs(float(loss) - float(ref_loss)) <= 2e-2 * abs(float(ref_loss))
    # gradients: the rounding compounds down the backward pass; LeNet's first conv measured
    # 12 % relative L2 error at cosine 0.993 (the last layer 0.7 %); direction is what SGD uses
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        g, r = np.asarray(g).ravel(), np.asarray(r).ravel()
        assert np.linalg.norm(g - r) <= 0.2 * np.linalg.norm(r)
        assert g @ r >= 0.99 * np.linalg.norm(g) * np.linalg.norm(r)
    assert float(loss) != float(ref_loss), "bf16 computed exactly what fp32 did: not applied"


def test_fp32_is_the_default_and_tf32_equals_it_without_tf32_units():
    _, params, state, inputs = lenet()
    ref = loss_and_grads(lenet()[0], params, state, inputs)
    got = loss_and_grads(lenet("fp32")[0], params, state, inputs)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-6)
    # CPUs have no TF32 units: tf32 computes fp32. On a GPU with them the inputs of each
    # product keep 10 mantissa bits (relative rounding 2^-11 ≈ 5e-4 per product).
    rtol = 1e-6 if jax.default_backend() == "cpu" else 2e-3
    got = loss_and_grads(lenet("tf32")[0], params, state, inputs)
    np.testing.assert_allclose(got[0], ref[0], rtol=rtol)


def test_the_precision_is_carried_by_the_model_and_every_reshape():
    model = caffe2jax.compile(LENET, "TRAIN", input_shapes=SHAPES, precision="bf16")
    assert model.precision == "bf16"
    assert model.reshape({"data": (2, 1, 28, 28), "label": (2,)}).precision == "bf16"
    assert caffe2jax.compile(LENET, "TRAIN", input_shapes=SHAPES).precision == "fp32"


def test_the_solver_loop_passes_its_precision_to_the_nets_it_builds(tmp_path):
    """One explicit value, like the engine policy: ``SolverLoop(..., precision=)`` (the CLI's
    ``train --precision``) gives it to the train net and every test net; no scope reaches them."""
    shutil.copytree(SOLVERS / "sgd_fixed", tmp_path / "case")
    solver = tmp_path / "case" / "solver.prototxt"
    loop = SolverLoop(str(solver), precision="bf16")
    try:
        assert [n.model.precision for n in [loop.train, *loop.tests]] == ["bf16"] * (
            1 + len(loop.tests)
        )
    finally:
        loop.close()
    default = SolverLoop(str(solver))
    try:
        assert default.train.model.precision == "fp32"
    finally:
        default.close()


def test_unknown_precision_names_the_supported_ones():
    with pytest.raises(NetError, match="unknown precision 'fp16'; supported: fp32, tf32, bf16"):
        caffe2jax.compile(LENET, "TRAIN", input_shapes=SHAPES, precision="fp16")
