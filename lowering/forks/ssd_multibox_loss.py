"""SSD's MultiBoxLoss (weiliu89/caffe multibox_loss_layer.cpp, util/bbox_util.cpp), vectorised
with static shapes inside the compiled step (no host round trip).

Bottoms: loc (N, P·L·4) [prior][loc class][4] (L = 1 with ``share_location``), conf (N, P·C)
raw scores [prior][class], prior (1, 2, P·4) from PriorBox, label (…, G, 8) rows [item_id,
group_label, instance_id, xmin, ymin, xmax, ymax, difficult], any G: rows whose item_id is
−1 are padding and ignored, the same bits at any G (lowering/boxes/matching.py). Per image:

1. **Matching** (MatchBBox) of the priors (``use_prior_for_matching``) or the decoded
   predictions against the image's ground truth (difficult boxes dropped unless
   ``use_difficult_gt``): overlaps > 1e-6 are recorded; bipartite stage: repeatedly the
   globally best (prior, gt) pair among unmatched priors and unused gts (ties: the lowest
   prior, then the lowest gt, as the C++ loops find them); then with PER_PREDICTION every
   still-unmatched prior takes its best gt (lowest index on ties) with overlap ≥
   ``overlap_threshold``. ``ignore_cross_boundary_bbox`` marks priors outside [0, 1] ignored.
2. **Mining**: MAX_NEGATIVE takes the min(trunc(num_pos·neg_pos_ratio), #eligible) unmatched
   priors with max overlap < ``neg_overlap`` of highest confidence loss; HARD_EXAMPLE the
   ``sample_size`` priors of highest conf + loc loss (positives not picked are dropped);
   NONE scores every prior. The C++ sorts with std::sort (unstable): equal losses at the cut
   are picked in an unspecified order there; here the lower prior index wins.
3. **Loss** = loc_weight·LocLoss/norm + ConfLoss/norm. LocLoss: SmoothL1 (SSD's) or L2
   (0.5·Σd²) over the matched priors' encoded targets (``code_type``); ConfLoss: softmax
   (−log max(p, FLT_MIN)) or logistic cross-entropy summed over positives (gt label, or
   background+1 with ``map_object_to_agnostic``) and mined negatives (background). norm =
   max(1, num_matches | N·P | N | 1) for VALID | FULL | BATCH_SIZE | NONE (``normalization``,
   else legacy ``normalize``; default VALID).

Backward: matching and mining are constants; the gradients are the fork's — the true gradient
of the loss except (a) the FLT_MIN clamp (Caffe's softmax backward ignores it) and (b) with
``encode_variance_in_target`` Caffe copies the diff of pred/variance back to loc unscaled, so
that division carries no gradient here either. The logistic targets start at
``background_label_id`` (the fork fills the target blob with it before writing the ones).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.boxes.coders import decode_boxes, encode_boxes
from caffe2jax.lowering.boxes.iou import SSD, iou
from caffe2jax.lowering.boxes.matching import cross_boundary, ground_truth, match_batch, match_boxes
from caffe2jax.lowering.layers.loss import LOG_FLT_MIN, loss_normalization
from caffe2jax.lowering.registry import register
from caffe2jax.lowering.util import count, fail

Mb = caffe_pb2.MultiBoxLossParameter
_MODE = caffe_pb2.LossParameter


@dataclass(frozen=True)
class Settings:
    """The multibox_loss_param and loss_param fields the loss reads."""

    classes: int
    shared: bool
    background: int
    per_prediction: bool
    threshold: float
    use_prior: bool
    use_difficult: bool
    mining: int
    ratio: float
    neg_overlap: float
    sample_size: int
    code: int
    var_in_target: bool
    agnostic: bool
    cross: bool
    bp_inside: bool
    l2: bool
    logistic: bool
    loc_weight: float
    normalization: int
    loc_on: bool
    conf_on: bool


def _validate(layer: ir.Layer, p) -> None:
    """The fork's LayerSetUp CHECKs, and the combinations caffe2jax refuses."""
    if not p.HasField("num_classes") or p.num_classes < 1:
        raise fail(layer, "must provide num_classes (at least 1)")
    if p.HasField("do_neg_mining") and p.do_neg_mining != (p.mining_type != Mb.NONE):
        raise fail(layer, "do_neg_mining (deprecated) contradicts mining_type")
    if p.mining_type != Mb.NONE and not p.share_location:
        raise fail(layer, "negative mining needs share_location: true (as in the fork)")
    if p.conf_loss_type == Mb.SOFTMAX and p.background_label_id >= p.num_classes:
        raise fail(layer, "background_label_id should be within [0, num_classes) for Softmax")
    if p.map_object_to_agnostic and p.num_classes != 2:
        raise fail(layer, "map_object_to_agnostic needs num_classes: 2")
    if p.HasField("nms_param") and p.nms_param.nms_threshold > 0 and p.mining_type != Mb.NONE:
        raise fail(layer, "NMS among mined examples (multibox_loss_param.nms_param) is not "
                          "supported; remove nms_param")  # fmt: skip
    if not p.share_location and not p.use_prior_for_matching:
        raise fail(layer, "share_location: false with use_prior_for_matching: false is not "
                          "supported (per-class matching of decoded predictions)")  # fmt: skip
    if p.mining_type == Mb.HARD_EXAMPLE and p.sample_size <= 0:
        raise fail(layer, "HARD_EXAMPLE mining needs sample_size > 0")


