"""PVANet's C++ ``Proposal`` layer (sanghoon/caffe@6068dd0, branch dev_pvanet, the Caffe that
sanghoon/pva-faster-rcnn pins: src/caffe/layers/proposal_layer.cpp, src/caffe/util/nms.cpp;
``LayerParameter.proposal_param = 8266713``, ``ProposalParameter``). OpenCV's Proposal layer
reads the same message.

* ``proposal_param``: ``feat_stride`` (16), ``base_size`` (16), ``min_size`` (16), ``ratio``
  and ``scale`` (repeated, no default: the fork indexes element 0 of each, so both are
  required here), ``pre_nms_topn`` (6000), ``post_nms_topn`` (300), ``nms_thresh`` (0.7);
* anchors (generate_anchors): for each ratio, for each scale: ``ratio_w = ROUND(sqrt(base² /
  ratio))``, ``ratio_h = ROUND(ratio_w · ratio)`` with ``ROUND(x) = (int)(x + 0.5)`` (halves up,
  where py-faster-rcnn's numpy rounds them to even), corners ``c ∓ 0.5·(ratio_w·scale − 1)``
  around ``c = 0.5·(base − 1)``, in float;
* bottoms: scores (1, 2A, H, W), the foreground half read (channels A..2A), deltas (1, 4A, H,
  W), im_info (1, ≥4) [height, width, scale_h, scale_w] (PVANet feeds 6 values; the fork reads
  four, so fewer are refused); one image only (the fork's CHECK);
* enumerate_proposals: at each row, column, anchor (anchors inner) the anchor shifted by
  (w, h)·feat_stride, decoded (+1 widths, ``exp(dw)·w``, corners ``ctr ∓ 0.5·pred_w``),
  clipped to [0, W−1]×[0, H−1]; a box narrower than ``min_size·scale_w`` or shorter than
  ``min_size·scale_h`` is **kept with score 0** (the fork multiplies the score by the test;
  py-faster-rcnn's Python layer drops such boxes);
* sort_box: descending score (a quicksort: the fork's order of equal scores is unspecified;
  here ties keep anchor order), the first ``min(pre_nms_topn, count)`` enter nms_cpu: greedy,
  +1 areas, boxes not touching (strict corner tests) overlap 0, a box whose IoU with a kept
  one is > ``nms_thresh`` dropped, stop at ``post_nms_topn``.

Tops: rois (R, 5) [0, x1, y1, x2, y2] and optionally scores (R,) — one axis, as the fork
shapes it. The fork's R is the number kept; here R is the static ``min(post_nms_topn,
pre_nms_topn, count)`` and rows past the kept ones are zeros (as OpenCV's Proposal pads them).
The fork has no Backward_cpu: gradients stop here.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.lowering.boxes.coders import bbox_transform_inv
from caffe2jax.lowering.boxes.iou import Convention, iou_row
from caffe2jax.lowering.boxes.nms import compact, greedy_keep_rows, ranked
from caffe2jax.lowering.registry import register
from caffe2jax.lowering.util import fail

#: nms.cpp's iou(): +1 sides, 0 for boxes whose corners do not reach (no division then),
#: otherwise max(0, iw)·max(0, ih) / (area_a + area_b − inter).
PVANET_NMS = Convention(plus_one=True, disjoint="zero", gated=False)


def pvanet_anchors(base_size: int, ratios, scales) -> np.ndarray:
    """proposal_layer.cpp's generate_anchors in float32: (len(ratios)·len(scales), 4),
    ratio-major, ``ROUND`` halves up (module docstring)."""
    f = np.float32
    base_area, center = f(base_size * base_size), f(0.5) * f(base_size - 1)
    out = []
    for ratio in ratios:
        ratio_w = f(np.floor(np.sqrt(base_area / f(ratio)) + f(0.5)))
        ratio_h = f(np.floor(ratio_w * f(ratio) + f(0.5)))
        for scale in scales:
            half_w = f(0.5) * (ratio_w * f(scale) - f(1))
            half_h = f(0.5) * (ratio_h * f(scale) - f(1))
            out.append([center - half_w, center - half_h, center + half_w, center + half_h])
    return np.asarray(out, np.float32).reshape(-1, 4)


def _settings(layer: ir.Layer, scores, deltas, im_info) -> np.ndarray:
    """The anchors of ``proposal_param``, once the bottoms are checked against them."""
    p = layer.param.proposal_param
    if not p.ratio or not p.scale:
        got = f"got {len(p.ratio)} and {len(p.scale)}"
        raise fail(layer, "proposal_param needs at least one ratio and one scale (the fork "
                          f"reads ratio[0] and scale[0]), {got}")  # fmt: skip
    anchors = pvanet_anchors(p.base_size, p.ratio, p.scale)
    a = anchors.shape[0]
    if scores.ndim != 4 or scores.shape[0] != 1:
        raise fail(layer, f"Only single item batches are supported: scores {list(scores.shape)}")
    if scores.shape[1] != 2 * a or deltas.shape[1:] != (4 * a, *scores.shape[2:]):
        raise fail(layer, f"bottoms need (1, 2·A = {2 * a}, H, W) scores and (1, 4·A = {4 * a}, "
                          f"H, W) deltas for A = {len(p.ratio)} ratios × {len(p.scale)} scales, "
                          f"got {list(scores.shape)} and {list(deltas.shape)}")  # fmt: skip
    if im_info.size < 4:
        raise fail(layer, "im_info needs [height, width, scale_h, scale_w] (the fork reads 4 "
                          f"values), got shape {list(im_info.shape)}")  # fmt: skip
    return anchors


def _enumerate(scores, deltas, info, stride: int, min_size: int, anchors: np.ndarray):
    """enumerate_proposals_cpu: (H·W·A, 4) clipped boxes and their scores (0 where too small)."""
    a = anchors.shape[0]
    height, width = scores.shape[-2:]
    sx, sy = np.meshgrid(np.arange(width, dtype=np.float32) * np.float32(stride),
                         np.arange(height, dtype=np.float32) * np.float32(stride))  # fmt: skip
    shifts = np.stack([sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel()], axis=1)
    boxes = (anchors[None] + shifts[:, None]).reshape(-1, 4)
    fg = scores[0, a:].transpose(1, 2, 0).reshape(-1)
    d = deltas[0].transpose(1, 2, 0).reshape(-1, 4)
    out = bbox_transform_inv(jnp.asarray(boxes, d.dtype), d)
    hi = jnp.stack([info[1] - 1, info[0] - 1, info[1] - 1, info[0] - 1]).astype(d.dtype)
    out = jnp.maximum(0, jnp.minimum(out, hi))
    ok = (out[:, 2] - out[:, 0] + 1 >= min_size * info[3]) & (
        out[:, 3] - out[:, 1] + 1 >= min_size * info[2]
    )
    return out, jnp.where(ok, fg, jnp.zeros_like(fg))


@register("Proposal", counts=(3, 3, 1, 2))
def proposal(layer: ir.Layer, params, bottoms, ctx):
    """PVANet's ProposalLayer::Forward_cpu (module docstring): rois and scores."""
    scores, deltas, im_info = (lax.stop_gradient(b) for b in bottoms)
    anchors = _settings(layer, scores, deltas, im_info)
    p = layer.param.proposal_param
    info = im_info.reshape(-1)
    boxes, score = _enumerate(scores, deltas, info, p.feat_stride, p.min_size, anchors)
    pre = min(int(p.pre_nms_topn), score.shape[0])
    order, valid = ranked(score, jnp.ones_like(score, bool), pre)
    cand = boxes[order]
    keep = greedy_keep_rows(cand, valid, float(p.nms_thresh), iou_row(PVANET_NMS))
    size = min(int(p.post_nms_topn), pre)
    rows = jnp.concatenate([jnp.zeros_like(cand[:, :1]), cand, score[order][:, None]], axis=1)
    out = compact(rows, keep, size, jnp.zeros((6,), rows.dtype))
    return [out[:, :5], out[:, 5]][: len(layer.tops)]
