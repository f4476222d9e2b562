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

MultiBoxLoss form ``refinedet`` (5 or 6 bottoms: + arm_conf, + arm_loc): the ODM's loss, SSD's
(lowering/forks/ssd_multibox_loss.py) matched against the refined anchors and mined among the
priors the ARM finds objects in (:func:`refinedet_multibox_loss`). The ARM's own loss (4
bottoms, num_classes 2, as the fork's generated train nets wire it, ``objectness_score`` set) is
form ``refinedet`` too: SSD's, but a gt label >= 2 reads as 1 (the fork's GetGroundTruth).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.lowering.boxes.coders import decode_boxes, refine_and_decode
from caffe2jax.lowering.boxes.matching import ground_truth
from caffe2jax.lowering.forks import ssd_multibox_loss as mbl
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


def _ground_truth(label, s: mbl.Settings) -> dict:
    """RefineDet's GetGroundTruth: SSD's rows, a label >= 2 read as 1 when num_classes is 2
    (the ARM's object-or-not loss reads the data's class labels)."""
    gt = ground_truth(label)
    if s.classes == 2:
        gt["label"] = jnp.where(gt["label"] >= 2, 1, gt["label"])
    return gt


def _check_loss_arm(layer: ir.Layer, bottoms, s: mbl.Settings, n: int, p: int) -> None:
    """The ARM bottoms of RefineDet's MultiBoxLoss: arm_conf (N, P·2), arm_loc (N, P·4)."""
    if len(bottoms) < 5:
        return
    if bottoms[4].shape[0] != n or bottoms[4].size != n * p * 2:
        raise fail(layer, f"arm_conf must hold 2 scores per prior ({p} priors), got shape "
                          f"{list(bottoms[4].shape)}")  # fmt: skip
    if len(bottoms) < 6:
        return
    if not s.shared:
        raise fail(layer, "RefineDet refines the anchors with the ARM's shared locations "
                          "only: 6 bottoms need share_location: true")  # fmt: skip
    if bottoms[5].shape[0] != n or bottoms[5].size != n * p * 4:
        raise fail(layer, f"arm_loc must hold 4 locations per prior ({p} priors), got shape "
                          f"{list(bottoms[5].shape)}")  # fmt: skip


def _loss_terms(loc, anchors, boxes, priors, match, matched_gt, s: mbl.Settings):
    """Each prior's loc loss for the loss and for HARD_EXAMPLE's mining: (terms, mining)."""
    if anchors is None:  # 5 bottoms: SSD's EncodeLocPrediction
        terms = mbl.box_terms(loc, priors[0], priors[1], match, matched_gt, boxes, s)
        return terms, terms
    # CasRegEncodeLocPrediction: bp_inside tests the refined anchors, or the predictions
    # decoded against them (use_prior_for_matching: false)
    inside = anchors
    if not s.use_prior:
        decode = jax.vmap(lambda a, lo: decode_boxes(a, priors[1], lo, s.code, s.var_in_target))
        inside = decode(anchors, lax.stop_gradient(loc))
    terms = mbl.box_terms(loc, anchors, priors[1], match, matched_gt, inside, s)
    if s.mining != mbl.Mb.HARD_EXAMPLE:
        return terms, None
    # MineHardExamples calls SSD's EncodeLocPrediction: the plain priors
    plain = jnp.broadcast_to(priors[0], boxes.shape) if s.use_prior else boxes
    return terms, mbl.box_terms(loc, priors[0], priors[1], match, matched_gt, plain, s)


@register("MultiBoxLoss", form="refinedet", counts=(4, 6, 1, 1),
          no_force_backward=(2, 3, 4, 5))  # fmt: skip
def refinedet_multibox_loss(layer, params, bottoms, ctx):
    """RefineDet's MultiBoxLossLayer::Forward_cpu / Backward_cpu with the ARM's bottoms.

    With arm_loc (6 bottoms) CasRegFindMatches matches the gt against the anchors refined by
    the ARM (each image's priors decoded with arm_loc; with ``use_prior_for_matching: false``
    the ODM's predictions decoded against the plain priors, as the fork) and
    CasRegEncodeLocPrediction encodes the targets against the refined anchors with the
    priors' variances. With arm_conf (5 or 6), MineHardExamples admits a prior into the
    mining pool only if its objectness ``arm_conf[2p + 1] ≥ objectness_score``; positives are
    counted as SSD's. HARD_EXAMPLE's loc part of the mining loss is EncodeLocPrediction's
    (against the plain priors), as in the fork. Backward: the fork writes no diff to arm_conf
    or arm_loc (the ARM trains through its own 4-bottom loss), so both are constants here, as
    are the matching and mining (not differentiated, as in the fork)."""
    s = mbl.settings(layer)
    loc, conf, prior, label = bottoms[:4]
    n, p = mbl.check_bottoms(layer, loc, conf, prior, label, s)
    _check_loss_arm(layer, bottoms, s, n, p)
    arm = [lax.stop_gradient(b) for b in bottoms[4:]]
    priors = lax.stop_gradient(prior).reshape(-1, 2, p, 4)[0]
    gt = _ground_truth(label, s)
    loc = loc.reshape(n, p, 1 if s.shared else s.classes, 4)
    conf = conf.reshape(n, p, s.classes)
    anchors = None
    if len(arm) == 2:
        arm_loc = arm[1].reshape(n, p, 4)
        anchors = decode_boxes(priors[0], priors[1], arm_loc, s.code, s.var_in_target)
    match, overlap, boxes, valid = mbl.matches(loc[:, :, 0], priors, gt, s, n, anchors)
    loc = mbl.class_locations(loc, match, gt, s)
    matched_gt, labels, bad = mbl.targets(match, gt, valid, s)
    terms, mining_loc = _loss_terms(loc, anchors, boxes, priors, match, matched_gt, s)
    allowed = None
    if arm:
        objectness = layer.param.multibox_loss_param.objectness_score
        allowed = arm[0].reshape(n, p, 2)[..., 1] >= objectness
    pos, conf_sum = mbl.mined_conf(conf, match, overlap, labels, valid, s, mining_loc, allowed)
    loc_sum = jnp.sum(jnp.where(pos, terms, 0.0))
    return [mbl.total_loss(s, n, p, loc_sum, conf_sum, jnp.sum(pos), bad, conf.dtype)]
