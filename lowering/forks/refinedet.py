"""RefineDet's DetectionOutput (sfzhang15/RefineDet@52b6fe2, detection_output_layer.cpp and
util/bbox_util.cpp): form ``refinedet``, 4 or 5 bottoms.

Bottoms: SSD's loc, conf and prior (the ODM's), then arm_conf (N, P·2, the anchor refinement
module's softmaxed background/object scores) and, with 5 bottoms, arm_loc (N, P·4):

* OSGetConfidenceScores: a prior whose objectness ``arm_conf[p·2 + 1]`` is **below**
  ``objectness_score`` (default 0.01) scores 1 for class 0 and 0 for every other class
  (class 0 whatever ``background_label_id`` says, as the fork), else the ODM's scores;
* CasRegDecodeBBoxesAll (5 bottoms): each image's priors are first decoded with arm_loc
  (``code_type``, the priors' variances), then the ODM's locations are decoded against those
  refined anchors with the same variances; with 4 bottoms the ODM's locations are decoded
  against the priors as SSD's;
* then SSD's per-class NMS, keep_top_k and padded (1, 1, K, 7) top
  (lowering/forks/ssd_detection_output.py).

The fork reads arm_loc's shared locations only (label −1), so 5 bottoms need
``share_location: true``. No backward, as SSD's.

RefineDet's MultiBoxLoss with the ARM bottoms (5 or 6) is refused when the net is compiled.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.lowering.boxes.coders import decode_boxes, refine_and_decode
from caffe2jax.lowering.forks.ssd_detection_output import (
    check_bottoms,
    detection_rows,
    detection_settings,
)
from caffe2jax.lowering.registry import register
from caffe2jax.lowering.util import fail


def objectness_scores(conf, arm_conf, threshold: float):
    """OSGetConfidenceScores: (N, P, C) scores with the ARM's easy negatives set to
    [1, 0, …]."""
    n, p, c = conf.shape
    low = arm_conf.reshape(n, p, 2)[..., 1] < threshold
    negative = jnp.zeros((c,), conf.dtype).at[0].set(1.0)
    return jnp.where(low[..., None], negative, conf)


def _check_arm(layer: ir.Layer, bottoms, p: int, s: dict) -> None:
    n = bottoms[0].shape[0]
    arm_conf = bottoms[3]
    if arm_conf.shape[0] != n or arm_conf.size // n != p * 2:
        raise fail(layer, f"arm_conf must hold 2 scores per prior ({p} priors), got shape "
                          f"{list(arm_conf.shape)}")  # fmt: skip
    if len(bottoms) < 5:
        return
    arm_loc = bottoms[4]
    if arm_loc.shape[0] != n or arm_loc.size // n != p * 4:
        raise fail(layer, f"arm_loc must hold 4 locations per prior ({p} priors), got shape "
                          f"{list(arm_loc.shape)}")  # fmt: skip


@register("DetectionOutput", form="refinedet", counts=(4, 5, 1, 1),
          no_force_backward=(0, 1, 2, 3, 4))  # fmt: skip
def refinedet_detection_output(layer, params, bottoms, ctx):
    """RefineDet's DetectionOutputLayer::Forward_cpu (module docstring), padded as SSD's."""
    bottoms = [lax.stop_gradient(b) for b in bottoms]
    loc, conf, prior = bottoms[:3]
    s = detection_settings(layer, max(prior.shape[-1] // 4, 1))
    if len(bottoms) == 5 and not s["shared"]:
        raise fail(layer, "RefineDet refines the anchors with the ARM's shared locations "
                          "only: 5 bottoms need share_location: true")  # fmt: skip
    p = check_bottoms(layer, loc, conf, prior, s)
    _check_arm(layer, bottoms, p, s)
    n = loc.shape[0]
    loc_classes = 1 if s["shared"] else s["classes"]
    priors = prior.reshape(-1, 2, p, 4)[0]
    loc = loc.reshape(n, p, loc_classes, 4).transpose(0, 2, 1, 3)
    if len(bottoms) == 5:
        arm_loc = bottoms[4].reshape(n, p, 4)
        boxes = refine_and_decode(priors[0], priors[1], arm_loc, loc, s["code"], s["encoded"])
    else:
        boxes = decode_boxes(priors[0], priors[1], loc, s["code"], s["encoded"])
    score = layer.param.detection_output_param.objectness_score
    scores = objectness_scores(conf.reshape(n, p, s["classes"]), bottoms[3], score)
    return [detection_rows(boxes, scores.transpose(0, 2, 1), s)]


@register("MultiBoxLoss", form="refinedet", counts=(5, 6, 1, 1))
def refinedet_multibox_loss(layer, params, bottoms, ctx):
    """RefineDet's two-stage MultiBoxLoss (arm_conf, arm_loc bottoms): refused."""
    raise fail(layer, "RefineDet's MultiBoxLoss with the ARM's bottoms (arm_conf, arm_loc: "
                      "matching against refined anchors, negatives filtered by "
                      "objectness_score) is not supported yet; its DetectionOutput is, and "
                      "SSD's MultiBoxLoss with 4 bottoms (the ARM's own loss)")  # fmt: skip
