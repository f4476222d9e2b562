"""Region pooling: Faster R-CNN's ROIPooling (rbgirshick/caffe-fast-rcnn roi_pooling_layer)
and R-FCN's PSROIPooling (daijifeng001/caffe-rfcn psroi_pooling_layer.cu).

Bottoms: features (N, C, H, W) and rois (R, 5) rows [batch index, x1, y1, x2, y2] in input
image pixels (a (R, 5, 1, 1) blob too). The batch index is truncated to an int.

* ROIPooling (``roi_pooling_param``): corners ``int(round(x·spatial_scale))`` (C ``round``:
  half away from zero), roi size ``max(x2 − x1 + 1, 1)`` (int), ``bin = float(size) /
  float(pooled)``, bin ``[floor(p·bin), ceil((p+1)·bin))`` shifted by the corner and clipped to
  the map; the max over the bin (the first maximum in row-major order, Caffe's strict ``>``
  from ``-FLT_MAX``), 0 for an empty bin. Top (R, C, pooled_h, pooled_w).
  Backward (the fork's GPU kernel, and its CPU one): a bottom cell gets the top diff of every
  bin whose argmax it is, but only where the cell lies inside the rounded roi
  (``x1 ≤ w ≤ x2``, ``y1 ≤ h ≤ y2``) and the bin lies in the cell's "feasible set"
  ``[floor(h'/bin), ceil((h'+1)/bin))`` (h' = h − y1, float divisions): a bin that reached past
  the roi through float rounding (size 57, 7 bins: the last ends at 57.000004 → 58) or that the
  feasible set misses (22 bins of a size-58 roi) gets no gradient, as in the fork. A
  ``jax.custom_vjp`` because this is not the derivative of the forward (which would also
  share a tie between equal values).
* PSROIPooling (``psroi_pooling_param``): corners ``float(round(x))·scale`` and
  ``float(round(x2) + 1)·scale`` (floats, not re-rounded), size ``max(x2 − x1, 0.1)``,
  ``bin = size / k``, bins ``[floor(p·bin + x1), ceil((p+1)·bin + x1))`` clipped; output
  channel ``c`` of bin (i, j) averages input channel ``(c·k + i)·k + j`` over the bin (0 when
  empty). Top (R, output_dim, k, k), k = ``group_size``. Backward: the average's gradient,
  spread evenly over the bin as the fork's atomic adds do (jax.grad).

Bin boundaries are the forks' float32 expressions evaluated bit for bit, by the integer-based
float32 products and quotients of :mod:`caffe2jax.lowering.exact`: under jit XLA would turn
``size / pooled`` into ``size · (1/pooled)`` and contract ``p·bin + x1`` into one fused
multiply-add, and a boundary one ulp off is a whole row more or less. Exact rational
(integer) arithmetic is not an option either: the forks' float results are not the rational
ones (``7 · (57/7)`` is 57.000004 in float32, so the fork's 7th bin of a 57-cell roi ends at
58).
R-FCN's CUDA build may itself contract ``p·bin + x1`` (nvcc's default ``--fmad``); the
reference here is the source's float32 arithmetic, as written.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.lowering import exact
from caffe2jax.lowering.registry import register
from caffe2jax.lowering.util import fail

#: where roi corners are clipped before the int conversion (C++'s is undefined past INT_MAX)
_LIMIT = float(1 << 24)


def _rois(layer, rois: jax.Array) -> jax.Array:
    """(R, 5) float32 rois from a (R, 5) or (R, 5, 1, 1) bottom."""
    if rois.ndim < 2 or rois.shape[1] != 5 or rois.size != rois.shape[0] * 5:
        raise fail(layer, f"rois must be (R, 5) [batch, x1, y1, x2, y2], got {list(rois.shape)}")
    return lax.stop_gradient(rois.reshape(rois.shape[0], 5)).astype(jnp.float32)


def _to_int(x: jax.Array) -> jax.Array:
    """C's float → int conversion (truncation) of integral float32 values, range-clipped."""
    return jnp.clip(x, -_LIMIT, _LIMIT).astype(jnp.int32)


def _masks(lo: jax.Array, hi: jax.Array, extent: int) -> jax.Array:
    """(R, pooled, extent) masks of the cells in ``[lo, hi)`` per roi and bin."""
    idx = jnp.arange(extent, dtype=jnp.int32)
    return (idx >= lo[..., None]) & (idx < hi[..., None])


