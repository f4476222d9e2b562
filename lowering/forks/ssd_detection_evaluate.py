"""SSD's DetectionEvaluate (weiliu89/caffe detection_evaluate_layer.cpp), with a static top.

Bottoms: detections (1, 1, D, 7) rows [image, label, score, xmin, ymin, xmax, ymax] (the
padded buffer of lowering/forks/ssd_detection_output.py: rows with label −1 are padding or the "no
detection" rows) and the ground truth (1, 1, G, 8) (lowering/boxes/matching.py; reading stops at
the first item −1 row, as the fork's GetGroundTruth for evaluation does).

Top (1, 1, C' + D, 5), C' = num_classes − 1 (num_classes when background_label_id is −1):

* C' header rows [−1, c, num_pos(c), −1, −1], c ascending (difficult gts not counted unless
  ``evaluate_difficult_gt``);
* one row [image, label, score, tp, fp] per detection, by image, then label ascending, then
  score descending — greedily, each takes the same-image same-label gt of highest IoU
  (first on ties); IoU ≥ ``overlap_threshold`` on an unused gt: tp; on a used one: fp (a
  duplicate); below: fp; matched to a difficult gt while not ``evaluate_difficult_gt``:
  tp = fp = 0 (the solver skips it);
* then the padding: one row [−2, −1, 0, 0, 0] per detection row that was not a detection. Caffe
  sizes its top to the valid detections; a compiled program cannot, so the padding has tp =
  fp = 0 and item −2: the fork's TestDetection skips rows with tp = fp = 0, and item −1 would
  read as a header.

The C++ sorts each (image, label) group with std::sort (unstable); equal scores here keep the
detection rows' order. With ``name_size_file`` (and ``resize_param``) the boxes are compared in
pixels of each image's listed size: lowering/forks/ssd_pixels.py.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from caffe2jax.lowering.boxes.iou import SSD, SSD_PIXELS, iou
from caffe2jax.lowering.boxes.matching import ground_truth
from caffe2jax.lowering.forks.ssd_pixels import (
    image_ranks,
    name_sizes,
    output_bbox,
    resize_settings,
)
from caffe2jax.lowering.limits import INT_MAX
from caffe2jax.lowering.registry import ParamDecl, register
from caffe2jax.lowering.util import fail


def _settings(layer) -> dict:
    p = layer.param.detection_evaluate_param
    if not p.HasField("num_classes"):
        raise fail(layer, "must provide num_classes")
    if not p.overlap_threshold > 0:  # NaN fails too
        raise fail(layer, "overlap_threshold must be positive")
    if p.num_classes * 5 > INT_MAX:  # the top's C' rows of 5: refused before anything is built
        raise fail(layer, f"num_classes {p.num_classes} must be at most {INT_MAX // 5} "
                          "(5 values per class in the top, within INT_MAX)")  # fmt: skip
    sizes = name_sizes(layer, p.name_size_file) if p.HasField("name_size_file") else None
    return dict(classes=p.num_classes, background=p.background_label_id,
                threshold=p.overlap_threshold, difficult=p.evaluate_difficult_gt, sizes=sizes,
                resize=resize_settings(layer))  # fmt: skip


def _headers(gt, s: dict, dtype):
    """The per-class rows [−1, c, num_pos, −1, −1]."""
    counted = gt["valid"] & (s["difficult"] | ~gt["difficult"])
    # traced, never a host list: C' can be large, and shape inference then allocates nothing
    labels = jnp.arange(s["classes"], dtype=jnp.int32)
    if 0 <= s["background"] < s["classes"]:
        labels = jnp.concatenate([labels[: s["background"]], labels[s["background"] + 1 :]])
    num_pos = jnp.sum(counted[None, :] & (gt["label"][None, :] == labels[:, None]), axis=1)
    minus = jnp.full(labels.shape, -1.0, dtype)
    return jnp.stack([minus, labels.astype(dtype), num_pos.astype(dtype), minus, minus], 1)


def _ordered(det):
    """Detection rows sorted (image, label, score descending), invalid rows last."""
    item, label = det[:, 0].astype(jnp.int32), det[:, 1].astype(jnp.int32)
    valid = (item != -1) & (label != -1)
    big = jnp.iinfo(jnp.int32).max
    order = jnp.lexsort((-det[:, 2], jnp.where(valid, label, big), jnp.where(valid, item, big)))
    return det[order], valid[order]


def _pixel_iou(det, gt, s: dict, count):
    """IoU of the rows with the gts in pixels of their images' sizes, and the new count_."""
    sizes = jnp.asarray(s["sizes"])
    n = sizes.shape[0]
    items = det[:, 0].astype(jnp.int32)
    det_rank, present = image_ranks(items, items)
    gt_rank, _ = image_ranks(items, gt["item"])
    start = count.astype(jnp.int32)
    a, size_a = output_bbox(det[:, 3:7], sizes[(start + det_rank) % n], s["resize"])
    b, size_b = output_bbox(gt["boxes"], sizes[(start + gt_rank) % n], s["resize"])
    return iou(a, b, SSD_PIXELS, sizes=(size_a, size_b)), (start + present) % n


