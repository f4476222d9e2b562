"""Region pooling: Faster R-CNN's ROIPooling (rbgirshick/caffe-fast-rcnn roi_pooling_layer)
and R-FCN's PSROIPooling (Microsoft/caffe psroi_pooling_layer.cu).

Bottoms: features (N, C, H, W) and rois (R, 5) rows [batch index, x1, y1, x2, y2] in input
image pixels (a (R, 5, 1, 1) blob too). The batch index is truncated to an int.

* ROIPooling (``roi_pooling_param``): corners ``round(x·spatial_scale)`` (C ``round``: half
  away from zero), roi size ``max(x2 − x1 + 1, 1)``, bins of ``size / pooled`` (float),
  bin ``[floor(p·bin), ceil((p+1)·bin))`` shifted by the corner and clipped to the map; the
  max over the bin, 0 for an empty bin. Top (R, C, pooled_h, pooled_w). The fork's backward
  routes each top diff to its bin's argmax (summed over rois): the gradient of the max
  (jax.grad; equal values in one bin would share it, where the fork picks the first).
* PSROIPooling (``psroi_pooling_param``): corners ``round(x)·scale`` and
  ``(round(x2) + 1)·scale`` (not re-rounded), size ``max(x2 − x1, 0.1)``, bins
  ``[floor(p·bin + start), ceil((p+1)·bin + start))`` clipped; output channel ``c`` of bin
  (i, j) averages input channel ``(c·k + i)·k + j`` over the bin (0 when empty). Top
  (R, output_dim, k, k), k = ``group_size``. Backward: the average's gradient, spread evenly
  over the bin as the fork's atomic adds do (jax.grad).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.lowering.registry import register
from caffe2jax.lowering.util import fail


def round_half_away(x: jax.Array) -> jax.Array:
    """C's round(): halves away from zero (jnp.round rounds halves to even)."""
    return jnp.sign(x) * jnp.floor(jnp.abs(x) + 0.5)


def _rois(layer, rois: jax.Array) -> jax.Array:
    """(R, 5) rois from a (R, 5) or (R, 5, 1, 1) bottom."""
    if rois.ndim < 2 or rois.shape[1] != 5 or rois.size != rois.shape[0] * 5:
        raise fail(layer, f"rois must be (R, 5) [batch, x1, y1, x2, y2], got {list(rois.shape)}")
    return lax.stop_gradient(rois.reshape(rois.shape[0], 5))


def _bin_masks(start, size, pooled: int, extent: int, offset) -> jax.Array:
    """(pooled, extent) masks of bins ``[floor(p·size/pooled + offset), ceil(...))`` clipped
    to ``[0, extent)``; ``start`` is added after flooring (ROIPooling) via ``offset``."""
    p = jnp.arange(pooled, dtype=size.dtype)
    bin_size = size / pooled
    lo = jnp.clip(jnp.floor(p * bin_size + offset) + start, 0, extent)
    hi = jnp.clip(jnp.ceil((p + 1) * bin_size + offset) + start, 0, extent)
    idx = jnp.arange(extent, dtype=size.dtype)
    return (idx[None] >= lo[:, None]) & (idx[None] < hi[:, None])


def _roi_max(x, mh, mw):
    """Max of (C, H, W) ``x`` over each (ph, pw) bin of masks mh (ph, H), mw (pw, W); 0 when
    a bin is empty."""
    neg = jnp.asarray(-jnp.inf, x.dtype)
    by_w = jnp.max(jnp.where(mw[None, None], x[:, :, None, :], neg), axis=-1)  # (C, H, pw)
    out = jnp.max(jnp.where(mh[None, :, :, None], by_w[:, None], neg), axis=2)  # (C, ph, pw)
    empty = ~(mh.any(1)[:, None] & mw.any(1)[None, :])
    return jnp.where(empty[None], jnp.zeros((), x.dtype), out)


@register("ROIPooling", counts=(2, 2, 1, 1), no_force_backward=(1,))
def roi_pooling(layer, params, bottoms, ctx):
    """Faster R-CNN's ROIPoolingLayer forward (max per bin; see the module docstring)."""
    p = layer.param.roi_pooling_param
    if p.pooled_h <= 0 or p.pooled_w <= 0:
        raise fail(layer, "pooled_h and pooled_w must be > 0")
    x, rois = bottoms
    rois = _rois(layer, rois)
    _, _, height, width = x.shape
    scale = jnp.asarray(p.spatial_scale, x.dtype)

    def one(roi):
        b = roi[0].astype(jnp.int32)
        x1, y1, x2, y2 = (round_half_away(roi[i].astype(x.dtype) * scale) for i in (1, 2, 3, 4))
        rh = jnp.maximum(y2 - y1 + 1, 1)
        rw = jnp.maximum(x2 - x1 + 1, 1)
        mh = _bin_masks(y1, rh, p.pooled_h, height, 0.0)
        mw = _bin_masks(x1, rw, p.pooled_w, width, 0.0)
        return _roi_max(lax.dynamic_index_in_dim(x, b, 0, keepdims=False), mh, mw)

    return [lax.map(one, rois)]


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
    scale = jnp.asarray(p.spatial_scale, x.dtype)

    def one(roi):
        b = roi[0].astype(jnp.int32)
        r = round_half_away(roi[1:].astype(x.dtype))
        x1, y1 = r[0] * scale, r[1] * scale
        x2, y2 = (r[2] + 1) * scale, (r[3] + 1) * scale
        rw, rh = jnp.maximum(x2 - x1, 0.1), jnp.maximum(y2 - y1, 0.1)
        mh = _bin_masks(0.0, rh, k, height, y1).astype(x.dtype)
        mw = _bin_masks(0.0, rw, k, width, x1).astype(x.dtype)
        g = lax.dynamic_index_in_dim(groups, b, 0, keepdims=False)
        total = jnp.einsum("ih,jw,cijhw->cij", mh, mw, g)
        area = mh.sum(1)[:, None] * mw.sum(1)[None, :]
        return jnp.where(area > 0, total / jnp.where(area > 0, area, 1), 0)

    return [lax.map(one, rois)]