@partial(jax.jit, static_argnums=(-2, -1))
def roi_bins(start: jax.Array, end: jax.Array, pooled: int, extent: int):
    """Fast R-CNN's bins along one axis for int corners (R,): clipped ``(lo, hi)`` (R, pooled)
    and the float32 bin size (R,)."""
    size = jnp.maximum(end - start + 1, 1)
    bin_size = exact.div(size.astype(jnp.float32), float(pooled))
    edge = exact.mul(bin_size[:, None], np.arange(pooled + 1, dtype=np.float32))
    lo = _to_int(jnp.floor(edge[:, :-1])) + start[:, None]
    hi = _to_int(jnp.ceil(edge[:, 1:])) + start[:, None]
    return jnp.clip(lo, 0, extent), jnp.clip(hi, 0, extent), bin_size


@partial(jax.jit, static_argnums=(-2, -1))
def roi_feasible(start, end, bin_size, pooled: int, extent: int) -> jax.Array:
    """(R, pooled, extent): whether the fork's backward lets bin ``p`` route a diff to cell
    ``h``: h inside the roi and p in ``[floor((h−start)/bin), ceil((h−start+1)/bin))``."""
    h = jnp.arange(extent, dtype=jnp.int32)[None]
    rel = jnp.maximum(h - start[:, None], 0).astype(jnp.float32)
    first = _to_int(jnp.floor(exact.div(rel, bin_size[:, None])))
    last = _to_int(jnp.ceil(exact.div(rel + 1, bin_size[:, None])))
    inside = (h >= start[:, None]) & (h <= end[:, None])
    p = jnp.arange(pooled, dtype=jnp.int32)[None, :, None]
    first, last = jnp.clip(first, 0, pooled)[:, None], jnp.clip(last, 0, pooled)[:, None]
    return inside[:, None] & (p >= first) & (p < last)


def _pool_one(x, mh, mw):
    """Max of (C, H, W) ``x`` over the (ph, pw) bins of masks mh (ph, H), mw (pw, W), with the
    row and column of the first maximum in row-major order and whether the fork records it
    (a non-empty bin with a value above ``-FLT_MAX``; NaNs are never picked, as ``>`` skips
    them). Empty bins give 0."""
    low = jnp.asarray(-jnp.inf, x.dtype)
    x = jnp.where(jnp.isnan(x), low, x)
    by_w = jnp.where(mw[None, None], x[:, :, None, :], low)  # (C, H, pw, W)
    row_max, row_arg = jnp.max(by_w, -1), jnp.argmax(by_w, -1).astype(jnp.int32)
    by_h = jnp.where(mh[None, :, :, None], row_max[:, None], low)  # (C, ph, H, pw)
    out, arg_h = jnp.max(by_h, 2), jnp.argmax(by_h, 2).astype(jnp.int32)  # (C, ph, pw)
    c, pw = jnp.arange(x.shape[0])[:, None, None], jnp.arange(mw.shape[0])
    arg_w = row_arg[c, arg_h, pw]
    empty = ~(mh.any(1)[:, None] & mw.any(1)[None, :])
    flt_max = jnp.finfo(jnp.float32).max
    found = ~empty[None] & (out > -flt_max)
    out = jnp.where(empty[None], jnp.zeros((), x.dtype), jnp.maximum(out, -flt_max))
    return out, arg_h, arg_w, found


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _roi_max_pool(shape, x, batch, mh, mw, ok_h, ok_w):
    return _roi_max_pool_fwd(shape, x, batch, mh, mw, ok_h, ok_w)[0]


def _roi_max_pool_fwd(shape, x, batch, mh, mw, ok_h, ok_w):
    def one(args):
        b, h, w = args
        return _pool_one(lax.dynamic_index_in_dim(x, b, 0, keepdims=False), h, w)

    out, arg_h, arg_w, found = lax.map(one, (batch, mh, mw))
    return out, (batch, arg_h, arg_w, found, mh, mw, ok_h, ok_w)


