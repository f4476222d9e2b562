"""Box coding in py-faster-rcnn's convention (+1 widths; the decoded x2/y2 without −1)."""

import numpy as np


def bbox_overlaps(boxes, query):
    """IoU (N, K) with +1 areas."""
    iw = np.minimum(boxes[:, None, 2], query[None, :, 2]) - np.maximum(
        boxes[:, None, 0], query[None, :, 0]) + 1  # fmt: skip
    ih = np.minimum(boxes[:, None, 3], query[None, :, 3]) - np.maximum(
        boxes[:, None, 1], query[None, :, 1]) + 1  # fmt: skip
    area_b = (boxes[:, 2] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 1] + 1)
    area_q = (query[:, 2] - query[:, 0] + 1) * (query[:, 3] - query[:, 1] + 1)
    inter = np.where((iw > 0) & (ih > 0), iw * ih, 0.0)
    return inter / (area_b[:, None] + area_q[None, :] - inter)


def bbox_transform(ex_rois, gt_rois):
    ew, eh = ex_rois[:, 2] - ex_rois[:, 0] + 1.0, ex_rois[:, 3] - ex_rois[:, 1] + 1.0
    gw, gh = gt_rois[:, 2] - gt_rois[:, 0] + 1.0, gt_rois[:, 3] - gt_rois[:, 1] + 1.0
    dx = (gt_rois[:, 0] + 0.5 * gw - ex_rois[:, 0] - 0.5 * ew) / ew
    dy = (gt_rois[:, 1] + 0.5 * gh - ex_rois[:, 1] - 0.5 * eh) / eh
    return np.stack([dx, dy, np.log(gw / ew), np.log(gh / eh)], 1)


def bbox_transform_inv(boxes, deltas):
    """Decoded (N, 4) in the deltas' dtype (the original casts the anchors to it)."""
    boxes = boxes.astype(deltas.dtype, copy=False)
    w = boxes[:, 2] - boxes[:, 0] + 1.0
    h = boxes[:, 3] - boxes[:, 1] + 1.0
    cx, cy = boxes[:, 0] + 0.5 * w, boxes[:, 1] + 0.5 * h
    pcx, pcy = deltas[:, 0] * w + cx, deltas[:, 1] * h + cy
    pw, ph = np.exp(deltas[:, 2]) * w, np.exp(deltas[:, 3]) * h
    return np.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw, pcy + 0.5 * ph], 1)


def clip_boxes(boxes, im_shape):
    """Clip to [0, width − 1] × [0, height − 1]."""
    hi = np.array([im_shape[1] - 1, im_shape[0] - 1] * 2, boxes.dtype)
    return np.maximum(np.minimum(boxes, hi), 0)


def nms(dets, thresh):
    """Greedy NMS over (N, 5) [x1, y1, x2, y2, score] rows already in score order: indices
    kept (IoU ≤ thresh with every kept box, +1 areas)."""
    keep = []
    for i in range(len(dets)):
        if keep:
            iou = bbox_overlaps(dets[i : i + 1, :4], dets[keep, :4])[0]
            if np.any(iou > thresh):
                continue
        keep.append(i)
    return np.asarray(keep, np.int64)