def settings(layer: ir.Layer) -> Settings:
    """The layer's Settings after the fork's LayerSetUp CHECKs."""
    p = layer.param.multibox_loss_param
    _validate(layer, p)
    down = layer.propagate_down
    return Settings(
        classes=p.num_classes, shared=p.share_location, background=p.background_label_id,
        per_prediction=p.match_type == Mb.PER_PREDICTION, threshold=p.overlap_threshold,
        use_prior=p.use_prior_for_matching, use_difficult=p.use_difficult_gt,
        mining=p.mining_type, ratio=p.neg_pos_ratio, neg_overlap=p.neg_overlap,
        sample_size=p.sample_size, code=p.code_type, var_in_target=p.encode_variance_in_target,
        agnostic=p.map_object_to_agnostic, cross=p.ignore_cross_boundary_bbox,
        bp_inside=p.bp_inside, l2=p.loc_loss_type == Mb.L2,
        logistic=p.conf_loss_type == Mb.LOGISTIC, loc_weight=p.loc_weight,
        normalization=loss_normalization(layer, _MODE.VALID),
        loc_on=down[0] if down else True, conf_on=down[1] if down else True,
    )  # fmt: skip


def check_bottoms(layer: ir.Layer, loc, conf, prior, label, s: Settings, width: int = 4,
                  label_width: int = 8) -> tuple[int, int]:  # fmt: skip
    """(N, P) after the fork's Reshape checks (``width`` locations per prior and location
    class, label rows of ``label_width``)."""
    if prior.ndim < 3 or prior.shape[-2] != 2 or prior.shape[-1] % 4:
        raise fail(layer, f"prior bottom must be (1, 2, P·4), got {list(prior.shape)}")
    n, p = loc.shape[0], prior.shape[-1] // 4
    if conf.shape[0] != n:
        raise fail(layer, f"loc {list(loc.shape)} and conf {list(conf.shape)} differ in num")
    if count(loc.shape, 1) != p * (1 if s.shared else s.classes) * width:
        raise fail(layer, f"number of priors ({p}) must match number of location predictions "
                          f"(loc {list(loc.shape)})")  # fmt: skip
    if count(conf.shape, 1) != p * s.classes:
        raise fail(layer, f"number of priors ({p}) must match number of confidence predictions "
                          f"(conf {list(conf.shape)}, {s.classes} classes)")  # fmt: skip
    if label.ndim < 1 or label.shape[-1] != label_width:
        raise fail(layer, f"label must be (1, 1, G, {label_width}) rows, got "
                          f"{list(label.shape)}")  # fmt: skip
    if s.logistic and s.mining == Mb.NONE and n > 1:
        raise fail(layer, "LOGISTIC conf loss with mining_type NONE and a batch > 1: the fork "
                          "writes image i's targets at the wrong offset (i·P instead of "
                          "i·P·C), so its result is not reproducible; use mining")  # fmt: skip
    return n, p


