"""TextBoxes++'s layers (MhLiao/TextBoxes_plusplus@39d4898, prior_box_layer.cpp,
detection_output_layer.cpp, util/bbox_util.cpp): PriorBox form ``textboxes`` and
DetectionOutput form ``textboxes``.

* PriorBox with ``denser_prior_boxes: true``: SSD's priors, each followed by a copy whose
  centre row is ``(h + 1)·step_h`` (no offset; x unchanged): twice SSD's count. Types as
  SSD's (``(h + 1.0)·step_h`` in double, stored in a float).
* DetectionOutput, ``use_polygon: true`` (the fork's default): loc holds 12 values per prior
  and location class, [box offsets (4), quadrilateral offsets (8)]; the box decodes as SSD's,
  the quadrilateral as ``DecodeBBoxPolygon`` (lowering/boxes/coders.py ``decode_quads``:
  CENTER_SIZE with the variances in the prior only: the fork leaves the polygon undefined
  otherwise, so other code types are refused). NMS is SSD's, on the boxes (the fork's
  ApplyNMSFast, CPU and GPU, compares the axis-aligned boxes; TextBoxes++' polygon NMS is
  its Python demo's, on the host). Top rows (1, 1, K, 15): [image, label, score, xmin, ymin,
  xmax, ymax, x1, y1, x2, y2, x3, y3, x4, y4], padded as SSD's.
  ``use_polygon: false`` (rotated boxes, 9 values per prior) is refused.
* MultiBoxLoss (``use_polygon``, set or by the TextBoxes++ dialect): SSD's matching and
  mining on the boxes, the loc loss over 12 values against EncodeBBoxPolygon's targets, the
  reported loc part capped at 20 (:func:`textboxes_multibox_loss`). Its label rows are 16
  wide (TextBoxes++' AnnotatedData adds the polygon): caffe2jax's AnnotatedData emits SSD's 8,
  so such a label is refused at compile time and the loss trains from an Input-fed label.
  ``use_polygon: false`` (rotated boxes) is refused.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.boxes.coders import decode_boxes, decode_quads, encode_boxes, encode_quads
from caffe2jax.lowering.boxes.matching import ground_truth
from caffe2jax.lowering.forks import ssd
from caffe2jax.lowering.forks import ssd_multibox_loss as mbl
from caffe2jax.lowering.forks.ssd_detection_output import detection_rows, detection_settings
from caffe2jax.lowering.registry import Shape, register
from caffe2jax.lowering.util import fail

CodeType = caffe_pb2.PriorBoxParameter.CodeType


def denser_prior_boxes(layer: ir.Layer, feature: Shape, image: Shape) -> np.ndarray:
    """The (1, 2, H·W·2·num_priors·4) top of TextBoxes++' PriorBoxLayer as float32."""
    top = ssd.prior_boxes(layer, feature, image)
    p = layer.param.prior_box_param
    _, img_h, _, step_h = ssd.image_and_step(p, feature, image)
    boxes = top[0, 0].reshape(feature[2], feature[3], -1, 4)
    half_h = np.asarray(ssd.prior_sizes(layer, p), np.float64)[:, 1] / 2.0
    cy1 = np.float32((np.arange(feature[2], dtype=np.float64) + 1.0) * np.float32(step_h))
    cy1 = cy1.astype(np.float64)[:, None, None]
    low = boxes.copy()
    low[..., 1] = ((cy1 - half_h) / img_h).astype(np.float32)
    low[..., 3] = ((cy1 + half_h) / img_h).astype(np.float32)
    if p.clip:
        low = np.clip(low, 0.0, 1.0)
    both = np.stack([boxes, low], axis=3).reshape(-1)
    variances = np.tile(top[0, 1, :4], both.size // 4)
    return np.stack([both, variances])[None]


@register("PriorBox", form="textboxes", counts=(2, 2, 1, 1), no_force_backward=(0, 1))
def textboxes_prior_box(layer, params, bottoms, ctx):
    """TextBoxes++' PriorBoxLayer with denser_prior_boxes (module docstring)."""
    feature, image = bottoms
    for name, x in (("feature", feature), ("image", image)):
        if x.ndim != 4:
            raise fail(layer, f"the {name} bottom must be 4-D, got shape {list(x.shape)}")
    top = denser_prior_boxes(layer, tuple(feature.shape), tuple(image.shape))
    return [jnp.asarray(top, ctx.dtype)]


def _polygon_settings(layer: ir.Layer, loc, conf, prior) -> tuple[dict, int]:
    """The settings and prior count after the fork's Reshape checks (12 locations a prior)."""
    if not layer.param.detection_output_param.use_polygon:
        raise fail(layer, "TextBoxes++' rotated-box DetectionOutput (use_polygon: false, "
                          "9 locations per prior) is not supported; use_polygon: true "
                          "is")  # fmt: skip
    if prior.ndim < 3 or prior.shape[-2] != 2 or prior.shape[-1] % 4:
        raise fail(layer, f"prior bottom must be (1, 2, P·4), got shape {list(prior.shape)}")
    p = prior.shape[-1] // 4
    s = detection_settings(layer, max(p, 1))
    if s["code"] != CodeType.CENTER_SIZE or s["encoded"]:
        raise fail(layer, "TextBoxes++ decodes quadrilaterals for code_type CENTER_SIZE "
                          "without variance_encoded_in_target only (else its polygon is "
                          "undefined)")  # fmt: skip
    loc_classes = 1 if s["shared"] else s["classes"]
    if loc.size // loc.shape[0] != p * loc_classes * 12:
        raise fail(layer, f"number of priors must match number of location predictions (12 "
                          f"per prior: loc shape {list(loc.shape)}, {p} priors)")  # fmt: skip
    if conf.size // conf.shape[0] != p * s["classes"]:
        raise fail(layer, f"number of priors must match number of confidence predictions "
                          f"(conf shape {list(conf.shape)}, {p} priors)")  # fmt: skip
    return s, p


@register("DetectionOutput", form="textboxes", counts=(3, 3, 1, 1), no_force_backward=(0, 1, 2))
def textboxes_detection_output(layer, params, bottoms, ctx):
    """TextBoxes++' DetectionOutputLayer::Forward_cpu with use_polygon (module docstring)."""
    loc, conf, prior = (lax.stop_gradient(b) for b in bottoms)
    s, p = _polygon_settings(layer, loc, conf, prior)
    n = loc.shape[0]
    loc_classes = 1 if s["shared"] else s["classes"]
    priors = prior.reshape(-1, 2, p, 4)[0]
    loc = loc.reshape(n, p, loc_classes, 12).transpose(0, 2, 1, 3)
    boxes = decode_boxes(priors[0], priors[1], loc[..., :4], s["code"], s["encoded"])
    quads = decode_quads(priors[0], priors[1], loc[..., 4:])
    scores = conf.reshape(n, p, s["classes"]).transpose(0, 2, 1)
    return [detection_rows(jnp.concatenate([boxes, quads], -1), scores, s)]


#: bp_inside: the prior coordinate each of the 12 locations is tested on (the fork's
#: EncodeLocPredictionBboxPolygon: x4 on xmax, as written there).
_INSIDE = np.array([0, 1, 2, 3, 0, 1, 2, 3, 2, 3, 2, 3])


def _loss_settings(layer: ir.Layer, bottoms) -> tuple[mbl.Settings, int, int]:
    """(settings, N, P) after the fork's checks and caffe2jax's refusals."""
    p = layer.param.multibox_loss_param
    if not p.use_polygon:
        raise fail(layer, "TextBoxes++' rotated-box MultiBoxLoss (use_polygon: false, 9 "
                          "locations per prior) is not supported; use_polygon: true "
                          "is")  # fmt: skip
    s = mbl.settings(layer)
    if s.code != CodeType.CENTER_SIZE or s.var_in_target:
        raise fail(layer, "TextBoxes++ encodes quadrilaterals for code_type CENTER_SIZE "
                          "without encode_variance_in_target only (else the fork's polygon "
                          "targets are left unset)")  # fmt: skip
    label = bottoms[3]
    if label.ndim >= 1 and label.shape[-1] == 8:
        raise fail(layer, "the label rows are SSD's (8 values), TextBoxes++' loss reads 16 "
                          "(+ the polygon): caffe2jax's AnnotatedData does not read polygon "
                          "annotations; feed the label from an Input")  # fmt: skip
    n, p_count = mbl.check_bottoms(layer, *bottoms, s, width=12, label_width=16)
    return s, n, p_count


def _quad_terms(loc, priors, match, matched_gt, matched_quads, s: mbl.Settings):
    """EncodeLocPredictionBboxPolygon's per-prior loss (N, P): the 12 predictions against the
    encoded box and quadrilateral, the prior's outside coordinates (``bp_inside``) taking the
    target as prediction; the targets are encoded against the priors, no variance division."""
    matched_gt = jnp.where((match > -1)[..., None], matched_gt, priors[0])  # finite dummies
    box = encode_boxes(priors[0], priors[1], matched_gt, s.code, False)
    target = lax.stop_gradient(
        jnp.concatenate([box, encode_quads(priors[0], priors[1], matched_quads)], -1)
    )
    pred = loc
    if s.bp_inside:
        outside = (priors[0] < 0) | (priors[0] > 1)
        pred = jnp.where(outside[:, _INSIDE], target, pred)
    return jnp.sum(mbl.loc_terms(pred - target, s), -1)


@register("MultiBoxLoss", form="textboxes", counts=(4, 4, 1, 1), no_force_backward=(2, 3))
def textboxes_multibox_loss(layer, params, bottoms, ctx):
    """TextBoxes++' MultiBoxLossLayer::Forward_cpu / Backward_cpu with ``use_polygon``.

    loc holds 12 values per prior and location class [box (4), quadrilateral (8)]; the label
    rows are 16 wide (SSD's 8, then the polygon x1, y1, …, x4, y4). Matching (FindMatches) and
    mining (MineHardExamples, HARD_EXAMPLE's loc part on the 4 box values as SSD's
    EncodeLocPrediction) are SSD's on the axis-aligned boxes; the loc loss is SmoothL1 / L2
    over the 12 values of each matched prior against EncodeBBoxPolygon's targets. The reported
    loc part ``loc_weight·loc/norm`` is capped at 20 (a float in the fork's Forward_cpu); the
    backward is the fork's, of the uncapped loss. Matching and mining are constants (not
    differentiated, as in the fork)."""
    s, n, p = _loss_settings(layer, bottoms)
    loc, conf, prior, label = bottoms
    priors = lax.stop_gradient(prior).reshape(-1, 2, p, 4)[0]
    gt = ground_truth(label, 16)
    loc = loc.reshape(n, p, 1 if s.shared else s.classes, 12)
    conf = conf.reshape(n, p, s.classes)
    match, overlap, boxes, valid = mbl.matches(loc[:, :, 0, :4], priors, gt, s, n)
    loc = mbl.class_locations(loc, match, gt, s)
    matched_gt, labels, bad = mbl.targets(match, gt, valid, s)
    quads = gt["quads"][jnp.maximum(match, 0)]
    terms = _quad_terms(loc, priors, match, matched_gt, quads, s)
    mining_loc = None
    if s.mining == mbl.Mb.HARD_EXAMPLE:
        mining_loc = mbl.box_terms(loc[..., :4], priors[0], priors[1], match, matched_gt, boxes, s)
    pos, conf_sum = mbl.mined_conf(conf, match, overlap, labels, valid, s, mining_loc)
    loc_sum = jnp.sum(jnp.where(pos, terms, 0.0))
    total = mbl.total_loss(s, n, p, loc_sum, conf_sum, jnp.sum(pos), bad, conf.dtype, 20.0)
    return [total]
