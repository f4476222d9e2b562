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
* MultiBoxLoss (``use_polygon``, set or by the TextBoxes++ dialect) is refused.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.boxes.coders import decode_boxes, decode_quads
from caffe2jax.lowering.forks import ssd
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


@register("MultiBoxLoss", form="textboxes", counts=(4, 4, 1, 1))
def textboxes_multibox_loss(layer, params, bottoms, ctx):
    """TextBoxes++' MultiBoxLoss (polygon or rotated-box targets): refused."""
    raise fail(layer, "TextBoxes++' MultiBoxLoss (use_polygon: quadrilateral or rotated-box "
                      "targets from its AnnotatedData) is not supported; its PriorBox and "
                      "DetectionOutput are")  # fmt: skip
