"""Pooling (lowering/layers/pooling.py) with windows that read no input: CEIL rounding with a
stride far above the input (2^31 − 1, 65,536) gives Caffe's 2×2 top whose last windows start
past the input. Only the windows that read an input cell are pooled, so the padding stays under
one kernel (it was ``(out − 1)·stride + kernel``: an XLA abort at 2^31 − 1, 34 GB at 65,536);
the others keep Caffe's values (MAX −FLT_MAX and mask −1, AVE 0 / pool_size). Each case runs
jitted and under ``jax.vjp`` (tests/jitted.py) against Caffe's loops, in every pooling form of
the engine policy, for BVLC's Pooling, the ``ceil_mode`` spelling and darknet2caffe's form."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.lowering.engines.policy import EnginePolicy
from caffe2jax.lowering.layers import pooling
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import net
from tests.lowering.layers.test_pooling import caffe_ave_pool, caffe_max_pool
from tests.lowering.nets import net_text

RNG = np.random.default_rng(37)
HUGE = [2**31 - 1, 65536, 7]
FORMS = ["xla", "phases"]  # the policy's settings; "phases-rw" (behind LRN…) tested below


def _forward_and_backward(model, x, tops):
    params, state = model.init(0)

    def forward(x):
        blobs = model.apply(params, state, {"x": x})[0]
        return [blobs[t] for t in tops]

    dys = [RNG.standard_normal(o.shape).astype(np.float32) for o in jax.jit(forward)(x)]
    out, (dx,) = jitted.vjp(forward, [jnp.asarray(x)], dys)
    return [np.asarray(o) for o in out], dys, np.asarray(dx)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("stride", HUGE)
def test_max_pool_with_a_huge_stride_equals_caffe(form, stride):
    x = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
    param = f"pooling_param {{ pool: MAX kernel_size: 2 stride: {stride} }}"
    model = compile_net(net_text("Pooling", [x.shape], param, tops=("y", "mask")),
                        policy=EnginePolicy(pool=form))  # fmt: skip
    (y, mask), (dy, _), dx = _forward_and_backward(model, x, ("y", "mask"))
    top, ref_mask, backward = caffe_max_pool(x, (2, 2), (stride,) * 2, (0, 0), y.shape[2:])
    assert y.shape == (2, 3, 2, 2)
    np.testing.assert_array_equal(y, top.astype(np.float32))
    np.testing.assert_array_equal(mask, ref_mask)
    # the loop's scatter would send a −1 mask's diff to the last cell; Caffe's skips it
    np.testing.assert_allclose(dx, backward(dy * (ref_mask >= 0)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("stride", HUGE)
@pytest.mark.parametrize("spelling", ["", "round_mode: CEIL", "ceil_mode: true"])
def test_ave_pool_with_a_huge_stride_equals_caffe(form, stride, spelling):
    x = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
    param = f"pooling_param {{ pool: AVE kernel_size: 3 stride: {stride} {spelling} }}"
    model = compile_net(net_text("Pooling", [x.shape], param), policy=EnginePolicy(pool=form))
    (y,), (dy,), dx = _forward_and_backward(model, x, ("y",))
    top, backward = caffe_ave_pool(x.astype(np.float64), (3, 3), (stride,) * 2, (0, 0), y.shape[2:])
    assert y.shape == (2, 3, 2, 2)
    np.testing.assert_allclose(y, top, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dx, backward(dy), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_channels_last_form_with_a_huge_stride(method):
    """The NHWC form (lowering/layout.py) pools the same windows."""
    x = RNG.standard_normal((1, 2, 6, 5)).astype(np.float32)
    kind = pooling.MAX if method == "MAX" else pooling.AVE
    spec = pooling.make_spec(None, kind, x.shape[2:], (2, 2), (2**31 - 1,) * 2, (0, 0))
    fn = pooling.max_pool if method == "MAX" else pooling.ave_pool
    nhwc = jax.jit(lambda x: fn(x.transpose(0, 2, 3, 1), spec, True).transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(nhwc(jnp.asarray(x)), jax.jit(lambda x: fn(x, spec))(x))


@pytest.mark.parametrize("form", ["xla", "phases", "phases-rw"])
@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_every_form_with_a_huge_stride(form, method):
    x = RNG.standard_normal((1, 2, 6, 5)).astype(np.float32)
    kind, k, s = (pooling.MAX if method == "MAX" else pooling.AVE), (3, 2), (2**31 - 1, 4)
    spec = pooling.make_spec(None, kind, x.shape[2:], k, s, (0, 0))
    fn = pooling.max_pool if method == "MAX" else pooling.ave_pool
    y = np.asarray(jax.jit(lambda x: fn(x, spec, form=form))(x))
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    _, (dx,) = jitted.vjp(lambda x: fn(x, spec, form=form), [jnp.asarray(x)], dy)
    if method == "MAX":
        top, mask, backward = caffe_max_pool(x, k, s, (0, 0), spec.out)
        dy = dy * (mask >= 0)
    else:
        top, backward = caffe_ave_pool(x.astype(np.float64), k, s, (0, 0), spec.out)
    np.testing.assert_allclose(y, top, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dx, backward(dy), rtol=1e-6, atol=1e-6)


def test_kernel_below_stride_keeps_caffes_empty_window_values():
    """kernel 1, stride 2 on an even width: the last window starts at W. Caffe's AVE divides its
    zero sum by a pool_size of 0 (NaN, reproduced), MAX keeps −FLT_MAX."""
    x = RNG.standard_normal((1, 1, 4, 4)).astype(np.float32)
    for method in ("AVE", "MAX"):
        param = f"pooling_param {{ pool: {method} kernel_size: 1 stride: 2 }}"
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            (y,), _, _ = _forward_and_backward(compile_net(net_text("Pooling", [x.shape], param)),
                                               x, ("y",))  # fmt: skip
        named = [w for w in seen if "layer 'layer' (Pooling): AVE windows past" in str(w.message)]
        assert bool(named) == (method == "AVE")  # the NaN is said, naming the layer
        if method == "AVE":
            top, _ = caffe_ave_pool_nan(x)
            np.testing.assert_array_equal(y, top.astype(np.float32))
        else:
            assert (y[0, 0, 2] == -np.finfo(np.float32).max).all()


def caffe_ave_pool_nan(x):
    """Caffe's loop where pool_size is 0 (numpy's 0/0 is NaN, as C++'s float division)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return caffe_ave_pool(x.astype(np.float64), (1, 1), (2, 2), (0, 0), (3, 3))


