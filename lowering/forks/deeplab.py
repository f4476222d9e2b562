"""The forks' resampling layers: Upsample (both forms) and Interp (PSPNet / DeepLab v2 / v1).

* Upsample ``max_unpool`` (SegNet, ENet: upsample_layer.cpp): bottoms ``[x, mask]``, the mask
  being the second top of a MAX Pooling layer (the flat index ``h·W + w`` into the pooling
  input's plane, as a float). Top (N, C, upsample_h, upsample_w), or
  ``(h·scale_h − pad_out_h, w·scale_w − pad_out_w)``; zeros, then ``top.flat[int(mask[i])] =
  x[i]`` for i ascending (a later i wins a shared index). Caffe stops with a fatal error on an
  index outside the top; a compiled program cannot, so such a plane comes out all NaN.
* Upsample ``nearest`` (the YOLO ports): ``top[h, w] = x[h div s, w div s]``.
* Interp: the top size by the fork's rules (:func:`interp_size`), then align-corners bilinear
  sampling of the window ``[−pad_beg, H + pad_end)`` with the fork's float32 source
  coordinates (util/interp.cpp): ``r = (H_eff − 1)/(H_out − 1)`` (0 when H_out is 1), source
  ``r·i``, ``i0 = trunc``, ``i1 = i0 + 1`` unless at the last row, ``λ = r·i − i0``; the same
  size copies the window. Its backward scatters with the same weights, the true gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import ir
from caffe2jax.lowering.registry import Context, register
from caffe2jax.lowering.util import fail

Arrays = Sequence[jax.Array]


# -- Upsample ---------------------------------------------------------------------------------


def unpool_size(layer: ir.Layer, hw: tuple[int, int]) -> tuple[int, int]:
    """UpsampleLayer::LayerSetUp/Reshape of SegNet: the top's (height, width)."""
    p = layer.param.upsample_param
    if p.HasField("upsample_h") or p.HasField("upsample_w"):
        if not (p.HasField("upsample_h") and p.HasField("upsample_w")):
            raise fail(layer, "give both upsample_h and upsample_w")
        if p.upsample_h <= 1 or p.upsample_w <= 1:
            raise fail(layer, "upsample_h and upsample_w must be greater than 1")
        return p.upsample_h, p.upsample_w
    if p.HasField("scale_h") != p.HasField("scale_w") or (p.HasField("scale_h") and
                                                          p.HasField("scale")):  # fmt: skip
        raise fail(layer, "give scale, OR both scale_h and scale_w, OR upsample_h and upsample_w")
    sh, sw = (p.scale_h, p.scale_w) if p.HasField("scale_h") else (p.scale, p.scale)
    if sh <= 1 or sw <= 1:
        raise fail(layer, f"upsample scale must be greater than 1, got {sh}x{sw}")
    if (p.pad_out_h and sh != 2) or (p.pad_out_w and sw != 2):
        raise fail(layer, "pad_out_h/pad_out_w need a scale of 2")
    return hw[0] * sh - int(p.pad_out_h), hw[1] * sw - int(p.pad_out_w)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _unpool(x: jax.Array, index: jax.Array, size: int) -> jax.Array:
    return _unpool_forward(x, index, size)


def _unpool_forward(x: jax.Array, index: jax.Array, size: int) -> jax.Array:
    """Planes (M, K) of x scattered to (M, size) at ``index`` (int, last writer wins)."""
    m, k = x.shape
    rows = jnp.arange(m)[:, None]
    order = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (m, k))
    bad = jnp.any((index < 0) | (index >= size), axis=1, keepdims=True)
    safe = jnp.clip(index, 0, size - 1)
    winner = jnp.full((m, size), -1, jnp.int32).at[rows, safe].max(order)
    taken = jnp.take_along_axis(x, jnp.maximum(winner, 0), axis=1)
    out = jnp.where(winner >= 0, taken, jnp.zeros_like(taken))
    return jnp.where(bad, jnp.asarray(jnp.nan, x.dtype), out)


def _unpool_fwd(x, index, size):
    return _unpool_forward(x, index, size), index


def _unpool_bwd(size, index, dy):
    # custom_vjp because SegNet's Backward_cpu gathers ``bottom_diff[i] = top_diff[mask[i]]``
    # for every i: where two inputs share an index (overlapping pooling windows) both get the
    # diff, although only the last one reached the top (the true gradient gives it to one).
    dx = jnp.take_along_axis(dy, jnp.clip(index, 0, size - 1), axis=1)
    return dx, None


_unpool.defvjp(_unpool_fwd, _unpool_bwd)


def _nearest(layer: ir.Layer, x: jax.Array, axes: tuple[int, int]) -> jax.Array:
    scale = layer.param.upsample_param.scale
    if scale < 1:
        raise fail(layer, f"upsample_param.scale must be at least 1, got {scale}")
    return jnp.repeat(jnp.repeat(x, scale, axis=axes[0]), scale, axis=axes[1])


