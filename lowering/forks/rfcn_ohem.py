"""R-FCN's online hard example mining layers (Microsoft/caffe@1a2be8e, the commit py-R-FCN
requires), as their GPU code computes them (the CPU paths are NOT_IMPLEMENTED in the fork).

**SoftmaxWithLossOHEM** (softmax_loss_ohem_layer.cu): BVLC's SoftmaxWithLoss plus a third top, each
position's loss ``−log(max(p_label, FLT_MIN))`` (0 where ``ignore_label``), unnormalised, shaped
like the labels. A negative label without ``ignore_label`` (the fork reads memory before the row:
undefined) gives loss 0 and is not counted: it marks the padding rows of the built-in py-R-FCN
proposal target layer (lowering/forks/rfcn.py), which R-FCN's train net feeds to this layer without
an ``ignore_label``. A label ≥ the class count gives NaN. Normaliser: FULL outer·inner; VALID the
counted positions (without ``ignore_label``: those of label ≥ 0); BATCH_SIZE outer; NONE 1; at
least 1; legacy ``normalize`` maps to VALID / BATCH_SIZE. PRE_FIXED is a LOG(FATAL) in this layer.
The backward reads the loss top's diff only: the prob and per-instance tops carry no gradient.

**SmoothL1LossOHEM** (smooth_L1_loss_ohem_layer.cu): bottoms pred, target and optional weights
w, all with the same (legacy 4-D) channels, height and width. d = w·(pred − target);
f(d) = 0.5·d² if |d| < 1 else |d| − 0.5 (σ = 1, no ``smooth_l1_loss_param``); loss = Σ f(d) /
normaliser with FULL and VALID = num·height·width (channels not counted), BATCH_SIZE = num,
PRE_FIXED = ``loss_param.pre_fixed_normalizer``, NONE = 1, at least 1. The optional second top
is each instance's Σ_c f(d), shape (num, 1, height, width), no gradient. The backward gives
pred ± f'(d)·diff/normaliser and target the negative — **without the factor w** the chain rule
puts there (and nothing to w): for R-FCN's 0/1 weights that is the true gradient, for others it
is not, so a custom_vjp reproduces the fork.

**BoxAnnotatorOHEM** (box_annotator_ohem_layer.cu): bottoms rois (num, 5, H, W), per-roi loss
(num, 1, H, W), labels (num, 1, H, W), bbox loss weights (num, K, H, W). Each image (a roi's
batch index, rois[:, 0] truncated) keeps its ``roi_per_img`` rois of highest loss: their labels
and weights pass through; every other roi gets ``ignore_label`` and weights 0. Tops
(num, 1, H, W) and (num, K, H, W). The fork sorts with std::sort (not stable): among equal
losses it keeps an unspecified one; here the lower index wins. No backward. A negative batch
index (undefined behaviour in the fork) makes the labels NaN.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.layers.loss import LOG_FLT_MIN
from caffe2jax.lowering.registry import register
from caffe2jax.lowering.util import canonical_axis, count, fail

_MODE = caffe_pb2.LossParameter


def _mode(layer: ir.Layer) -> int:
    """``normalization``, or the legacy ``normalize`` when only that is set (both OHEM losses
    read it so)."""
    lp = layer.param.loss_param
    if not lp.HasField("normalization") and lp.HasField("normalize"):
        return _MODE.VALID if lp.normalize else _MODE.BATCH_SIZE
    return lp.normalization


def _legacy(layer: ir.Layer, shape: tuple[int, ...], name: str) -> tuple[int, int, int, int]:
    """Blob::num/channels/height/width (LegacyShape: at most 4 axes, missing ones are 1)."""
    if len(shape) > 4:
        raise fail(layer, f"'{name}' {list(shape)} has more than 4 axes (the layer reads it "
                          "as num, channels, height, width)")  # fmt: skip
    return tuple(shape[i] if i < len(shape) else 1 for i in range(4))


# -- SoftmaxWithLossOHEM ------------------------------------------------------------------


@register("SoftmaxWithLossOHEM", counts=(2, 2, 1, 3), no_force_backward=(1,))
def softmax_with_loss_ohem(layer, params, bottoms, ctx):
    """R-FCN's SoftmaxWithLossOHEM: (loss[, prob[, per-instance loss]])."""
    x, label = bottoms
    mode = _mode(layer)
    if mode not in (_MODE.FULL, _MODE.VALID, _MODE.BATCH_SIZE, _MODE.NONE):
        raise fail(layer, "normalization must be FULL, VALID, BATCH_SIZE or NONE (the fork's "
                          "SoftmaxWithLossOHEM has no PRE_FIXED)")  # fmt: skip
    axis = canonical_axis(layer, layer.param.softmax_param.axis, x.ndim)
    outer, classes, inner = count(x.shape, 0, axis), x.shape[axis], count(x.shape, axis + 1)
    if label.ndim == 0 or x.shape[0] != label.shape[0] or label.size != outer * inner:
        raise fail(layer, f"labels {list(label.shape)} need the scores' first dimension and one "
                          f"label per position outside axis {axis} of {list(x.shape)}")  # fmt: skip
    z = x.reshape(outer, classes, inner)
    lab = lax.stop_gradient(label).reshape(outer, inner).astype(jnp.int32)
    picked = jnp.take_along_axis(
        jax.nn.log_softmax(z, axis=1), jnp.clip(lab, 0, classes - 1)[:, None], axis=1
    )[:, 0]
    # value −log(max(p, FLT_MIN)); gradient p − onehot (the fork's backward ignores the clamp)
    nll = -picked - lax.stop_gradient(jnp.maximum(picked, LOG_FLT_MIN) - picked)
    lp = layer.param.loss_param
    counted = lab != lp.ignore_label if lp.HasField("ignore_label") else lab >= 0
    in_range = (lab >= 0) & (lab < classes)
    per = jnp.where(counted, jnp.where(in_range, nll, jnp.nan), 0)
    n = {_MODE.FULL: outer * inner, _MODE.VALID: jnp.sum(counted), _MODE.BATCH_SIZE: outer,
         _MODE.NONE: 1}[mode]  # fmt: skip
    tops = [jnp.sum(per) / jnp.maximum(jnp.asarray(n, x.dtype), 1)]
    if len(layer.tops) > 1:
        tops.append(lax.stop_gradient(jax.nn.softmax(x, axis=axis)))
    if len(layer.tops) > 2:
        tops.append(lax.stop_gradient(per).reshape(label.shape))
    return tops


