"""SSD's layers (weiliu89/caffe, branch ssd): Normalize, Permute, PriorBox, SmoothL1Loss (form
``ssd``) and the data layers AnnotatedData and VideoData (form ``ssd``, refused). MultiBoxLoss,
DetectionOutput and DetectionEvaluate have their own modules (lowering/forks/ssd_*.py); the box
maths they share is lowering/boxes/.

Reproduced from normalize_layer.cpp, permute_layer.cpp, prior_box_layer.cpp and
smooth_L1_loss_layer.cpp:

* Normalize (``norm_param``): per sample, ``across_spatial`` divides by
  ``sqrt(Σ_{c,h,w} x² + eps)``, otherwise each position by ``sqrt(Σ_c x² + eps)`` (eps inside
  the square root); then multiplies by the ``scale`` blob (one value when ``channel_shared``,
  else one per channel; filler constant 1 unless ``scale_filler``). Its backward is the true
  gradient (jax.grad).
* Permute (``permute_param``): ``order`` lists the new axis order; missing axes follow in
  increasing order; a repeated or out-of-range axis is refused. Backward: the inverse
  transpose.
* PriorBox (``prior_box_param``): a constant (1, 2, H·W·num_priors·4) blob of normalized
  [xmin, ymin, xmax, ymax] priors (channel 0) and their variances (channel 1), built from the
  shapes only. Sizes are truncated to integers as the fork does (``int min_size_``); the
  second box of each min size has side ``sqrt(min·max)``; then one box per aspect ratio
  other than 1 (ratios within 1e-6 of one already listed are dropped; ``flip`` adds 1/r).
  The fork's types are kept: ratios are floats (1/r computed in double, stored as float),
  box sides ``sqrt(min·max)`` and ``min·sqrt(r)`` are computed in double and stored in a
  float (C's ``sqrt(double)``; a build whose ``sqrt(float)`` overload is visible would round
  ``sqrt(r)`` first: docs/fidelity.md), centres ``(w + offset)·step`` in float, and each
  coordinate ``(centre ∓ side/2.)/img`` in double, stored as float. Computed in NumPy when
  the net is compiled: jit cannot change it.
  ``clip`` (default false in SSD; OpenCV's proto defaults it to true) clamps to [0, 1].
* SmoothL1Loss (form ``ssd``): no parameter, bottoms pred, target [, weights].
  d = (pred − target)·w; f = 0.5·d² where |d| < 1, else |d| − 0.5; loss = Σf / N (N =
  pred.num). Backward: pred gets f'(d)/N and target −f'(d)/N (the layer allows backward to
  both), the weights nothing — and **the factor w is not applied**: Caffe's backward
  differentiates f with respect to d and stops there. That is not the true gradient when
  weights are given, so the layer is a ``jax.custom_vjp`` (with two bottoms it coincides with
  the true gradient). (With two bottoms and no sigma Faster R-CNN's form computes the same.)
* AnnotatedData: images with boxes, read by the runtime's pipeline
  (caffe2jax.runtime.data.readers.annotated_data); its label top is (1, 1, R, 8), R each
  batch's bucket of rows (padding rows of −1: lowering/boxes/matching.py; docs/detection.md).
* VideoData (form ``ssd``: ``video_type``, ``device_id``, ``video_file``): SSD's webcam or
  video-file reader, refused when the net is compiled (C3D's VideoData is supported:
  lowering/forks/c3d.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.layers.data import from_source
from caffe2jax.lowering.registry import ParamDecl, Shape, register
from caffe2jax.lowering.util import fail

# -- Normalize ----------------------------------------------------------------------------


@register("Normalize", counts=(1, 1, 1, 1))
def normalize(layer, params, bottoms, ctx):
    """SSD's NormalizeLayer forward: L2 normalization across channels (or all of a sample),
    then the learned scale."""
    p = layer.param.norm_param
    (x,) = bottoms
    (scale,) = params
    n, c = x.shape[0], x.shape[1]
    x3 = x.reshape(n, c, -1)
    if p.across_spatial:
        norm = jnp.sqrt(jnp.sum(x3 * x3, axis=(1, 2), keepdims=True) + p.eps)
    else:
        norm = jnp.sqrt(jnp.sum(x3 * x3, axis=1, keepdims=True) + p.eps)
    y = x3 / norm
    y = y * (scale.reshape(()) if p.channel_shared else scale.reshape(1, c, 1))
    return [y.reshape(x.shape)]


@normalize.param_shapes
def _(layer: ir.Layer, bottom_shapes: Sequence[Shape]) -> list[ParamDecl]:
    """One scale blob: shape () when ``channel_shared`` (the fork's 0-axis blob), else (C,)."""
    (shape,) = bottom_shapes
    if len(shape) < 2:
        raise fail(layer, f"the bottom needs at least 2 axes, got shape {list(shape)}")
    p = layer.param.norm_param
    filler = p.scale_filler if p.HasField("scale_filler") else None
    if filler is None:
        filler = caffe_pb2.FillerParameter(type="constant", value=1.0)
    return [ParamDecl(() if p.channel_shared else (shape[1],), filler)]


# -- Permute ------------------------------------------------------------------------------


def permute_order(layer: ir.Layer, ndim: int) -> tuple[int, ...]:
    """PermuteLayer::LayerSetUp: the given axes, then the missing ones in increasing order."""
    order: list[int] = []
    for axis in layer.param.permute_param.order:
        if axis >= ndim:
            raise fail(layer, f"order {axis} is out of range for a {ndim}-D bottom")
        if axis in order:
            raise fail(layer, f"there are duplicate orders: {axis}")
        order.append(int(axis))
    order += [a for a in range(ndim) if a not in order]
    return tuple(order)


@register("Permute", counts=(1, 1, 1, 1))
def permute(layer, params, bottoms, ctx):
    """top = transpose(bottom, order) (the identity order shares the bottom)."""
    (x,) = bottoms
    order = permute_order(layer, x.ndim)
    if order == tuple(range(x.ndim)):
        return [x]
    return [jnp.transpose(x, order)]


# -- PriorBox -----------------------------------------------------------------------------


def aspect_ratios(p) -> list[float]:
    """[1] then each given ratio (and 1/ratio with ``flip``) not within 1e-6 of one listed."""
    ratios = [np.float32(1.0)]
    for r in p.aspect_ratio:
        r = np.float32(r)
        if any(abs(float(r - have)) < 1e-6 for have in ratios):
            continue
        ratios.append(r)
        if p.flip:
            ratios.append(np.float32(1.0 / float(r)))  # 1./ar in double, stored as float
    return ratios


def prior_variances(layer: ir.Layer, p) -> list[float]:
    """One variance for all four coordinates, four, or none (0.1)."""
    values = [float(v) for v in p.variance]
    if not all(0 < v < math.inf for v in values):  # the fork's CHECK_GT(variance, 0); NaN fails
        raise fail(layer, f"variance must be positive and finite, got {values}")
    if len(values) == 1:
        return values * 4
    if len(values) in (0, 4):
        return values or [0.1] * 4
    raise fail(layer, f"must provide 1 or 4 variances, got {len(values)}")


def int_size(layer: ir.Layer, field: str, raw: float) -> int:
    """A min_size/max_size as the fork's ``int``: positive (its CHECK_GT; NaN fails it) and
    below 2^31 (an int cannot hold more)."""
    if not 0 < raw < 2**31:
        raise fail(layer, f"{field} must be positive and below 2^31, got {raw}")
    return int(raw)


def _positive(layer: ir.Layer, p, fields: tuple[str, ...]) -> None:
    """The fork's CHECK_GT(…, 0) on the image size and step fields it reads (NaN fails it; an
    infinite step too, which would make every prior infinite)."""
    for field in fields:
        value = getattr(p, field)
        if not 0 < value < math.inf:
            raise fail(layer, f"prior_box_param.{field} should be larger than 0 and finite, "
                              f"got {value}")  # fmt: skip


def prior_sizes(layer: ir.Layer, p) -> list[tuple[float, float]]:
    """(width, height) of each prior at one position, in the fork's order."""
    if not p.min_size:
        raise fail(layer, "must provide min_size")
    if p.max_size and len(p.max_size) != len(p.min_size):
        raise fail(layer, "max_size must be given once per min_size")
    sizes = []
    f32 = np.float32
    for s, raw in enumerate(p.min_size):
        ms = int_size(layer, "min_size", raw)  # the fork stores min/max sizes in ints
        sizes.append((ms, ms))
        if p.max_size:
            big = int_size(layer, "max_size", p.max_size[s])
            if p.max_size[s] <= raw:
                raise fail(layer, "max_size must be greater than min_size")
            side = f32(math.sqrt(ms * big))  # sqrt(int) in double, kept in a float
            sizes.append((side, side))
        for r in aspect_ratios(p):
            if abs(float(r) - 1.0) >= 1e-6:  # C's sqrt(double(ar)), the product kept in a float
                root = math.sqrt(float(r))
                sizes.append((f32(ms * root), f32(ms / root)))
    return sizes


def image_and_step(p, feature: Shape, image: Shape) -> tuple[float, float, float, float]:
    """(img_w, img_h, step_w, step_h) as PriorBoxLayer::Forward_cpu picks them."""
    if p.HasField("img_h") or p.HasField("img_w"):
        img_h, img_w = p.img_h, p.img_w
    elif p.HasField("img_size"):
        img_h = img_w = p.img_size
    else:
        img_h, img_w = image[2], image[3]
    if p.HasField("step_h") or p.HasField("step_w"):
        step_h, step_w = p.step_h, p.step_w
    elif p.HasField("step"):
        step_h = step_w = p.step
    else:
        step_h = np.float32(img_h) / np.float32(feature[2])
        step_w = np.float32(img_w) / np.float32(feature[3])
    return float(img_w), float(img_h), float(step_w), float(step_h)


def check_image_and_step(layer: ir.Layer, p) -> None:
    """PriorBoxLayer::LayerSetUp's CHECKs on img_size/img_h/img_w, step/step_h/step_w; and a
    finite offset (the fork has no CHECK; NaN would give NaN priors)."""
    if (p.HasField("img_h") or p.HasField("img_w")) and p.HasField("img_size"):
        raise fail(layer, "Either img_size or img_h/img_w should be specified; not both")
    if (p.HasField("step_h") or p.HasField("step_w")) and p.HasField("step"):
        raise fail(layer, "Either step or step_h/step_w should be specified; not both")
    if p.HasField("img_h") or p.HasField("img_w"):
        _positive(layer, p, ("img_h", "img_w"))
    elif p.HasField("img_size"):
        _positive(layer, p, ("img_size",))
    if p.HasField("step_h") or p.HasField("step_w"):
        _positive(layer, p, ("step_h", "step_w"))
    elif p.HasField("step"):
        _positive(layer, p, ("step",))
    if not math.isfinite(p.offset):
        raise fail(layer, f"prior_box_param.offset must be finite, got {p.offset}")


def prior_boxes(layer: ir.Layer, feature: Shape, image: Shape) -> np.ndarray:
    """The (1, 2, H·W·num_priors·4) PriorBox top as a float32 numpy array."""
    p = layer.param.prior_box_param
    check_image_and_step(layer, p)
    sizes = np.asarray(prior_sizes(layer, p), np.float64)
    img_w, img_h, step_w, step_h = image_and_step(p, feature, image)
    off = np.float32(p.offset)
    hs, ws = np.meshgrid(np.arange(feature[2]), np.arange(feature[3]), indexing="ij")
    cx = ((ws + off).astype(np.float32) * np.float32(step_w)).reshape(-1, 1)
    cy = ((hs + off).astype(np.float32) * np.float32(step_h)).reshape(-1, 1)
    bw, bh = sizes[:, 0][None], sizes[:, 1][None]
    boxes = np.stack(
        [(cx - bw / 2.0) / img_w, (cy - bh / 2.0) / img_h,
         (cx + bw / 2.0) / img_w, (cy + bh / 2.0) / img_h], axis=-1,
    ).astype(np.float32)  # fmt: skip
    if p.clip:
        boxes = np.clip(boxes, 0.0, 1.0)
    boxes = boxes.reshape(-1)
    variances = np.tile(np.asarray(prior_variances(layer, p), np.float32), boxes.size // 4)
    return np.stack([boxes, variances])[None]


@register("PriorBox", counts=(2, 2, 1, 1), no_force_backward=(0, 1))
def prior_box(layer, params, bottoms, ctx):
    """SSD's PriorBoxLayer: priors from the feature map's and the image's shapes only."""
    feature, image = bottoms
    for name, x in (("feature", feature), ("image", image)):
        if x.ndim != 4:
            raise fail(layer, f"the {name} bottom must be 4-D, got shape {list(x.shape)}")
    top = prior_boxes(layer, tuple(feature.shape), tuple(image.shape))
    return [jnp.asarray(top, ctx.dtype)]


# -- SmoothL1Loss ---------------------------------------------------------------------------


def _terms(d: jax.Array) -> jax.Array:
    ad = jnp.abs(d)
    return jnp.where(ad < 1.0, 0.5 * d * d, ad - 0.5)


@jax.custom_vjp
def _loss(pred, target, weights):
    return jnp.sum(_terms((pred - target) * weights)) / pred.shape[0]


def _loss_fwd(pred, target, weights):
    d = (pred - target) * weights
    return jnp.sum(_terms(d)) / pred.shape[0], (d, weights)


def _loss_bwd(res, g):
    d, weights = res
    # f'(d) = d if |d| < 1 else sign(d), scaled by top_diff / num; NOT multiplied by w (fork)
    grad = jnp.where(jnp.abs(d) < 1.0, d, jnp.sign(d)) * (g / d.shape[0])
    return grad, -grad, jnp.zeros_like(weights)


_loss.defvjp(_loss_fwd, _loss_bwd)


@register("SmoothL1Loss", form="ssd", counts=(2, 4, 1, 1))
def smooth_l1_ssd(layer: ir.Layer, params, bottoms, ctx) -> list[jax.Array]:
    """SSD's SmoothL1LossLayer::Forward_cpu / Backward_cpu (module docstring)."""
    if len(bottoms) > 3:
        raise fail(layer, f"SSD's SmoothL1Loss takes 2 or 3 bottoms (pred, target [, weights]), "
                          f"got {len(bottoms)}")  # fmt: skip
    pred, target = bottoms[0], bottoms[1]
    for b, name in zip(bottoms[1:], layer.bottom_names[1:]):
        if b.shape[1:] != pred.shape[1:] or b.ndim < 1:
            raise fail(layer, f"bottom '{name}' {list(b.shape)} must match the prediction "
                              f"{list(pred.shape)} in channels, height and width")  # fmt: skip
    if target.shape[0] != pred.shape[0]:
        raise fail(layer, "the data and label should have the same first dimension")
    weights = bottoms[2] if len(bottoms) == 3 else jnp.ones_like(pred)
    return [_loss(pred, target, jax.lax.stop_gradient(weights))]


# -- data layers ----------------------------------------------------------------------------


@register("AnnotatedData", counts=(0, 0, 1, 2), source=True, feed="pipeline")
def annotated_data(layer: ir.Layer):
    """SSD's AnnotatedDataLayer: images and their boxes, shapes from the source."""
    return from_source(layer)


@register("VideoData", form="ssd", counts=(0, 0, 1, 2), source=True, feed="pipeline")
def video_data_ssd(layer: ir.Layer):
    """SSD's VideoData (a webcam or a video file): refused when the net is compiled."""
    raise fail(
        layer,
        "SSD's VideoData reads a webcam or a video file (video_type, device_id, video_file), "
        "which caffe2jax does not support; C3D's VideoData (clips listed in "
        "video_data_param.source) is",
    )