@register("Upsample", counts=(1, 2, 1, 1))
def upsample(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """The fork Upsample of ``layer.form``: SegNet's max-unpooling or the YOLO ports' nearest
    (module docstring)."""
    if layer.form != "max_unpool":
        (x,) = bottoms
        if x.ndim != 4:
            raise fail(layer, f"Upsample takes a 4-D bottom, got {tuple(x.shape)}")
        return [_nearest(layer, x, (2, 3))]
    x, mask = bottoms
    if x.ndim != 4 or x.shape != mask.shape:
        raise fail(
            layer,
            f"the values {tuple(x.shape)} and the mask {tuple(mask.shape)} must be 4-D blobs "
            "of one shape",
        )
    n, c, h, w = x.shape
    oh, ow = unpool_size(layer, (h, w))
    index = jax.lax.stop_gradient(mask).astype(jnp.int32).reshape(n * c, h * w)
    y = _unpool(x.reshape(n * c, h * w), index, oh * ow)
    return [y.reshape(n, c, oh, ow)]


def _nearest_only(layer: ir.Layer, shapes) -> bool:
    return layer.form != "max_unpool"


@upsample.nhwc(when=_nearest_only)
def _(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    return [_nearest(layer, bottoms[0], (1, 2))]


# -- Interp -----------------------------------------------------------------------------------


def interp_size(layer: ir.Layer, hw: tuple[int, int]) -> tuple[int, int]:
    """InterpLayer::Reshape: the top's (height, width) from the cropped input size."""
    p = layer.param.interp_param
    if p.pad_beg > 0 or p.pad_end > 0:
        raise fail(layer, "Interp supports only pad_beg, pad_end <= 0 (cropping)")
    eff = tuple(n + p.pad_beg + p.pad_end for n in hw)
    if min(eff) <= 0:
        raise fail(layer, f"pad_beg/pad_end crop the whole input {list(hw)}")
    shrink, zoom = p.HasField("shrink_factor"), p.HasField("zoom_factor")
    sized = p.HasField("height") and p.HasField("width")
    if layer.form == "deeplab-v1" and shrink + zoom + sized != 1:
        raise fail(layer, "DeepLab v1's Interp takes exactly one of zoom_factor, "
                          "shrink_factor, or height and width")  # fmt: skip
    if (shrink and p.shrink_factor < 1) or (zoom and p.zoom_factor < 1):
        raise fail(layer, "shrink_factor and zoom_factor must be positive")
    if shrink and not zoom:
        return tuple((n - 1) // p.shrink_factor + 1 for n in eff)  # type: ignore[return-value]
    if zoom and not shrink:
        return tuple(n + (n - 1) * (p.zoom_factor - 1) for n in eff)  # type: ignore[return-value]
    if sized:
        if p.height <= 0 or p.width <= 0:
            raise fail(layer, f"Interp height and width must be positive, got {p.height}x{p.width}")
        return p.height, p.width
    if shrink and zoom:
        out = ((n - 1) // p.shrink_factor + 1 for n in eff)
        return tuple(n + (n - 1) * (p.zoom_factor - 1) for n in out)  # type: ignore[return-value]
    raise fail(layer, "Interp needs shrink_factor, zoom_factor, or height and width")


def interp_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) weights of util/interp.cpp's align-corners sampling, float32 as the fork
    computes its source coordinates."""
    a = np.zeros((n_out, n_in), np.float32)
    if n_in == n_out:
        np.fill_diagonal(a, 1)
        return a
    ratio = np.float32(n_in - 1) / np.float32(n_out - 1) if n_out > 1 else np.float32(0)
    for i in range(n_out):
        src = np.float32(ratio * np.float32(i))
        i0 = int(src)
        i1 = i0 + 1 if i0 < n_in - 1 else i0
        lam = np.float32(src - np.float32(i0))
        a[i, i0] += np.float32(1) - lam
        a[i, i1] += lam
    return a


def _interp(layer: ir.Layer, x: jax.Array, nhwc: bool) -> jax.Array:
    h_axis = 1 if nhwc else 2
    hw = (x.shape[h_axis], x.shape[h_axis + 1])
    oh, ow = interp_size(layer, hw)
    p = layer.param.interp_param
    start = -p.pad_beg
    crop = tuple(slice(start, n + p.pad_end) for n in hw)
    x = x[:, crop[0], crop[1]] if nhwc else x[:, :, crop[0], crop[1]]
    eff = (x.shape[h_axis], x.shape[h_axis + 1])
    if eff == (oh, ow):
        return x
    ah = jnp.asarray(interp_matrix(eff[0], oh), x.dtype)
    aw = jnp.asarray(interp_matrix(eff[1], ow), x.dtype)
    spec = "ih,jw,nhwc->nijc" if nhwc else "ih,jw,nchw->ncij"
    return jnp.einsum(spec, ah, aw, x, precision=jax.lax.Precision.HIGHEST)


@register("Interp", counts=(1, 1, 1, 1))
def interp(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """InterpLayer (PSPNet, DeepLab v2; DeepLab v1's INTERP in form ``deeplab-v1``)."""
    (x,) = bottoms
    if x.ndim != 4:
        raise fail(layer, f"Interp takes a 4-D bottom, got {tuple(x.shape)}")
    return [_interp(layer, x, nhwc=False)]


@interp.nhwc
def _(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    return [_interp(layer, bottoms[0], nhwc=True)]
