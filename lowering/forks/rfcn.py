"""py-R-FCN's Python layers as built-ins, in their form ``rfcn`` (frontend/forks/forms.py):
``rpn.proposal_target_layer.ProposalTargetLayer``, ``rpn.proposal_layer.ProposalLayer`` and
``rpn.anchor_target_layer.AnchorTargetLayer`` (py-faster-rcnn's code, lowering/forks/
rcnn_proposal.py and rcnn_targets.py, run with py-R-FCN's config).

RPN target normalisation (YuwenXiong/py-R-FCN@290dba7; rfcn_end2end_ohem.yml sets
``RPN_NORMALIZE_TARGETS: True``, means (0, 0, 0, 0), stds (0.1, 0.1, 0.2, 0.2) by config.py's
defaults; rfcn_end2end.yml leaves it False, and the built-ins follow the OHEM config
throughout): the anchor target layer's ``rpn_bbox_targets`` are (t − means) / stds; the
proposal layer, in TRAIN only (config key ``'TRAIN' if self.phase == 0``), turns
``rpn_bbox_pred`` back into raw deltas (× stds + means) before ``bbox_transform_inv``; and
lib/fast_rcnn/train.py's snapshot writes ``rpn_bbox_pred`` (weights × stds tiled over the
anchors, bias × stds + means) and ``rfcn_bbox`` (× the 2 agnostic classes' stds, each repeated
over the position-sensitive maps) un-normalised, so the .caffemodel tests without
normalisation. The snapshot steps are registered with the layers (:func:`rpn_snapshot`,
:func:`rfcn_bbox_snapshot`) and applied by every solver snapshot of a train net running them
(runtime/train/snapshots.py; the blobs as trained stay in the resume record).

py-R-FCN (YuwenXiong/py-R-FCN lib/rpn/proposal_target_layer.py) ships a layer under the same
module and class name as py-faster-rcnn's, run with experiments/cfgs/rfcn_end2end_ohem.yml.
The frontend gives the layer the form ``"rfcn"`` in a net of the R-FCN dialect
(frontend/forks/forms.py); there these versions run. The proposal target layer reproduces:

* ``BATCH_SIZE: -1``: no sampling — every candidate (each proposal and each gt box) is kept;
  with ``BG_THRESH_LO: 0.0`` every candidate is fg (max IoU ≥ ``FG_THRESH`` 0.5, label of its
  gt) or bg (label 0). Order: the fg in random order, then the bg in random order (the
  original's ``npr.choice`` of all of them without replacement).
* ``AGONISTIC: True``: class-agnostic regression — a fg roi's targets and inside weights go
  to slot 1 (columns 4..8) of the 4·``num_classes`` columns whatever its class (the prototxt
  sets ``num_classes`` 2); outside weights are ``inside > 0``.
* ``BBOX_NORMALIZE_TARGETS_PRECOMPUTED``: targets normalised by means 0 and stds
  (0.1, 0.1, 0.2, 0.2).
* 4-D tops (py-R-FCN's "modified by ywxiong" reshapes): rois (R, 5, 1, 1), labels
  (R, 1, 1, 1), targets and weights (R, 4K, 1, 1).

Fixed shapes: R is the proposal rows plus the gt rows (300 + G with the R-FCN proposal layer in
TRAIN). py-R-FCN's R is the number of real candidates; the rows after them here are padding:
rois all zeros, label −1, targets and weights 0. In the R-FCN train net a padding row adds
nothing: SoftmaxWithLossOHEM gives a negative label loss 0 (see lowering/forks/rfcn_ohem.py), so its
per-roi loss is 0 and BoxAnnotatorOHEM ranks it after every real roi of equal loss; if it is
kept, its label −1 is the final losses' ``ignore_label`` and its bbox weights are 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.lowering.boxes.coders import bbox_transform
from caffe2jax.lowering.boxes.iou import RCNN, iou
from caffe2jax.lowering.forks.rcnn_proposal import proposal_layer
from caffe2jax.lowering.forks.rcnn_targets import (
    ANCHOR_CFG,
    PROPOSAL_CFG,
    anchor_target_layer,
    gt_rows,
    num_classes,
    rois_valid,
    unnormalized,
)
from caffe2jax.lowering.python_layer import register_builtin_python_layer
from caffe2jax.lowering.util import fail

#: cfg.TRAIN with rfcn_end2end_ohem.yml (BATCH_SIZE −1 and AGONISTIC are built in).
RFCN_CFG = dict(PROPOSAL_CFG, BG_THRESH_LO=0.0)


def rfcn_order(fg: jax.Array, bg: jax.Array, key: jax.Array) -> jax.Array:
    """Indices of every row: the fg in random order, the bg in random order, then the rest."""
    u = jax.random.uniform(key, fg.shape)
    return jnp.argsort(jnp.where(fg, u, jnp.where(bg, 1.0 + u, 3.0 + u)))


def rfcn_proposal_target_layer(layer: ir.Layer, params, bottoms, ctx, cfg=RFCN_CFG):
    """py-R-FCN's ProposalTargetLayer (module docstring): tops rois (R, 5, 1, 1), labels
    (R, 1, 1, 1), bbox_targets, inside and outside weights (R, 4K, 1, 1)."""
    if len(bottoms) != 2 or len(layer.tops) != 5:
        raise fail(layer, "ProposalTargetLayer takes bottoms (rpn_rois, gt_boxes) and gives 5 "
                          f"tops; got {len(bottoms)} and {len(layer.tops)}")  # fmt: skip
    classes = num_classes(layer)
    if classes < 2:
        raise fail(layer, f"num_classes {classes}: py-R-FCN's class-agnostic targets need 2 "
                          "(background and object)")  # fmt: skip
    dtype = jnp.float32
    rois = lax.stop_gradient(bottoms[0]).reshape(-1, 5).astype(dtype)
    gt, valid = gt_rows(bottoms[1], dtype)
    labels_gt = lax.stop_gradient(bottoms[1]).reshape(-1, 5)[:, 4].astype(jnp.int32)
    as_rois = jnp.concatenate([jnp.zeros((gt.shape[0], 1), dtype), gt], axis=1)
    all_rois = jnp.concatenate([rois, as_rois])
    cand = jnp.concatenate([rois_valid(rois), valid])
    ov = jnp.where(valid[None, :], iou(all_rois[:, 1:], gt, RCNN), 0.0)
    assign, max_ov = jnp.argmax(ov, axis=1), jnp.max(ov, axis=1)
    fg = cand & (max_ov >= cfg["FG_THRESH"])
    bg = cand & (max_ov < cfg["BG_THRESH_HI"]) & (max_ov >= cfg["BG_THRESH_LO"])
    order = rfcn_order(fg, bg, ctx.key())
    is_fg, real = fg[order], (fg | bg)[order]
    out_rois = jnp.where(real[:, None], all_rois[order], 0.0)
    gt_of = assign[order]
    labels = jnp.where(is_fg, labels_gt[gt_of], jnp.where(real, 0, -1))
    t = bbox_transform(out_rois[:, 1:], gt[gt_of])
    t = (t - jnp.asarray(cfg["BBOX_NORMALIZE_MEANS"])) / jnp.asarray(cfg["BBOX_NORMALIZE_STDS"])
    slot = (jnp.arange(classes) == 1)[None, :, None] & is_fg[:, None, None]
    n = out_rois.shape[0]
    targets = jnp.where(slot, t[:, None, :], 0.0).reshape(n, 4 * classes)
    w_in = jnp.where(slot, jnp.asarray(cfg["BBOX_INSIDE_WEIGHTS"]), 0.0).reshape(n, 4 * classes)
    tops = [out_rois, labels.astype(dtype), targets, w_in, (w_in > 0).astype(dtype)]
    return [lax.stop_gradient(x.reshape(n, -1, 1, 1).astype(ctx.dtype)) for x in tops]


#: py-faster-rcnn's ProposalLayer config by phase run with py-R-FCN's rfcn_end2end_ohem.yml
#: (RPN_PRE/POST_NMS_TOP_N 6000 / 300 in TRAIN): pre-NMS top N, post-NMS top N, NMS
#: threshold, min size.
RFCN_CONFIG = {ir.TEST: (6000, 300, 0.7, 16), ir.TRAIN: (6000, 300, 0.7, 16)}

#: cfg.TRAIN with rfcn_end2end_ohem.yml for the anchor target layer: ``RPN_NORMALIZE_TARGETS``
#: True (py-faster-rcnn's default False), means 0 and stds (0.1, 0.1, 0.2, 0.2) by default.
RFCN_ANCHOR_CFG = dict(ANCHOR_CFG, RPN_NORMALIZE_TARGETS=True)


def rfcn_anchor_target_layer(layer: ir.Layer, params, bottoms, ctx):
    """py-R-FCN's AnchorTargetLayer: py-faster-rcnn's with its targets normalised
    ((t − means) / stds, :data:`RFCN_ANCHOR_CFG`)."""
    return anchor_target_layer(layer, params, bottoms, ctx, cfg=RFCN_ANCHOR_CFG)


def rpn_unnormalized(deltas: jax.Array, cfg=RFCN_ANCHOR_CFG) -> jax.Array:
    """rpn_bbox_pred (1, 4A, H, W) × stds + means, channel c the coordinate c mod 4 (py-R-FCN's
    proposal_layer.py in TRAIN with RPN_NORMALIZE_TARGETS, on the (K·A, 4) deltas; here in the
    net's dtype, there float32 × float64 rounded to float32: within 1 ulp)."""
    c = deltas.shape[1]
    if c % 4:
        return deltas  # proposal_layer names the channel count it needs
    stds = np.tile(cfg["RPN_NORMALIZE_STDS"], c // 4).reshape(1, c, 1, 1)
    means = np.tile(cfg["RPN_NORMALIZE_MEANS"], c // 4).reshape(1, c, 1, 1)
    return deltas * jnp.asarray(stds, deltas.dtype) + jnp.asarray(means, deltas.dtype)


def rfcn_proposal_layer(layer: ir.Layer, params, bottoms, ctx):
    """py-R-FCN's ProposalLayer: py-faster-rcnn's with :data:`RFCN_CONFIG`; in TRAIN (the
    phase's config key 'TRAIN', as py-R-FCN reads ``self.phase``) the deltas un-normalised
    first, since the RPN learned normalised targets (:func:`rpn_unnormalized`)."""
    if ctx.phase == ir.TRAIN and RFCN_ANCHOR_CFG["RPN_NORMALIZE_TARGETS"] and len(bottoms) > 1:
        bottoms = [bottoms[0], rpn_unnormalized(bottoms[1]), *bottoms[2:]]
    return proposal_layer(layer, params, bottoms, ctx, config=RFCN_CONFIG)


def rpn_snapshot(params: dict, cfg=RFCN_ANCHOR_CFG) -> dict:
    """py-R-FCN train.py's snapshot of ``rpn_bbox_pred`` (when the net has it): stds and
    means tiled over its A anchors (output c: coordinate c mod 4)."""
    if "rpn_bbox_pred" not in params:
        return params
    n = np.asarray(params["rpn_bbox_pred"][0]).shape[0]
    reps = max(n // 4, 1)
    stds = np.tile(np.asarray(cfg["RPN_NORMALIZE_STDS"], np.float64), reps)
    means = np.tile(np.asarray(cfg["RPN_NORMALIZE_MEANS"], np.float64), reps)
    return unnormalized(params, "rpn_bbox_pred", stds, means, "py-R-FCN")


def rfcn_bbox_snapshot(params: dict, cfg=RFCN_CFG) -> dict:
    """py-R-FCN train.py's snapshot of ``rfcn_bbox`` (when the net has it): the 2 agnostic
    classes' 8 stds and means, each repeated over the position-sensitive maps (output c:
    value c // (n / 8), numpy's ``repeat``)."""
    if "rfcn_bbox" not in params:
        return params
    n = np.asarray(params["rfcn_bbox"][0]).shape[0]
    reps = max(n // 8, 1)
    stds = np.repeat(np.tile(np.asarray(cfg["BBOX_NORMALIZE_STDS"], np.float64), 2), reps)
    means = np.repeat(np.tile(np.asarray(cfg["BBOX_NORMALIZE_MEANS"], np.float64), 2), reps)
    return unnormalized(params, "rfcn_bbox", stds, means, "py-R-FCN")


register_builtin_python_layer("rpn.proposal_layer", "ProposalLayer", rfcn_proposal_layer,
                              form="rfcn")  # fmt: skip
register_builtin_python_layer("rpn.anchor_target_layer", "AnchorTargetLayer",
                              rfcn_anchor_target_layer, form="rfcn",
                              snapshot=rpn_snapshot)  # fmt: skip
register_builtin_python_layer("rpn.proposal_target_layer", "ProposalTargetLayer",
                              rfcn_proposal_target_layer, form="rfcn",
                              snapshot=rfcn_bbox_snapshot)  # fmt: skip