def match_image(boxes, gt_boxes, valid, s: Settings):
    """MatchBBox for one image with the layer's settings (lowering/boxes/matching.py
    :func:`~caffe2jax.lowering.boxes.matching.match_boxes`)."""
    return match_boxes(boxes, gt_boxes, valid, s.threshold, s.per_prediction, s.cross)


def _per_prior_conf_loss(conf, target, s: Settings):
    """ComputeConfLoss: each prior's loss against ``target`` (N, P) (a constant for mining)."""
    if s.logistic:
        t = jax.nn.one_hot(target, s.classes, dtype=conf.dtype)
        return jnp.sum(jnp.maximum(conf, 0) - conf * t + jnp.log1p(jnp.exp(-jnp.abs(conf))), -1)
    picked = jnp.take_along_axis(jax.nn.log_softmax(conf, -1), target[..., None], -1)[..., 0]
    return -jnp.maximum(picked, LOG_FLT_MIN)


def _top_mask(loss, eligible, k):
    """The ``k`` eligible entries of highest loss per row (stable: lower index on ties)."""
    order = jnp.argsort(jnp.where(eligible, -loss, jnp.inf), axis=-1, stable=True)
    rank = (
        jnp.zeros_like(order)
        .at[jnp.arange(order.shape[0])[:, None], order]
        .set(jnp.arange(order.shape[1])[None, :])
    )
    return eligible & (rank < k[:, None])


def mine(match, overlap, mining_loss, has_gt, s: Settings, allowed=None):
    """MineHardExamples: (positives, negatives) masks (N, P) after mining. ``allowed`` (N, P)
    or None: the priors the fork lets into the mining pool (RefineDet: ARM objectness)."""
    pos = match > -1
    if s.mining == Mb.NONE:
        return pos, jnp.zeros_like(pos)
    pool = jnp.ones_like(pos) if allowed is None else allowed
    if s.mining == Mb.MAX_NEGATIVE:
        eligible = (match == -1) & (overlap < s.neg_overlap) & pool
        num_pos = jnp.sum(pos, axis=1).astype(jnp.float32)
        k = jnp.minimum((num_pos * np.float32(s.ratio)).astype(jnp.int32), jnp.sum(eligible, 1))
        return pos, _top_mask(mining_loss, eligible, k) & has_gt[:, None]
    k = jnp.full(match.shape[:1], min(s.sample_size, match.shape[1]))
    chosen = _top_mask(mining_loss, pool, k) & has_gt[:, None]
    return pos & chosen, chosen & (match == -1)


def loc_pair(loc, anchors, variances, matched_gt, inside, s: Settings):
    """EncodeLocPrediction: (prediction, target) per prior (N, P, 4), as the loss sees them;
    ``anchors`` (P or N·P, 4) the boxes encoded against, ``inside`` (N, P, 4) the boxes whose
    coordinates outside [0, 1] take the target as prediction with ``bp_inside``."""
    target = encode_boxes(anchors, variances, matched_gt, s.code, s.var_in_target)
    pred = loc
    if s.bp_inside:
        outside = (inside < 0) | (inside > 1)
        pred = jnp.where(outside, target, pred)
    if s.var_in_target:
        # Caffe divides pred by the variance but copies the diff back unscaled: no gradient
        # through the division.
        pred = pred + lax.stop_gradient(pred / variances - pred)
        target = target / variances
    return pred, lax.stop_gradient(target)


