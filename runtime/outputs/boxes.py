"""Box maths on the host, in numpy: the one place it is written outside the compiled graph.

Boxes are ``[x1, y1, x2, y2]`` rows. Caffe's code measures them two ways, chosen here by
``offset``:

* ``offset=0``: normalized coordinates (SSD's bbox_util.cpp ``BBoxSize`` / ``JaccardOverlap``
  with ``normalized = true``): a side is ``x2 − x1``;
* ``offset=1``: pixel boxes with inclusive corners (py-faster-rcnn's ``bbox_overlaps`` and
  ``py_cpu_nms``, VOC's devkit, SSD with ``normalized = false``): a side is ``x2 − x1 + 1``.

A box with ``x2 < x1`` or ``y2 < y1`` has area 0 (``BBoxSize``); boxes that only touch share
no area. :func:`iou` is every overlap of the host side: SSD's samplers and emit constraints,
py-faster-rcnn's test-time NMS (:func:`nms`) and the VOC evaluation
(:mod:`.average_precision`). The same maths compiled into nets lives in ``lowering``.
"""

from __future__ import annotations

import numpy as np


def areas(boxes: np.ndarray, offset: float = 0.0) -> np.ndarray:
    """``BBoxSize`` of each row: ``(x2 − x1 + offset) · (y2 − y1 + offset)``, 0 when inverted."""
    boxes = np.asarray(boxes)
    x1, y1, x2, y2 = (boxes[..., i] for i in range(4))
    size = (x2 - x1 + offset) * (y2 - y1 + offset)
    return np.where((x2 < x1) | (y2 < y1), np.zeros_like(size), size)


def intersections(a: np.ndarray, b: np.ndarray, offset: float = 0.0) -> np.ndarray:
    """(N, M) areas of ``IntersectBBox`` of every row of ``a`` (N, 4) with every row of
    ``b`` (M, 4): 0 where the boxes are apart or only touch."""
    a, b = np.asarray(a)[:, None, :], np.asarray(b)[None, :, :]
    iw = np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]) + offset
    ih = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]) + offset
    return np.where((iw > 0) & (ih > 0), iw * ih, np.zeros_like(iw))


def iou(a: np.ndarray, b: np.ndarray, offset: float = 0.0) -> np.ndarray:
    """(N, M) intersection over union (``JaccardOverlap``, ``bbox_overlaps``) of every row of
    ``a`` with every row of ``b``, in their dtype: ``inter / (area_a + area_b − inter)``, 0
    where they share no area."""
    inter = intersections(a, b, offset)
    union = areas(a, offset)[:, None] + areas(b, offset)[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(inter > 0, inter / union, np.zeros_like(inter))


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[int]:
    """py-faster-rcnn's ``py_cpu_nms`` on pixel boxes: the indices kept, by score
    descending (ties in input order); a box goes when its IoU with a kept one is above
    ``threshold``."""
    boxes = np.asarray(boxes)
    order = np.argsort(-np.asarray(scores), kind="stable")
    keep = []
    while order.size:
        i, order = order[0], order[1:]
        keep.append(int(i))
        order = order[iou(boxes[i : i + 1], boxes[order], offset=1)[0] <= threshold]
    return keep


def decode_deltas(boxes: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """py-faster-rcnn's ``bbox_transform_inv``: (R, 4) pixel boxes and (R, 4k) deltas
    (dx, dy, dw, dh per class) to (R, 4k) boxes, centres at ``x1 + w/2`` with ``w = x2 − x1
    + 1`` and corners at ``centre ± w′/2`` (no −1, as the fork)."""
    w = (boxes[:, 2] - boxes[:, 0] + 1.0)[:, None]
    h = (boxes[:, 3] - boxes[:, 1] + 1.0)[:, None]
    cx, cy = boxes[:, :1] + 0.5 * w, boxes[:, 1:2] + 0.5 * h
    dx, dy, dw, dh = (deltas[:, i::4] for i in range(4))
    pcx, pcy = dx * w + cx, dy * h + cy
    pw, ph = np.exp(dw) * w, np.exp(dh) * h
    out = np.empty_like(deltas)
    out[:, 0::4], out[:, 1::4] = pcx - 0.5 * pw, pcy - 0.5 * ph
    out[:, 2::4], out[:, 3::4] = pcx + 0.5 * pw, pcy + 0.5 * ph
    return out