def _roi_max_pool_bwd(shape, res, g):
    """The fork's ROIPoolBackward: each bin's diff to its argmax cell where the fork's
    feasibility test lets it through (module docstring), summed over bins and rois."""
    batch, arg_h, arg_w, found, mh, mw, ok_h, ok_w = res
    n, c, height, width = shape
    rois, _, ph, pw = g.shape
    r = jnp.arange(rois)[:, None, None, None]
    routed = found & ok_h[r, jnp.arange(ph)[:, None], arg_h] & ok_w[r, jnp.arange(pw), arg_w]
    channel = jnp.arange(c)[None, :, None, None]
    flat = ((batch[:, None, None, None] * c + channel) * height + arg_h) * width + arg_w
    dx = (
        jnp.zeros(n * c * height * width, g.dtype)
        .at[flat.ravel()]
        .add(jnp.where(routed, g, 0).ravel())
    )
    zeros = [np.zeros(a.shape, jax.dtypes.float0) for a in (batch, mh, mw, ok_h, ok_w)]
    return (dx.reshape(shape), *zeros)


_roi_max_pool.defvjp(_roi_max_pool_fwd, _roi_max_pool_bwd)


@register("ROIPooling", counts=(2, 2, 1, 1), no_force_backward=(1,))
def roi_pooling(layer, params, bottoms, ctx):
    """Faster R-CNN's ROIPoolingLayer: max per bin, argmax routing back (module docstring)."""
    p = layer.param.roi_pooling_param
    if p.pooled_h <= 0 or p.pooled_w <= 0:
        raise fail(layer, "pooled_h and pooled_w must be > 0")
    x, rois = bottoms
    rois = _rois(layer, rois)
    _, _, height, width = x.shape
    batch = rois[:, 0].astype(jnp.int32)
    corner = _to_int(exact.c_round(exact.mul(rois[:, 1:], p.spatial_scale)))
    x1, y1, x2, y2 = (corner[:, i] for i in range(4))
    h_lo, h_hi, bin_h = roi_bins(y1, y2, p.pooled_h, height)
    w_lo, w_hi, bin_w = roi_bins(x1, x2, p.pooled_w, width)
    ok_h = roi_feasible(y1, y2, bin_h, p.pooled_h, height)
    ok_w = roi_feasible(x1, x2, bin_w, p.pooled_w, width)
    masks = _masks(h_lo, h_hi, height), _masks(w_lo, w_hi, width)
    return [_roi_max_pool(tuple(x.shape), x, batch, *masks, ok_h, ok_w)]


@partial(jax.jit, static_argnums=(-2, -1))
def psroi_bins(start: jax.Array, end: jax.Array, k: int, extent: int):
    """R-FCN's bins along one axis for float32 corners (R,): clipped int ``(lo, hi)`` (R, k)."""
    bin_size = exact.div(jnp.maximum(end - start, np.float32(0.1)), float(k))
    edge = exact.mul(bin_size[:, None], np.arange(k + 1, dtype=np.float32)) + start[:, None]
    lo, hi = _to_int(jnp.floor(edge[:, :-1])), _to_int(jnp.ceil(edge[:, 1:]))
    return jnp.clip(lo, 0, extent), jnp.clip(hi, 0, extent)


@register("PSROIPooling", counts=(2, 2, 1, 1), no_force_backward=(1,))
def psroi_pooling(layer, params, bottoms, ctx):
    """R-FCN's PSROIPoolingLayer forward (position-sensitive average per bin)."""
    p = layer.param.psroi_pooling_param
    k, dim = p.group_size, p.output_dim
    x, rois = bottoms
    if k <= 0 or dim <= 0:
        raise fail(layer, "group_size and output_dim must be > 0")
    if x.shape[1] != dim * k * k:
        raise fail(layer, f"input channels ({x.shape[1]}) must equal output_dim·group_size² "
                          f"({dim}·{k}²)")  # fmt: skip
    rois = _rois(layer, rois)
    _, _, height, width = x.shape
    groups = x.reshape(x.shape[0], dim, k, k, height, width)
    r = exact.c_round(rois[:, 1:])
    start = exact.mul(r[:, :2], p.spatial_scale)
    end = exact.mul(r[:, 2:] + 1, p.spatial_scale)
    mh = _masks(*psroi_bins(start[:, 1], end[:, 1], k, height), height).astype(x.dtype)
    mw = _masks(*psroi_bins(start[:, 0], end[:, 0], k, width), width).astype(x.dtype)

    def one(args):
        b, h, w = args
        g = lax.dynamic_index_in_dim(groups, b, 0, keepdims=False)
        total = jnp.einsum("ih,jw,cijhw->cij", h, w, g)
        area = h.sum(1)[:, None] * w.sum(1)[None, :]
        return jnp.where(area > 0, total / jnp.where(area > 0, area, 1), 0)

    return [lax.map(one, (rois[:, 0].astype(jnp.int32), mh, mw))]