def loc_terms(d, s: Settings):
    """Elementwise SmoothL1 (SSD's, sigma 1) or L2 (EuclideanLoss: 0.5·d²) of d = pred − gt."""
    if s.l2:
        return 0.5 * d * d
    ad = jnp.abs(d)
    return jnp.where(ad < 1.0, 0.5 * d * d, ad - 0.5)


def box_terms(loc, anchors, variances, match, matched_gt, inside, s: Settings):
    """Each prior's loc loss (N, P) of EncodeLocPrediction's pairs (:func:`loc_pair`); the
    unmatched priors' terms are dummies (masked by the callers)."""
    # unmatched priors get a finite dummy target (a padding row's log(0) would turn the masked
    # gradient into NaN)
    matched_gt = jnp.where((match > -1)[..., None], matched_gt, anchors)
    pred, target = loc_pair(loc, anchors, variances, matched_gt, inside, s)
    return jnp.sum(loc_terms(pred - target, s), -1)


def _conf_sum(conf, rows, target, s: Settings):
    """The conf loss layer (SoftmaxWithLoss NONE / SigmoidCrossEntropyLoss) over ``rows``."""
    if s.logistic:
        t = jnp.full(conf.shape, float(s.background), conf.dtype)
        t = jnp.where(jax.nn.one_hot(target, s.classes, dtype=bool), 1.0, t)
        terms = jnp.maximum(conf, 0) - conf * t + jnp.log1p(jnp.exp(-jnp.abs(conf)))
        return jnp.sum(jnp.where(rows[..., None], terms, 0.0))
    picked = jnp.take_along_axis(jax.nn.log_softmax(conf, -1), target[..., None], -1)[..., 0]
    nll = -picked - lax.stop_gradient(jnp.maximum(picked, LOG_FLT_MIN) - picked)
    return jnp.sum(jnp.where(rows, nll, 0.0))


def _normalizer(s: Settings, n: int, p: int, num_matches):
    value = {_MODE.FULL: n * p, _MODE.VALID: num_matches, _MODE.BATCH_SIZE: n, _MODE.NONE: 1}
    return jnp.maximum(jnp.asarray(value[s.normalization], jnp.float32), 1.0)


def matches(loc, priors, gt, s: Settings, n: int, anchors=None):
    """FindMatches per image: (match, overlap, boxes matched against) with gt validity (N,
    G). The boxes are the priors (``use_prior_for_matching``; ``anchors`` (N, P, 4) instead
    where given: RefineDet's refined anchors) or the predictions decoded against the priors.
    The gt rows are matched against their own image's boxes only (lowering/boxes/matching.py
    :func:`~caffe2jax.lowering.boxes.matching.match_batch`): (G, P) work, not (N, P, G)."""
    rows = gt["present"] & (gt["item"] >= 0) & (gt["item"] < n)
    if not s.use_difficult:
        rows = rows & ~gt["difficult"]
    valid = rows[None, :] & (gt["item"][None, :] == jnp.arange(n)[:, None])
    image = jnp.clip(gt["item"], 0, n - 1)
    if s.use_prior and anchors is None:
        boxes = jnp.broadcast_to(priors[0], (n,) + priors[0].shape)
        overlaps = iou(priors[0], gt["boxes"], SSD).T
    else:
        boxes = anchors if s.use_prior else decode_boxes(
            priors[0], priors[1], lax.stop_gradient(loc), s.code, s.var_in_target)  # fmt: skip
        overlaps = jax.vmap(lambda b, g: iou(b, g[None], SSD)[:, 0])(boxes[image], gt["boxes"])
    ignored = cross_boundary(boxes) if s.cross else None
    match, overlap = match_batch(overlaps, image, rows, n, s.threshold, s.per_prediction, ignored)
    return match, overlap, boxes, valid


def targets(match, gt, valid, s: Settings):
    """Matched gt boxes (N, P, 4) and labels (N, P); a NaN flag for labels the fork refuses."""
    safe = jnp.maximum(match, 0)
    labels = jnp.where(match > -1, gt["label"][safe], s.background)
    bad_label = (gt["label"] == s.background) | (gt["label"] < 0) | (gt["label"] >= s.classes)
    bad = jnp.any(valid & bad_label[None, :])
    return gt["boxes"][safe], labels, bad


