"""C3D's layers: Convolution3D, Pooling3D and VideoData (facebook/C3D v1.1, and v1.0's
CONVOLUTION3D / POOLING3D / VIDEO_DATA, which the frontend upgrades to the same
``convolution3d_param`` / ``pooling3d_param`` / ``video_data_param``: form ``"c3d-v1.0"`` differs
only in how its weights and mean file are stored, so the 3-D layers have one entry for both).

Reproduced from C3D (convolution3d_layer.cpp, pool3d_layer.cpp/.cu, v1.0 and v1.1 alike), on
(N, C, L, H, W) blobs:

* Convolution3D: one bottom, one top; weights ``(num_output, C, kernel_depth, k, k)``, bias
  ``(1, 1, 1, 1, num_output)`` (C3D's blob shapes). ``L' = (L + 2·temporal_pad − kd) /
  temporal_stride + 1`` and ``H' = (H + 2·pad − k) / stride + 1`` (floor), zero padding.
  ``group`` is never read by C3D and ``filter_group`` only runs the output filters in
  sequential chunks (the same result): neither changes the convolution.
* Pooling3D: ``H' = ceil((H + 2·pad − k) / stride) + 1``, ``L' = ceil((L − kd) /
  temporal_stride) + 1`` (no temporal padding and no BVLC last-window correction); windows
  are clipped to the input. MAX (no padding allowed) starts from −FLT_MAX; AVE sums the
  clipped window and divides by its size clipped to ``[−pad, H + pad)`` (padded cells count)
  and ``[0, L)``. STOCHASTIC is not implemented in C3D.
* VideoData (forms ``c3d`` and ``c3d-v1.0``): clips of ``new_length`` frames from the folders
  ``video_data_param.source`` lists, read by the runtime's pipeline
  (caffe2jax.runtime.data.video_data); both tops, data and label.
* MAX backward: C3D sends each top diff to *every* cell of the window equal to the maximum
  (CPU and GPU kernels alike), not to one of them as the true (sub)gradient would: a
  ``custom_vjp`` reproduces it (it matters on ties, e.g. windows of zeros after a ReLU).
"""

from __future__ import annotations

import itertools
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.layers.data import from_source
from caffe2jax.lowering.registry import Context, ParamDecl, register
from caffe2jax.lowering.util import fail

P3 = caffe_pb2.Pooling3DParameter
_FLT_MAX = float(np.finfo(np.float32).max)
Triple = tuple[int, int, int]


def _five_d(layer: ir.Layer, shape) -> None:
    if len(shape) != 5:
        raise fail(
            layer,
            f"input must have 5 axes (num, channels, length, height, width), got {list(shape)}",
        )


