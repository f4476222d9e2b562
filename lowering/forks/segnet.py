"""SegNet's layers (alexgkendall/caffe-segnet; ENet's Caffe, TimoSaemann/caffe-enet, has them
too): BN and Upsample in their SegNet forms, SoftmaxWithLoss with class weighting, Dropout that
samples at TEST, and DenseImageData.

* BN (form ``segnet``, bn_layer.cpp): blobs ``[scale, shift]`` of shape (1, C, 1, 1), no
  running statistics. ``bn_mode: LEARN`` normalises with the batch statistics in every phase
  (TEST included): ``μ = E[x]``, ``σ² = E[x²] − μ²`` over (N, H, W), ``y = scale·(x − μ)/√(σ² +
  1e-9) + shift`` (eps hard-coded); optional tops 1 and 2 are μ and σ² (before eps), shaped
  (1, C, 1, 1). ``bn_mode: INFERENCE``: ``y = scale·x + shift`` (the statistics are folded into
  the blobs by SegNet's compute_bn_statistics.py). The gradient is JAX's derivative, the fork's.
* Upsample (form ``max_unpool``, upsample_layer.cpp): bottoms ``[x, mask]``, the mask being the
  second top of a MAX Pooling layer (the flat index ``h·W + w`` into the pooling input's plane,
  as a float). Top (N, C, upsample_h, upsample_w), or ``(h·scale_h − pad_out_h, w·scale_w −
  pad_out_w)``; zeros, then ``top.flat[int(mask[i])] = x[i]`` for i ascending (a later i wins a
  shared index). Caffe stops with a fatal error on an index outside the top; a compiled program
  cannot, so such a plane comes out all NaN.
* SoftmaxWithLoss (form ``segnet``: ``weight_by_label_freqs`` or ``class_weighting`` set), as
  softmax_loss_layer.cpp computes it: each counted pixel's ``−log(max(p_label, FLT_MIN))`` is
  multiplied by ``class_weighting[label]`` when ``weight_by_label_freqs`` is true (one weight
  per class, checked); ``ignore_label`` pixels do not count. The sum is divided by the number
  of counted pixels when ``normalize`` (SegNet's default: **true**), else by the batch size:
  the plain count, not the sum of the weights (softmax_loss_layer.cpp and .cu of
  caffe-segnet@344c113: ``++count`` / ``counts[i] = 1`` per non-ignored pixel), not clamped (a
  batch with every pixel ignored gives 0/0, as in the fork). The backward,
  ``class_weighting[label]·(p − onehot)`` over the same divisor, is the true gradient (the
  clamp aside, which Caffe's backward ignores too). With ``weight_by_label_freqs: false`` this
  equals BVLC's layer with ``normalize``; ``normalization`` (BVLC's enum, which the fork's
  proto does not have) is refused. A non-ignored label outside [0, classes) makes the loss NaN.
* Dropout (form ``sample_test``: ``sample_weights_test`` set): with ``sample_weights_test:
  true`` it drops in TEST as in TRAIN (Bayesian SegNet's sampling).
* DenseImageData (``dense_image_data_param``): images and label maps listed in ``source``, read
  by the runtime's pipeline (caffe2jax.runtime.data.dense_image_data).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.layers import loss, neuron
from caffe2jax.lowering.layers.data import from_source
from caffe2jax.lowering.layers.loss import LOG_FLT_MIN
from caffe2jax.lowering.registry import Context, ParamDecl, Shape, register
from caffe2jax.lowering.util import CHANNEL_AXES, canonical_axis, count, fail

Arrays = Sequence[jax.Array]
SEGNET_EPS = 1e-9  # caffe-segnet bn_layer.cpp: var_eps_, not a parameter
LEARN = caffe_pb2.BNParameter.LEARN


# -- BN -----------------------------------------------------------------------------------------


def _bn_channels(layer: ir.Layer, shape: Shape) -> int:
    if len(shape) != 4:
        raise fail(layer, f"BN takes a 4-D bottom (num, channels, height, width), got {shape}")
    return shape[1]


@register("BN", form="segnet", counts=(1, 1, 1, 3), stateful=True)
def segnet_bn(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context):
    """SegNet's BN layer (module docstring); no state to update."""
    return _segnet(layer, params, bottoms[0], nhwc=False), []


@segnet_bn.nhwc(when=lambda layer, shapes: len(layer.tops) == 1)
def _(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context):
    """The same on a channels-last (N, H, W, C) bottom (lowering/layout.py)."""
    return _segnet(layer, params, bottoms[0], nhwc=True), []