def mined_conf(conf, match, overlap, labels, valid, s: Settings, mining_loc=None, allowed=None):
    """MineHardExamples then the conf loss layer: (positives (N, P), conf loss sum).
    ``mining_loc`` (N, P): each matched prior's loc loss, added to its conf loss for
    HARD_EXAMPLE; ``allowed``: :func:`mine`'s pool."""
    mining_loss = _per_prior_conf_loss(lax.stop_gradient(conf), labels, s)
    if s.mining == Mb.HARD_EXAMPLE:
        mining_loss = mining_loss + jnp.where(match > -1, lax.stop_gradient(mining_loc), 0.0)
    has_gt = jnp.any(valid, 1)
    pos, neg = mine(match, overlap, lax.stop_gradient(mining_loss), has_gt, s, allowed)
    conf_target = jnp.where(pos, s.background + 1 if s.agnostic else labels, s.background)
    rows = pos | neg if s.mining != Mb.NONE else jnp.ones_like(pos)
    return pos, _conf_sum(conf, rows, conf_target, s)


def total_loss(s: Settings, n: int, p: int, loc_sum, conf_sum, num_matches, bad, dtype,
               loc_cap: float | None = None):  # fmt: skip
    """The top: loc_weight·loc/norm (capped at ``loc_cap`` in the value only: TextBoxes++)
    + conf/norm, each where its bottom propagates down; NaN where a gt label is refused."""
    norm = _normalizer(s, n, p, num_matches).astype(dtype)
    total = jnp.zeros((), dtype)
    if s.loc_on:
        part = s.loc_weight * loc_sum / norm
        if loc_cap is not None:
            # the fork caps the reported loss only; its backward is the uncapped gradient
            part = part + lax.stop_gradient(jnp.minimum(part, loc_cap) - part)
        total = total + part
    if s.conf_on:
        total = total + conf_sum / norm
    return jnp.where(bad, jnp.nan, total)


def class_locations(loc, match, gt, s: Settings):
    """(N, P, W) locations of each prior: the shared ones, or (``share_location: false``)
    those of the class of its matched gt (class 0 for unmatched priors, masked later)."""
    if s.shared:
        return loc[:, :, 0]
    labels = jnp.where(match > -1, gt["label"][jnp.maximum(match, 0)], 0)
    picked = jnp.clip(labels, 0, s.classes - 1)[..., None, None]
    return jnp.take_along_axis(loc, picked, 2)[:, :, 0]


@register("MultiBoxLoss", counts=(4, 4, 1, 1), no_force_backward=(2, 3))
def multibox_loss(layer, params, bottoms, ctx):
    """MultiBoxLossLayer::Forward_cpu / Backward_cpu (module docstring)."""
    s = settings(layer)
    loc, conf, prior, label = bottoms
    n, p = check_bottoms(layer, loc, conf, prior, label, s)
    priors = lax.stop_gradient(prior).reshape(-1, 2, p, 4)[0]
    gt = ground_truth(label)
    loc = loc.reshape(n, p, 1 if s.shared else s.classes, 4)
    conf = conf.reshape(n, p, s.classes)
    match, overlap, boxes, valid = matches(loc[:, :, 0], priors, gt, s, n)
    loc = class_locations(loc, match, gt, s)
    matched_gt, labels, bad = targets(match, gt, valid, s)
    terms = box_terms(loc, priors[0], priors[1], match, matched_gt, boxes, s)
    pos, conf_sum = mined_conf(conf, match, overlap, labels, valid, s, terms)
    loc_sum = jnp.sum(jnp.where(pos, terms, 0.0))
    return [total_loss(s, n, p, loc_sum, conf_sum, jnp.sum(pos), bad, conf.dtype)]