def _positive(layer: ir.Layer, **values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise fail(layer, f"{name} must be positive (got {value})")


# -- Convolution3D --------------------------------------------------------------------------


def conv3d_geometry(layer: ir.Layer, shape) -> tuple[Triple, Triple, Triple]:
    """(kernel, stride, pad) over (L, H, W) of a Convolution3D layer on a bottom of
    ``shape``, checked as C3D's LayerSetUp does (and refusing an empty output)."""
    _five_d(layer, shape)
    p = layer.param.convolution3d_param
    _positive(
        layer,
        num_output=p.num_output,
        kernel_size=p.kernel_size,
        kernel_depth=p.kernel_depth,
        stride=p.stride,
        temporal_stride=p.temporal_stride,
        filter_group=p.filter_group,
    )
    if p.num_output % p.filter_group:
        raise fail(
            layer, f"num_output {p.num_output} is not divisible by filter_group {p.filter_group}"
        )
    kernel = (p.kernel_depth, p.kernel_size, p.kernel_size)
    stride = (p.temporal_stride, p.stride, p.stride)
    pad = (p.temporal_pad, p.pad, p.pad)
    for size, k, q, axis in zip(shape[2:], kernel, pad, "LHW"):
        if k > size + 2 * q:
            raise fail(
                layer, f"kernel {k} is larger than the padded input {size} + 2·{q} along {axis}"
            )
    return kernel, stride, pad


@register("Convolution3D", counts=(1, 1, 1, 1))
def convolution3d(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """Convolution3DLayer: C3D's strided, padded 3-D convolution plus bias."""
    x = bottoms[0]
    _, stride, pad = conv3d_geometry(layer, x.shape)
    y = lax.conv_general_dilated(x, params[0], stride, [(q, q) for q in pad])
    if layer.param.convolution3d_param.bias_term:
        y = y + params[1].reshape((-1, 1, 1, 1))
    return [y]


@convolution3d.param_shapes
def _(layer: ir.Layer, bottom_shapes) -> list[ParamDecl]:
    shape = tuple(bottom_shapes[0])
    kernel, _, _ = conv3d_geometry(layer, shape)
    p = layer.param.convolution3d_param
    decls = [ParamDecl((p.num_output, shape[1], *kernel), p.weight_filler)]
    if p.bias_term:
        decls.append(ParamDecl((1, 1, 1, 1, p.num_output), p.bias_filler))
    return decls


# -- Pooling3D ------------------------------------------------------------------------------


def pooled3d_size(size: int, kernel: int, stride: int, pad: int) -> int:
    """C3D's pooled size on one axis: ``ceil(float(size + 2·pad − kernel) / stride) + 1``
    (the float division of a small integer is exact, so the ceiling is the integer one)."""
    return -(-(size + 2 * pad - kernel) // stride) + 1


def pool3d_spec(layer: ir.Layer, shape) -> tuple[int, Triple, Triple, Triple, Triple]:
    """(method, kernel, stride, pad, out) over (L, H, W), checked as C3D's LayerSetUp."""
    _five_d(layer, shape)
    p = layer.param.pooling3d_param
    if p.pool == P3.STOCHASTIC:
        raise fail(layer, "STOCHASTIC pooling is not implemented in C3D (MAX and AVE are)")
    _positive(
        layer,
        kernel_size=p.kernel_size,
        kernel_depth=p.kernel_depth,
        stride=p.stride,
        temporal_stride=p.temporal_stride,
    )
    if p.pad and p.pool != P3.AVE:
        raise fail(layer, "padding is implemented only for average pooling (C3D)")
    kernel = (p.kernel_depth, p.kernel_size, p.kernel_size)
    stride = (p.temporal_stride, p.stride, p.stride)
    pad = (0, p.pad, p.pad)
    out = tuple(pooled3d_size(n, k, s, q) for n, k, s, q in zip(shape[2:], kernel, stride, pad))
    if min(out) < 1:
        raise fail(
            layer,
            f"pooling kernel {list(kernel)} with stride {list(stride)} and pad {list(pad)} "
            f"gives an empty output for input {list(shape[2:])}",
        )
    return p.pool, kernel, stride, pad, out  # type: ignore[return-value]


def _padding(shape, kernel, stride, pad, out) -> list[tuple[int, int]]:
    """reduce_window padding of (N, C, L, H, W): ``pad`` before, and after whatever the last
    (ceil) window needs beyond the input and its padding."""
    spatial = [
        (q, max(0, (o - 1) * s + k - n - q))
        for n, k, s, q, o in zip(shape[2:], kernel, stride, pad, out)
    ]
    return [(0, 0), (0, 0), *spatial]


def _ave_divisor(shape, kernel, stride, pad, out) -> np.ndarray:
    """C3D's AVE divisor per output cell: the window clipped to ``[−pad, n + pad)`` (L: to
    ``[0, L)``), the product over the three axes."""
    sizes = []
    for n, k, s, q, o in zip(shape[2:], kernel, stride, pad, out):
        start = np.arange(o) * s - q
        sizes.append(np.minimum(start + k, n + q) - start)
    return np.einsum("i,j,k->ijk", *sizes).astype(np.float64)


def _window_max(x, kernel: Triple, stride: Triple, padding) -> jax.Array:
    # a NumPy init stays concrete under jit: JAX sees the max monoid (a traced init is not)
    return lax.reduce_window(
        x, np.asarray(-_FLT_MAX, x.dtype), lax.max, (1, 1, *kernel), (1, 1, *stride), padding
    )


@partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def max_pool3d(x, kernel: Triple, stride: Triple, padding) -> jax.Array:
    """C3D's MAX Pooling3D (no padding: ``padding`` only extends the last ceil windows)."""
    return _window_max(x, kernel, stride, padding)


def _max_fwd(x, kernel, stride, padding):
    y = _window_max(x, kernel, stride, padding)
    return y, (x, y)


def _max_bwd(kernel, stride, padding, residuals, dy):
    """Every window cell equal to the window's maximum receives the window's top diff."""
    x, y = residuals
    fill = jnp.asarray(-_FLT_MAX, x.dtype)
    xp = jnp.pad(x, padding, constant_values=fill)
    length, h, w = x.shape[2:]
    if tuple(stride) == tuple(kernel):  # C3D's pools: disjoint windows, no scatter needed
        y_up, dy_up = y, dy
        for axis, k in zip((2, 3, 4), kernel):
            y_up, dy_up = jnp.repeat(y_up, k, axis), jnp.repeat(dy_up, k, axis)
        grad = jnp.where(xp == y_up, dy_up, 0)
        return (grad[:, :, :length, :h, :w],)
    grad = jnp.zeros_like(xp)
    out = y.shape[2:]
    for offset in itertools.product(*(range(k) for k in kernel)):
        index = (slice(None), slice(None)) + tuple(
            slice(o, o + s * (n - 1) + 1, s) for o, s, n in zip(offset, stride, out)
        )
        grad = grad.at[index].add(jnp.where(xp[index] == y, dy, 0))
    return (grad[:, :, :length, :h, :w],)


max_pool3d.defvjp(_max_fwd, _max_bwd)


def live_windows(shape, kernel, stride, pad, out) -> tuple[Triple, Triple]:
    """(stride, out) of the windows that read an input cell: on each axis the first
    ``ceil((n + pad) / stride)``. A lone window's stride is never used: it is set to the padded
    extent ``max(n + pad, kernel)``, so reduce_window makes that one window. Pooling only these
    bounds the padding by one kernel whatever the stride (2^31 − 1 aborted XLA)."""
    live = tuple(min(o, (n + q - 1) // s + 1) for n, s, q, o in zip(shape[2:], stride, pad, out))
    lone = (max(n + q, k) for n, q, k in zip(shape[2:], pad, kernel))
    return tuple(s if c > 1 else t for s, c, t in zip(stride, live, lone)), live  # type: ignore[return-value]


def _warn_empty_windows(layer: ir.Layer, method: int, shape, out, live) -> None:
    """C3D rounds the pooled size up with no last-window correction, so a window may start
    past the input (kernel 1, stride 2, even width): it reads nothing and C3D outputs
    −FLT_MAX (MAX) or 0 / its size (AVE: NaN where that size is 0). caffe2jax keeps C3D's
    arithmetic and says so once per layer."""
    if tuple(live) == tuple(out):
        return
    what = "-FLT_MAX" if method == P3.MAX else "0 / window size (NaN when that size is 0)"
    warnings.warn(
        f"layer '{layer.name}' (Pooling3D): output {list(out)} of input {list(shape[2:])} has "
        f"windows starting past the input (C3D's rounded-up size); as in C3D they give {what}",
        UserWarning,
        stacklevel=2,
    )


@register("Pooling3D", counts=(1, 1, 1, 1))
def pooling3d(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """Pooling3DLayer: C3D's MAX or AVE pooling over (L, H, W) windows; the windows that read
    no input hold C3D's −FLT_MAX (MAX) or zero sum over their size (AVE)."""
    x = bottoms[0]
    method, kernel, stride, pad, out = pool3d_spec(layer, x.shape)
    live_stride, live = live_windows(x.shape, kernel, stride, pad, out)
    _warn_empty_windows(layer, method, x.shape, out, live)
    padding = _padding(x.shape, kernel, live_stride, pad, live)
    after = [(0, 0), (0, 0), *((0, o - n) for o, n in zip(out, live))]
    if method == P3.MAX:
        y = _crop(max_pool3d(x, kernel, live_stride, tuple(padding)), live)
        return [jnp.pad(y, after, constant_values=-_FLT_MAX)]
    # a NumPy zero stays concrete under jit, so the sum is a differentiable monoid reduction
    # (with jnp's traced zero the compiled train step failed: "Linearization failed")
    total = lax.reduce_window(
        x, np.zeros((), x.dtype), lax.add, (1, 1, *kernel), (1, 1, *live_stride), padding
    )
    divisor = _ave_divisor(x.shape, kernel, stride, pad, out)
    return [jnp.pad(_crop(total, live), after) / jnp.asarray(divisor, x.dtype)]


def _crop(y: jax.Array, out) -> jax.Array:
    return y[(slice(None), slice(None), *(slice(0, o) for o in out))]


def video_data(layer: ir.Layer):
    """C3D's VideoData: clips from frame folders, read by the pipeline; both tops."""
    if len(layer.tops) != 2:
        raise fail(layer, f"C3D's VideoData produces 2 tops (data, label), got {len(layer.tops)}")
    return from_source(layer)


for _form in ("c3d", "c3d-v1.0"):
    register("VideoData", form=_form, counts=(0, 0, 1, 2), source=True, feed="pipeline")(video_data)
