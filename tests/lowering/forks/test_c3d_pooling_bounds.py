"""C3D's Pooling3D (lowering/forks/c3d.py) with windows that read no input. C3D rounds the
pooled size up without BVLC's last-window correction, so a window can start past the input:
with a stride of 2^31 − 1 (the padding is bounded by what the windows read: it was
``(out − 1)·stride + kernel``, an XLA abort) and with kernel 1, stride 2 on an even width, where
C3D itself gives NaN (AVE, 0 / 0) and −FLT_MAX (MAX). caffe2jax keeps C3D's arithmetic and warns
at compile time naming the layer. Jitted forwards and ``jax.vjp`` against C3D's loops."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.forks.test_c3d import FLT_MAX, max_pool3d_backward_loops, pool3d_loops
from tests.lowering.nets import net_text

RNG = np.random.default_rng(3737)
HUGE = 2**31 - 1


def pool_param(method, k, kd, st, ts, pad=0):
    return (f"pooling3d_param {{ pool: {method} kernel_size: {k} kernel_depth: {kd} "
            f"stride: {st} temporal_stride: {ts} pad: {pad} }}")  # fmt: skip


def _run(shape, param):
    """(model, x, y, dy, dx): the jitted forward and its jitted vjp for a random top diff."""
    model = compile_net(net_text("Pooling3D", [shape], param))
    params, state = model.init(0)
    x = RNG.standard_normal(shape).astype(np.float32)

    def forward(x):
        return model.apply(params, state, {"x": x})[0]["y"]

    dy = RNG.standard_normal(model.net.shapes[model.net.blob_names["y"]]).astype(np.float32)
    y, (dx,) = jitted.vjp(forward, [jnp.asarray(x)], dy)
    return x, np.asarray(y), dy, np.asarray(dx)


@pytest.mark.parametrize("stride,ts", [(HUGE, 1), (2, HUGE), (HUGE, HUGE), (65536, 2)])
def test_max_pool3d_with_a_huge_stride_equals_c3d(stride, ts):
    with pytest.warns(UserWarning, match=r"layer 'layer' \(Pooling3D\).*-FLT_MAX"):
        x, y, dy, dx = _run((1, 2, 4, 5, 6), pool_param("MAX", 2, 2, stride, ts))
    want = pool3d_loops(x.astype(np.float64), "MAX", 2, 2, stride, ts, 0)
    assert y.shape == want.shape
    np.testing.assert_array_equal(y, want.astype(np.float32))
    backward = max_pool3d_backward_loops(x, y, dy, 2, 2, stride, ts)
    np.testing.assert_allclose(dx, backward, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("stride,pad", [(HUGE, 0), (HUGE, 1), (65536, 2)])
def test_ave_pool3d_with_a_huge_stride_equals_c3d(stride, pad):
    with pytest.warns(UserWarning, match=r"layer 'layer' \(Pooling3D\)"):
        x, y, dy, dx = _run((1, 2, 3, 5, 6), pool_param("AVE", 3, 2, stride, HUGE, pad))
    want = pool3d_loops(x.astype(np.float64), "AVE", 3, 2, stride, HUGE, pad)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    assert np.isfinite(dx).all()


def test_last_window_outside_the_input_keeps_c3ds_values_and_warns():
    """kernel 1, stride 2, width 4: C3D's size ceil(3/2) + 1 = 3 puts the last window at 4. Its
    AVE divides a zero sum by a size of 0 (NaN), its MAX keeps −FLT_MAX; the layer is named."""
    for method in ("AVE", "MAX"):
        with pytest.warns(UserWarning, match=r"layer 'layer' \(Pooling3D\): output \[1, 3, 3\]"):
            x, y, _, dx = _run((1, 1, 1, 4, 4), pool_param(method, 1, 1, 2, 1))
        with np.errstate(invalid="ignore"):
            want = pool3d_loops(x.astype(np.float64), method, 1, 1, 2, 1, 0)
        np.testing.assert_array_equal(y, want.astype(np.float32))  # NaN where C3D has NaN
        assert np.isfinite(dx).all()
    assert np.isnan(y).sum() == 0 and (y[0, 0, 0, 2] == -FLT_MAX).all()


def test_no_warning_when_every_window_reads_the_input():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run((1, 1, 4, 5, 5), pool_param("MAX", 2, 2, 2, 2))
        _run((1, 1, 4, 6, 6), pool_param("AVE", 3, 2, 2, 2, 1))