def _segnet(layer: ir.Layer, params: Arrays, x: jax.Array, nhwc: bool) -> list[jax.Array]:
    axes, column = CHANNEL_AXES[nhwc]
    scale, shift = (p.reshape(column) for p in params)
    if layer.param.bn_param.bn_mode != LEARN:
        if len(layer.tops) != 1:
            raise fail(layer, "bn_mode INFERENCE has one top (no batch statistics)")
        return [scale * x + shift]
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x), axis=axes, keepdims=True) - jnp.square(mean)
    y = scale * (x - mean) / jnp.sqrt(var + SEGNET_EPS) + shift
    return [y, mean, var][: len(layer.tops)]


@segnet_bn.param_shapes
def _(layer: ir.Layer, bottom_shapes: Sequence[Shape]) -> list[ParamDecl]:
    """scale (scale_filler), shift (shift_filler)."""
    shape = (1, _bn_channels(layer, tuple(bottom_shapes[0])), 1, 1)
    p = layer.param.bn_param
    return [ParamDecl(shape, p.scale_filler), ParamDecl(shape, p.shift_filler)]


# -- Upsample (max-unpooling) -------------------------------------------------------------------


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


@register("Upsample", form="max_unpool", counts=(1, 2, 1, 1))
def max_unpool(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """SegNet's Upsample: max-unpooling by the Pooling layer's mask (module docstring)."""
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


# -- SoftmaxWithLoss (class weighting) ----------------------------------------------------------


@register("SoftmaxWithLoss", form="segnet", counts=(2, 2, 1, 2), no_force_backward=(1,))
def segnet_softmax_with_loss(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context):
    """SegNet's SoftmaxWithLoss (module docstring): BVLC's checks, then the weighted loss."""
    x, label = bottoms
    loss.check_first_dim(layer, x, label)
    axis = canonical_axis(layer, layer.param.softmax_param.axis, x.ndim)
    return segnet_softmax_loss(layer, x, label, axis)


def _weights(layer: ir.Layer, classes: int, dtype) -> jax.Array | None:
    p = layer.param.loss_param
    if not p.weight_by_label_freqs:
        return None
    if len(p.class_weighting) != classes:
        raise fail(
            layer,
            f"weight_by_label_freqs needs one class_weighting per class: {classes} classes, "
            f"{len(p.class_weighting)} weights",
        )
    return jnp.asarray(list(p.class_weighting), dtype)


def segnet_softmax_loss(layer: ir.Layer, x: jax.Array, label: jax.Array, axis: int) -> list:
    """SegNet's SoftmaxWithLoss: (loss[, prob]) for scores ``x`` with classes on ``axis``."""
    p = layer.param.loss_param
    if p.HasField("normalization"):
        raise fail(layer, "SegNet's SoftmaxWithLoss reads `normalize` (default true), not "
                          "`normalization`")  # fmt: skip
    outer, classes, inner = count(x.shape, 0, axis), x.shape[axis], count(x.shape, axis + 1)
    if label.size != outer * inner:
        raise fail(layer, f"label {list(label.shape)} has {label.size} values, the scores "
                          f"{list(x.shape)} need {outer * inner}")  # fmt: skip
    z = x.reshape(outer, classes, inner)
    lab = lax.stop_gradient(label).reshape(outer, inner).astype(jnp.int32)
    safe = jnp.clip(lab, 0, classes - 1)
    picked = jnp.take_along_axis(jax.nn.log_softmax(z, axis=1), safe[:, None], axis=1)[:, 0]
    nll = -picked - lax.stop_gradient(jnp.maximum(picked, LOG_FLT_MIN) - picked)
    weights = _weights(layer, classes, x.dtype)
    if weights is not None:
        nll = nll * weights[safe]
    valid = lab != p.ignore_label if p.HasField("ignore_label") else jnp.ones(lab.shape, bool)
    in_range = (lab >= 0) & (lab < classes)
    terms = jnp.where(valid, jnp.where(in_range, nll, jnp.nan), 0)
    normalize = p.normalize if p.HasField("normalize") else True
    divisor = jnp.sum(valid).astype(x.dtype) if normalize else jnp.asarray(outer, x.dtype)
    tops = [jnp.sum(terms) / divisor]
    if len(layer.tops) > 1:
        tops.append(lax.stop_gradient(jax.nn.softmax(x, axis=axis)))
    return tops


# -- Dropout (sampling at TEST) and DenseImageData ---------------------------------------------


@register("Dropout", form="sample_test", counts=(1, 1, 1, 1), bf16=True)
def dropout_sample_test(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context):
    """SegNet's DropoutLayer: BVLC's, dropping at TEST too when ``sample_weights_test``."""
    (x,) = bottoms
    ratio = neuron.dropout_ratio(layer)
    if not (ctx.train or layer.param.dropout_param.sample_weights_test):
        return [x]
    return [neuron.dropped(x, ratio, ctx)]


@register("DenseImageData", counts=(0, 0, 2, 2), source=True, feed="pipeline")
def dense_image_data(layer: ir.Layer):
    """SegNet's DenseImageDataLayer: images and label maps, shapes from the source."""
    return from_source(layer)