# -- SmoothL1LossOHEM ---------------------------------------------------------------------


def _smooth_l1(d: jax.Array) -> jax.Array:
    a = jnp.abs(d)
    return jnp.where(a < 1, 0.5 * d * d, a - 0.5)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _ohem_l1_sum(pred, target, weights, norm: float):
    """Σ f(w·(pred − target)) / norm, with the fork's backward (no factor w, nothing to w)."""
    return jnp.sum(_smooth_l1(weights * (pred - target))) / norm


def _ohem_l1_fwd(pred, target, weights, norm):
    d = weights * (pred - target)
    return jnp.sum(_smooth_l1(d)) / norm, (d, weights)


def _ohem_l1_bwd(norm, res, g):
    d, weights = res
    slope = jnp.where(jnp.abs(d) < 1, d, jnp.sign(d)) * (g / norm)
    return slope, -slope, jnp.zeros_like(weights)


_ohem_l1_sum.defvjp(_ohem_l1_fwd, _ohem_l1_bwd)


def _l1_normalizer(layer: ir.Layer, num: int, spatial: int) -> float:
    mode, lp = _mode(layer), layer.param.loss_param
    n = {_MODE.FULL: num * spatial, _MODE.VALID: num * spatial, _MODE.BATCH_SIZE: num,
         _MODE.PRE_FIXED: lp.pre_fixed_normalizer, _MODE.NONE: 1}.get(mode)  # fmt: skip
    if n is None:
        raise fail(layer, f"unknown normalization mode {mode}")
    return float(max(1.0, n))