def _evaluate(det, valid, gt, s: dict, overlaps):
    """(tp, fp) per sorted detection row: the greedy scan with the used gts as carry."""
    same = (det[:, 0:1].astype(jnp.int32) == gt["item"][None, :]) & gt["valid"][None, :]
    same = same & (det[:, 1:2].astype(jnp.int32) == gt["label"][None, :])
    scores = jnp.where(same, overlaps, -1.0)
    jmax = jnp.argmax(scores, axis=1)
    best = jnp.max(scores, axis=1)
    hit = best >= s["threshold"]
    counts = s["difficult"] | ~gt["difficult"][jmax]

    def step(used, x):
        j, hit, counts, ok = x
        fresh = ~used[j]
        tp = ok & hit & counts & fresh
        fp = ok & ((hit & counts & ~fresh) | ~hit)
        used = jnp.where(tp, used.at[j].set(True), used)
        return used, (tp, fp)

    used0 = jnp.zeros(gt["item"].shape, bool)
    _, (tp, fp) = lax.scan(step, used0, (jmax, hit, counts, valid))
    return tp, fp


@register("DetectionEvaluate", counts=(2, 2, 1, 1), no_force_backward=(0, 1))
def detection_evaluate(layer, params, bottoms, ctx):
    """The layer's top; with ``name_size_file`` also its new image counter (carry)."""
    s = _settings(layer)
    if s["sizes"] is None:
        return _detection_evaluate(layer, bottoms, s)[0]
    tops, count = _detection_evaluate(layer, bottoms, s, ctx.carry[0].reshape(()))
    return tops, [count.astype(ctx.carry[0].dtype).reshape(1)]


@detection_evaluate.carry_shapes
def _(layer, bottom_shapes):
    """``count_``: the next name_size_file line (lowering/forks/ssd_pixels.py)."""
    p = layer.param.detection_evaluate_param
    return [ParamDecl((1,))] if p.HasField("name_size_file") else []


def _detection_evaluate(layer, bottoms, s: dict, count=None):
    """DetectionEvaluateLayer::Forward_cpu with a static, padded top (module docstring)."""
    det, label = (lax.stop_gradient(b) for b in bottoms)
    if det.shape[-1] != 7 or det.size // 7 != det.shape[-2] or det.ndim != 4:
        raise fail(layer, f"detections must be (1, 1, D, 7), got {list(det.shape)}")
    if label.shape[-1] != 8 or label.ndim != 4 or label.size // 8 != label.shape[-2]:
        raise fail(layer, f"label must be (1, 1, G, 8), got {list(label.shape)}")
    gt = ground_truth(label)
    gt["valid"] = jnp.cumprod(gt["present"].astype(jnp.int32)).astype(bool)
    rows, valid = _ordered(det.reshape(-1, 7))
    if count is None:
        overlaps = iou(rows[:, 3:7], gt["boxes"], SSD)
    else:
        overlaps, count = _pixel_iou(rows, gt, s, count)
    tp, fp = _evaluate(rows, valid, gt, s, overlaps)
    body = jnp.stack([rows[:, 0], rows[:, 1], rows[:, 2], tp.astype(det.dtype),
                      fp.astype(det.dtype)], axis=1)  # fmt: skip
    pad = jnp.asarray([-2.0, -1.0, 0.0, 0.0, 0.0], det.dtype)
    body = jnp.where(valid[:, None], body, pad)
    out = jnp.concatenate([_headers(gt, s, det.dtype), body], axis=0)
    return [out.reshape(1, 1, -1, 5)], count
