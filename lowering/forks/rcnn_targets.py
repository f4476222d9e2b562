"""py-faster-rcnn's training target layers as built-in Python layers, in JAX with fixed shapes:
``rpn.anchor_target_layer.AnchorTargetLayer`` and ``rpn.proposal_target_layer.
ProposalTargetLayer``.

A net naming either in ``python_param`` runs this version unless the user registered a JAX function
for it or their own module is importable from sys.path (then their class runs, as in Caffe;
py-R-FCN's forms of both layers, its anchor targets normalised, are in
:mod:`~caffe2jax.lowering.forks.rfcn`).
Reproduced from py-faster-rcnn@781a917 lib/rpn/anchor_target_layer.py, proposal_target_layer.py
and the end2end config (lib/fast_rcnn/config.py with experiments/cfgs/faster_rcnn_end2end.yml):
the thresholds, fractions and batch sizes in :data:`ANCHOR_CFG` and :data:`PROPOSAL_CFG` are the
fork's: the proposal target layer normalises its targets by means (0, 0, 0, 0) and stds
(0.1, 0.1, 0.2, 0.2) (``BBOX_NORMALIZE_TARGETS_PRECOMPUTED``, which the end2end config sets),
so a solver snapshot of a train net running it writes ``bbox_pred`` un-normalised as
lib/fast_rcnn/train.py's does (:func:`bbox_pred_snapshot`, applied by
runtime/train/snapshots.py). The anchor target layer's param_str: ``feat_stride``,
``allowed_border`` and the anchors' ``scales``, ``ratios`` and ``base_size`` (PVANet's and
py-RFCN-priv's readings; see :func:`~caffe2jax.lowering.forks.rcnn_proposal.anchor_settings`).

What differs from the numpy original (both layers have no backward there; here their tops are
constants for the gradient, ``stop_gradient``):

* Random subsets: py-faster-rcnn draws with ``numpy.random.choice(…, replace=False)``; here a
  uniform random subset of the same size is drawn with the layer's JAX key (every subset
  equally likely, as numpy's; the particular draws differ, so runs are not bit-identical to
  py-faster-rcnn's, only equal in distribution). The counts are the fork's.
* Fixed shapes: gt_boxes is (G, 5) with padding rows (class ≤ 0, masked out; see
  :mod:`~caffe2jax.lowering.boxes.coders`); the proposal target layer always gives
  ``BATCH_SIZE`` (128) rois. py-faster-rcnn gives fewer when fewer than 128 proposals and
  gt boxes qualify as fg or bg; here the chosen rois then repeat in order (fg first, then bg)
  to fill 128 rows, which weights them more in the losses. Proposal rows that are all zeros
  (the padding of the built-in proposal layer) are not candidates.
* IoU is computed in the net's dtype (float32), py-faster-rcnn's in float64: an overlap within
  float32 rounding of a threshold (0.7, 0.3, 0.5) may fall on the other side.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.boxes.coders import bbox_transform
from caffe2jax.lowering.boxes.iou import RCNN, iou
from caffe2jax.lowering.boxes.matching import gt_valid, random_subset
from caffe2jax.lowering.forks.rcnn_proposal import anchor_settings, parse_param_str
from caffe2jax.lowering.python_layer import register_builtin_python_layer
from caffe2jax.lowering.util import fail

#: cfg.TRAIN of py-faster-rcnn's config.py for the anchor target layer.
ANCHOR_CFG = {
    "RPN_POSITIVE_OVERLAP": 0.7,
    "RPN_NEGATIVE_OVERLAP": 0.3,
    "RPN_CLOBBER_POSITIVES": False,
    "RPN_FG_FRACTION": 0.5,
    "RPN_BATCHSIZE": 256,
    "RPN_BBOX_INSIDE_WEIGHTS": (1.0, 1.0, 1.0, 1.0),
    "RPN_POSITIVE_WEIGHT": -1.0,
    "RPN_NORMALIZE_TARGETS": False,
    "RPN_NORMALIZE_MEANS": (0.0, 0.0, 0.0, 0.0),
    "RPN_NORMALIZE_STDS": (0.1, 0.1, 0.2, 0.2),
}

#: cfg.TRAIN with faster_rcnn_end2end.yml for the proposal target layer.
PROPOSAL_CFG = {
    "BATCH_SIZE": 128,
    "FG_FRACTION": 0.25,
    "FG_THRESH": 0.5,
    "BG_THRESH_HI": 0.5,
    "BG_THRESH_LO": 0.0,
    "BBOX_INSIDE_WEIGHTS": (1.0, 1.0, 1.0, 1.0),
    "BBOX_NORMALIZE_MEANS": (0.0, 0.0, 0.0, 0.0),
    "BBOX_NORMALIZE_STDS": (0.1, 0.1, 0.2, 0.2),
}


def gt_rows(gt_boxes: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
    """(boxes (G, 4) with padding rows zeroed, valid (G,)) of a (G, 5) gt_boxes array."""
    gt = lax.stop_gradient(gt_boxes).reshape(-1, 5).astype(dtype)
    valid = gt_valid(gt)
    return jnp.where(valid[:, None], gt[:, :4], 0.0), valid


def shifted_anchors(height: int, width: int, stride: float, anchors: np.ndarray) -> np.ndarray:
    """All (H·W·A, 4) anchors, position-major (row-major), anchors inner (index k·A + a)."""
    sx, sy = np.meshgrid(np.arange(width) * stride, np.arange(height) * stride)
    shifts = np.stack([sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel()], axis=1)
    return (anchors[None] + shifts[:, None]).reshape(-1, 4)


def anchor_labels(overlaps, inside, valid, key, cfg=ANCHOR_CFG):
    """The anchor target layer's labels (1 fg, 0 bg, −1 ignored) of (N,) anchors with IoU
    ``overlaps`` (N, G) to the gt boxes (``valid`` their real columns), ``inside`` the
    anchors within the image: thresholds, every gt's best anchors (ties included), then the
    fg and bg subsampling."""
    ov = jnp.where(valid[None, :], overlaps, 0.0)
    max_ov = jnp.max(ov, axis=1)
    gt_max = jnp.max(jnp.where(inside[:, None], ov, -1.0), axis=0)
    best = jnp.any((ov == gt_max[None, :]) & valid[None, :], axis=1)
    neg = max_ov < cfg["RPN_NEGATIVE_OVERLAP"]
    pos = best | (max_ov >= cfg["RPN_POSITIVE_OVERLAP"])
    if cfg["RPN_CLOBBER_POSITIVES"]:
        labels = jnp.where(neg, 0, jnp.where(pos, 1, -1))
    else:
        labels = jnp.where(pos, 1, jnp.where(neg, 0, -1))
    labels = jnp.where(inside, labels, -1)
    k_fg, k_bg = jax.random.split(key)
    num_fg = int(cfg["RPN_FG_FRACTION"] * cfg["RPN_BATCHSIZE"])
    fg = labels == 1
    labels = jnp.where(fg & ~random_subset(k_fg, fg, num_fg), -1, labels)
    num_bg = cfg["RPN_BATCHSIZE"] - jnp.sum(labels == 1)
    bg = labels == 0
    return jnp.where(bg & ~random_subset(k_bg, bg, num_bg), -1, labels)


def anchor_weights(labels, cfg=ANCHOR_CFG):
    """(inside, outside) weights (N, 4) for anchor ``labels``."""
    inside = jnp.where((labels == 1)[:, None], jnp.asarray(cfg["RPN_BBOX_INSIDE_WEIGHTS"]), 0.0)
    pos_w = cfg["RPN_POSITIVE_WEIGHT"]
    if pos_w < 0:
        n = jnp.maximum(jnp.sum(labels >= 0), 1).astype(jnp.float32)
        w_pos = w_neg = 1.0 / n
    else:
        w_pos = pos_w / jnp.sum(labels == 1)
        w_neg = (1.0 - pos_w) / jnp.sum(labels == 0)
    outside = jnp.where(labels == 1, w_pos, jnp.where(labels == 0, w_neg, 0.0))
    return inside, jnp.broadcast_to(outside[:, None], inside.shape)


def _anchor_settings(layer: ir.Layer) -> tuple[float, np.ndarray, float]:
    params, anchors = anchor_settings(layer)
    return float(params["feat_stride"]), anchors, float(params.get("allowed_border", 0))


def anchor_targets(anchors, gt, cfg=ANCHOR_CFG):
    """``bbox_transform`` of each anchor to its gt box; with ``RPN_NORMALIZE_TARGETS``
    (py-R-FCN's rfcn_end2end_ohem.yml) (targets − ``RPN_NORMALIZE_MEANS``) /
    ``RPN_NORMALIZE_STDS``, as py-R-FCN's anchor_target_layer.py ``_compute_targets``."""
    targets = bbox_transform(anchors, gt)
    if not cfg["RPN_NORMALIZE_TARGETS"]:
        return targets
    means = jnp.asarray(cfg["RPN_NORMALIZE_MEANS"], targets.dtype)
    return (targets - means) / jnp.asarray(cfg["RPN_NORMALIZE_STDS"], targets.dtype)


def anchor_target_layer(layer: ir.Layer, params, bottoms, ctx, cfg=ANCHOR_CFG):
    """The built-in ``rpn.anchor_target_layer.AnchorTargetLayer`` (module docstring) with the
    fork's ``cfg``: tops labels (1, 1, A·H, W), bbox_targets, inside and outside weights
    (1, 4A, H, W)."""
    if len(bottoms) < 3 or len(layer.tops) != 4:
        got = f"got {len(bottoms)} and {len(layer.tops)}"
        raise fail(layer, "AnchorTargetLayer takes bottoms (rpn_cls_score, gt_boxes, im_info"
                          f"[, data]) and gives 4 tops; {got}")  # fmt: skip
    if bottoms[0].shape[0] != 1:
        raise fail(layer, "Only single item batches are supported (AnchorTargetLayer)")
    stride, base, border = _anchor_settings(layer)
    dtype = jnp.float32
    height, width = bottoms[0].shape[-2:]
    a = base.shape[0]
    anchors = jnp.asarray(shifted_anchors(height, width, stride, base), dtype)
    gt, valid = gt_rows(bottoms[1], dtype)
    info = lax.stop_gradient(bottoms[2]).reshape(-1).astype(dtype)
    inside = (
        (anchors[:, 0] >= -border) & (anchors[:, 1] >= -border)
        & (anchors[:, 2] < info[1] + border) & (anchors[:, 3] < info[0] + border)
    )  # fmt: skip
    overlaps = iou(anchors, gt, RCNN)
    labels = anchor_labels(overlaps, inside, valid, ctx.key(), cfg)
    assign = jnp.argmax(jnp.where(valid[None, :], overlaps, -1.0), axis=1)
    targets = jnp.where(inside[:, None], anchor_targets(anchors, gt[assign], cfg), 0.0)
    w_in, w_out = anchor_weights(labels, cfg)

    def spatial(x, c):  # (H·W·A, c) -> (1, A·c, H, W)
        return x.reshape(1, height, width, a * c).transpose(0, 3, 1, 2)

    lab = labels.astype(dtype).reshape(1, height, width, a).transpose(0, 3, 1, 2)
    tops = [lab.reshape(1, 1, a * height, width), spatial(targets, 4)]
    tops += [spatial(w_in.astype(dtype), 4), spatial(w_out.astype(dtype), 4)]
    return [lax.stop_gradient(t.astype(ctx.dtype)) for t in tops]


def rois_valid(rois: jax.Array) -> jax.Array:
    """Rows of a proposal array that are not padding (padding: all zeros)."""
    return jnp.any(rois != 0, axis=1)


def sample_rois(cand, overlaps, valid_gt, key, rois_per_image, fg_per_image, cfg):
    """Indices (rois_per_image,) of the sampled rois (fg first, then bg, then repeats), the
    candidates' gt assignment, and the number of fg among the chosen; py-faster-rcnn's
    ``_sample_rois`` selection."""
    ov = jnp.where(valid_gt[None, :], overlaps, 0.0)
    assign = jnp.argmax(ov, axis=1)
    max_ov = jnp.max(ov, axis=1)
    fg = cand & (max_ov >= cfg["FG_THRESH"])
    bg = cand & (max_ov < cfg["BG_THRESH_HI"]) & (max_ov >= cfg["BG_THRESH_LO"])
    fg_take = jnp.minimum(fg_per_image, jnp.sum(fg))
    bg_take = jnp.minimum(rois_per_image - fg_take, jnp.sum(bg))
    k_fg, k_bg, k_order = jax.random.split(key, 3)
    fg_sel = random_subset(k_fg, fg, fg_take)
    bg_sel = random_subset(k_bg, bg, bg_take)
    u = jax.random.uniform(k_order, fg.shape)
    prio = jnp.where(fg_sel, u, jnp.where(bg_sel, 1.0 + u, 3.0))
    order = jnp.argsort(prio)[:rois_per_image]
    total = jnp.maximum(fg_take + bg_take, 1)
    slots = jnp.arange(rois_per_image) % total
    return order[slots], assign, fg_take, slots < fg_take


def num_classes(layer: ir.Layer) -> int:
    params = parse_param_str(layer.param.python_param.param_str)
    if "num_classes" not in params:
        raise fail(layer, "ProposalTargetLayer's param_str needs 'num_classes'")
    return int(params["num_classes"])


def proposal_target_layer(layer: ir.Layer, params, bottoms, ctx, cfg=PROPOSAL_CFG):
    """The built-in ``rpn.proposal_target_layer.ProposalTargetLayer`` (module docstring): tops
    rois (128, 5), labels (128,), bbox_targets, inside and outside weights (128, 4K)."""
    if len(bottoms) != 2 or len(layer.tops) != 5:
        raise fail(layer, "ProposalTargetLayer takes bottoms (rpn_rois, gt_boxes) and gives 5 "
                          f"tops; got {len(bottoms)} and {len(layer.tops)}")  # fmt: skip
    classes = num_classes(layer)
    dtype = jnp.float32
    rois = lax.stop_gradient(bottoms[0]).reshape(-1, 5).astype(dtype)
    gt, valid = gt_rows(bottoms[1], dtype)
    labels_gt = lax.stop_gradient(bottoms[1]).reshape(-1, 5)[:, 4].astype(jnp.int32)
    per_image = int(cfg["BATCH_SIZE"])
    as_rois = jnp.concatenate([jnp.zeros((gt.shape[0], 1), dtype), gt], axis=1)
    all_rois = jnp.concatenate([rois, as_rois])
    cand = jnp.concatenate([rois_valid(rois), valid])
    pad = max(per_image - all_rois.shape[0], 0)
    all_rois = jnp.pad(all_rois, ((0, pad), (0, 0)))
    cand = jnp.pad(cand, (0, pad))
    overlaps = iou(all_rois[:, 1:], gt, RCNN)
    fg_per = int(np.round(cfg["FG_FRACTION"] * per_image))
    idx, assign, _, is_fg = sample_rois(cand, overlaps, valid, ctx.key(), per_image, fg_per, cfg)
    out_rois = all_rois[idx]
    gt_of = assign[idx]
    labels = jnp.where(is_fg, labels_gt[gt_of], 0)
    t = bbox_transform(out_rois[:, 1:], gt[gt_of])
    t = (t - jnp.asarray(cfg["BBOX_NORMALIZE_MEANS"])) / jnp.asarray(cfg["BBOX_NORMALIZE_STDS"])
    onehot = jax.nn.one_hot(labels, classes, dtype=dtype) * (labels > 0)[:, None]
    targets = (onehot[:, :, None] * t[:, None, :]).reshape(per_image, 4 * classes)
    w_in = (onehot[:, :, None] * jnp.asarray(cfg["BBOX_INSIDE_WEIGHTS"])).reshape(targets.shape)
    tops = [out_rois, labels.astype(dtype), targets, w_in, (w_in > 0).astype(dtype)]
    return [lax.stop_gradient(x.astype(ctx.dtype)) for x in tops]


def unnormalized(params: dict, name: str, stds: np.ndarray, means: np.ndarray,
                 trainer: str) -> dict:  # fmt: skip
    """``params`` with layer ``name``'s weights × stds (per output) and bias × stds + means,
    in float64 rounded to the blob's dtype, as numpy does in ``trainer``'s
    lib/fast_rcnn/train.py ``SolverWrapper.snapshot``."""
    blobs = [np.asarray(b) for b in params[name]]
    if blobs[0].shape[0] != len(stds):
        raise NetError(f"layer '{name}': {blobs[0].shape[0]} outputs, but {trainer}'s "
                       f"snapshot un-normalises {len(stds)} (a multiple of its 4 box "
                       "coordinates)")  # fmt: skip
    shape = (-1,) + (1,) * (blobs[0].ndim - 1)
    out = [(blobs[0].astype(np.float64) * stds.reshape(shape)).astype(blobs[0].dtype)]
    out += [(b.astype(np.float64) * stds + means).astype(b.dtype) for b in blobs[1:2]]
    return {**params, name: out + blobs[2:]}


def bbox_pred_snapshot(params: dict, cfg=PROPOSAL_CFG) -> dict:
    """py-faster-rcnn's lib/fast_rcnn/train.py snapshot (``BBOX_REG`` and
    ``BBOX_NORMALIZE_TARGETS``, both True by config.py's defaults): the layer named
    ``bbox_pred``, found by name as train.py does (``net.params.has_key('bbox_pred')``; a net
    without it is written as trained), gets weights × stds and bias × stds + means, the
    ``BBOX_NORMALIZE_STDS`` / ``MEANS`` that :func:`proposal_target_layer` normalised its
    targets with, tiled over the classes (output c: coordinate c mod 4)."""
    if "bbox_pred" not in params:
        return params
    reps = max(np.asarray(params["bbox_pred"][0]).shape[0] // 4, 1)
    stds = np.tile(np.asarray(cfg["BBOX_NORMALIZE_STDS"], np.float64), reps)
    means = np.tile(np.asarray(cfg["BBOX_NORMALIZE_MEANS"], np.float64), reps)
    return unnormalized(params, "bbox_pred", stds, means, "py-faster-rcnn")


register_builtin_python_layer("rpn.anchor_target_layer", "AnchorTargetLayer", anchor_target_layer)
register_builtin_python_layer("rpn.proposal_target_layer", "ProposalTargetLayer",
                              proposal_target_layer, snapshot=bbox_pred_snapshot)  # fmt: skip