@register("SmoothL1LossOHEM", counts=(2, 3, 1, 2))
def smooth_l1_loss_ohem(layer, params, bottoms, ctx):
    """R-FCN's SmoothL1LossOHEM: (loss[, per-instance loss (num, 1, H, W)])."""
    dims = [_legacy(layer, b.shape, n) for b, n in zip(bottoms, layer.bottom_names)]
    for b, name in zip(dims[1:], layer.bottom_names[1:]):
        if b != dims[0]:
            raise fail(layer, f"'{name}' {list(b)} must have the shape (num, channels, height, "
                              f"width) of '{layer.bottom_names[0]}' {list(dims[0])}")  # fmt: skip
    num, channels, height, width = dims[0]
    pred = bottoms[0].reshape(dims[0])
    target = bottoms[1].reshape(dims[0])
    weights = bottoms[2].reshape(dims[0]) if len(bottoms) > 2 else jnp.ones_like(pred)
    norm = _l1_normalizer(layer, num, height * width)
    tops = [_ohem_l1_sum(pred, target, weights, norm)]
    if len(layer.tops) > 1:
        errors = _smooth_l1(weights * (pred - target))
        tops.append(lax.stop_gradient(jnp.sum(errors, axis=1, keepdims=True)))
    return tops


# -- BoxAnnotatorOHEM ---------------------------------------------------------------------


def ohem_keep(image: jax.Array, loss: jax.Array, per_image: int) -> jax.Array:
    """True for the ``per_image`` highest-loss entries of each image (ties: lower index)."""
    by_loss = jnp.argsort(-loss, stable=True)
    by_image = jnp.argsort(image[by_loss], stable=True)  # images grouped, losses descending
    order = by_loss[by_image]
    grouped = image[order]
    rank = jnp.arange(image.size) - jnp.searchsorted(grouped, grouped, side="left")
    return jnp.zeros(image.shape, bool).at[order].set(rank < per_image)


@register("BoxAnnotatorOHEM", counts=(4, 4, 2, 2))
def box_annotator_ohem(layer, params, bottoms, ctx):
    """R-FCN's BoxAnnotatorOHEM: (labels, bbox loss weights) of each image's hardest rois."""
    p = layer.param.box_annotator_ohem_param
    if p.roi_per_img <= 0:
        raise fail(layer, "roi_per_img must be positive")
    rois, loss, labels, weights = (lax.stop_gradient(b) for b in bottoms)
    dims = [_legacy(layer, b.shape, n) for b, n in zip(bottoms, layer.bottom_names)]
    num, _, height, width = dims[0]
    want = [(num, 5, height, width), (num, 1, height, width), (num, 1, height, width),
            (num, dims[3][1], height, width)]  # fmt: skip
    if dims[0][1] != 5 or dims != want:
        raise fail(layer, f"needs rois (num, 5, H, W), loss and labels (num, 1, H, W) and "
                          f"weights (num, K, H, W); got {[list(d) for d in dims]}")  # fmt: skip
    image = rois.reshape(num, 5, height * width)[:, 0].astype(jnp.int32).ravel()
    keep = ohem_keep(image, loss.reshape(-1), p.roi_per_img)
    top_labels = jnp.where(keep, labels.reshape(-1), p.ignore_label).astype(labels.dtype)
    top_labels = jnp.where(jnp.any(image < 0), jnp.nan, top_labels)
    mask = keep.reshape(num, 1, height * width)
    top_weights = jnp.where(mask, weights.reshape(num, -1, height * width), 0)
    return [top_labels.reshape(num, 1, height, width), top_weights.reshape(dims[3])]
