"""The MAX/AVE pooling forms (lowering/engines/windows.py; engine policy ``pool``,
CAFFE2JAX_POOL): strided views with phase-sum backwards, the reduce_window forward behind an
expensive producer, and XLA's reduce_window with its autodiff. Each against Caffe's loops in
numpy (ties, ceil mode, pads, kernel < stride, NCHW and channels-last) and every golden Pooling
case against real Caffe in each form; which form the policy plans on and off the CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import caffe2jax
from caffe2jax.lowering.engines.policy import EnginePolicy
from caffe2jax.lowering.layers import pooling
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.golden import GOLDEN, load_npz, require
from tests.lowering.layers.test_pooling import (
    caffe_ave_pool,
    caffe_max_pool,
    max_pool_ties_route_to_first_max,
)
from tests.lowering.test_golden_layers import rel_err

jax.config.update("jax_default_matmul_precision", "highest")

RNG = np.random.default_rng(20240607)
LAYERS = require(GOLDEN / "layers")
POOL_CASES = sorted(p.stem for p in LAYERS.glob("pool*.npz") if load_npz(p)[1]["type"] == "Pooling")


@pytest.mark.parametrize("mode", ["phases", "xla"])
@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (2, 2, 0), (3, 3, 0), (2, 2, 1), (3, 1, 1)])
def test_max_pool_backward_forms_both_route_to_first_max(mode, k, s, p):
    """MAX pooling's two forms (per-offset selects and phase sums, XLA's select_and_scatter)."""
    max_pool_ties_route_to_first_max(k, s, p, EnginePolicy(pool=mode))


@pytest.mark.parametrize("mode", ["phases", "phases-rw", "xla"])
@pytest.mark.parametrize("k,s,p", [(3, 2, 0), (3, 2, 1), (2, 3, 1), (3, 1, 1), (5, 3, 2)])
@pytest.mark.parametrize("nhwc", [False, True])
def test_ave_pool_forms_match_caffe(mode, k, s, p, nhwc):
    """AVE pooling's forms (views or reduce_window forward with the phase-sum backward; XLA's
    reduce_window and its transpose), NCHW and channels-last, against Caffe's loops (ceil
    mode, windows clipped at the padded border)."""
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    spec = pooling.make_spec(None, pooling.AVE, x.shape[2:], (k, k), (s, s), (p, p))
    to, back = ((lambda a: a.transpose(0, 2, 3, 1)), (lambda a: a.transpose(0, 3, 1, 2)))
    if not nhwc:
        to = back = lambda a: a
    y, vjp = jax.vjp(lambda x: back(pooling.ave_pool(to(x), spec, nhwc, mode)), jnp.asarray(x))
    top, backward = caffe_ave_pool(x.astype(np.float64), (k, k), (s, s), (p, p), spec.out)
    np.testing.assert_allclose(y, top, rtol=1e-6, atol=1e-6)
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    np.testing.assert_allclose(vjp(jnp.asarray(dy))[0], backward(dy), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("form", ["phases", "phases-rw"])
@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (2, 1, 0), (3, 2, 0)])
def test_max_pool_reduce_window_forward_keeps_first_max(form, k, s, p):
    """Behind an expensive layer the MAX forward is XLA's reduce_window (windows.window_max);
    either forward, the backward still routes each diff to Caffe's first maximum."""
    x = RNG.integers(0, 3, (2, 2, 7, 6)).astype(np.float32)
    spec = pooling.make_spec(None, pooling.MAX, x.shape[2:], (k, k), (s, s), (p, p))
    y, vjp = jax.vjp(lambda x: pooling.max_pool(x, spec, form=form), jnp.asarray(x))
    top, _, backward = caffe_max_pool(x, (k, k), (s, s), (p, p), spec.out)
    np.testing.assert_array_equal(y, top)
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    np.testing.assert_allclose(vjp(jnp.asarray(dy))[0], backward(dy), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("producer,reads_once", [("LRN", True), ("ReLU", False)])
def test_pooling_reads_an_expensive_bottom_once(producer, reads_once):
    """Behind LRN (power per element) pooling uses reduce_window, which reads its input once;
    behind ReLU it uses the k_h·k_w strided views XLA fuses (lowering/layers/pooling.py
    EXPENSIVE_PRODUCERS, decided when the net is planned)."""
    text = f"""
input: "x" input_shape {{ dim: 1 dim: 4 dim: 9 dim: 9 }}
layer {{ name: "p" type: "{producer}" bottom: "x" top: "h" }}
layer {{ name: "pool" type: "Pooling" bottom: "h" top: "y"
        pooling_param {{ pool: MAX kernel_size: 3 stride: 2 }} }}
"""
    model = compile_net(text, policy=EnginePolicy(pool="phases"))
    assert model.graph.engines["pool"] == ("phases-rw" if reads_once else "phases")
    params, state = model.init(0)
    jaxpr = str(jax.make_jaxpr(lambda x: model.apply(params, state, {"x": x})[0]["y"])(
        jnp.zeros((1, 4, 9, 9))))  # fmt: skip
    assert ("reduce_window_max" in jaxpr) == reads_once


@pytest.mark.parametrize("k,s", [(2, 2), (3, 2)])
def test_pooling_off_the_cpu_keeps_the_forms_the_gpu_table_measured(k, s):
    """``auto`` off the CPU: reduce_window forwards, per-offset selects for non-overlapping
    MAX windows, select_and_scatter for overlapping ones; the same values and diffs, ties
    included, as the xla form."""
    x = jnp.asarray(RNG.integers(0, 3, (2, 2, 8, 8)).astype(np.float32))
    spec = pooling.make_spec(None, pooling.MAX, (8, 8), (k, k), (s, s), (0, 0))
    results = {}
    for setting in ("auto", "xla"):
        engines = EnginePolicy(pool=setting, backend="gpu")
        form = engines.pool_form("max", spec.kernel, spec.stride, False)
        f = lambda x, form=form: pooling.max_pool(x, spec, form=form)  # noqa: E731
        jaxpr = str(jax.make_jaxpr(f)(x))
        y, vjp = jax.vjp(f, x)
        results[setting] = y, vjp(jnp.arange(y.size, dtype=y.dtype).reshape(y.shape))[0]
        assert "reduce_window_max" in jaxpr
        assert ("custom_vjp" in jaxpr) == (setting == "auto" and k <= s)
    for a, b in zip(results["auto"], results["xla"]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("setting", ["phases", "xla"])
@pytest.mark.parametrize("case", POOL_CASES)
def test_golden_pooling_case_in_each_form(case, setting):
    """Every golden Pooling case with the policy's pool setting: Caffe's top(s) and bottom
    diff to 1e-5 (as tests/lowering/test_golden_layers.py checks the default form)."""
    arrays, meta = load_npz(LAYERS / f"{case}.npz")
    model = caffe2jax.compile(str(arrays["prototxt"]), phase=meta["phase"],
                              policy=EnginePolicy(pool=setting))  # fmt: skip
    if model.net.layer("layer").param.pooling_param.pool in (pooling.MAX, pooling.AVE):
        assert model.graph.engines["layer"] == setting
    params, state = model.init(0)
    inputs = {n: arrays[f"in__{n}"] for n in model.inputs}
    tops = [t["name"] for t in meta["tops"]]

    def forward(inputs):
        blobs, _ = jitted.forward(model, params, state, inputs, jax.random.key(0))
        return [blobs[t] for t in tops]

    outs, vjp = jax.vjp(forward, inputs)
    for top, out in zip(tops, outs):
        assert rel_err(out, arrays[f"out__{top}"]) <= 1e-5, f"forward top '{top}'"
    if not meta["backward"]:
        return
    (grads,) = vjp([np.asarray(arrays[f"topdiff__{t}"], np.float32) for t in tops])
    for name in grads:
        if f"grad__{name}" in arrays:
            assert rel_err(grads[name], arrays[f"grad__{name}"]) <= 1e-5, name