def test_darknet2caffe_form_with_a_huge_stride():
    """darknet2caffe's Pooling (selected by the Mish layer) pools through the same windows."""
    x = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    pool = (
        'layer { name: "pool" type: "Pooling" bottom: "x" top: "y" '
        f"pooling_param {{ pool: MAX kernel_size: 2 stride: {2**31 - 1} }} }}\n"
        'layer { name: "m" type: "Mish" bottom: "y" top: "m" }'
    )
    model = compile_net(net(pool, {"x": x.shape}))
    assert model.net.layers[1].form == "darknet2caffe"
    (y,), (dy,), dx = _forward_and_backward(model, x, ("y",))
    top, mask, backward = caffe_max_pool(x, (2, 2), (2**31 - 1,) * 2, (0, 0), (2, 2))
    np.testing.assert_array_equal(y, top.astype(np.float32))
    np.testing.assert_allclose(dx, backward(dy * (mask >= 0)), rtol=1e-6, atol=1e-6)


def test_live_spec_bounds_the_padding():
    """Whatever the stride, the windows pooled need less than one kernel past the input."""
    spec = pooling.make_spec(None, pooling.AVE, (5, 4), (3, 3), (2**31 - 1,) * 2, (0, 0))
    live = pooling.live_spec(spec, (5, 4))
    assert spec.out == (2, 2) and live.out == (1, 1)
    assert pooling.reads_nothing(spec, (5, 4))
    assert not pooling.reads_nothing(pooling.make_spec(None, 1, (5, 4), (3, 3), (2, 2), (1, 1)),
                                     (5, 4))  # fmt: skip
