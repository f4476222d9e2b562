"""Loops transcribed from SSD-derived forks' C++ (numpy), shared by the tests of
lowering/forks/refinedet.py and lowering/forks/textboxes.py: DecodeBBox (CENTER_SIZE),
JaccardOverlap, ApplyNMSFast and DetectionOutputLayer::Forward_cpu's per-image selection,
as weiliu89's SSD and its copies in RefineDet@52b6fe2 and TextBoxes_plusplus@39d4898 have them."""

from __future__ import annotations

import numpy as np

f32 = np.float32


def decode_center_size(prior, var, loc):
    """bbox_util.cpp DecodeBBox, CENTER_SIZE, variances in the prior: one box."""
    pw, ph = f32(prior[2] - prior[0]), f32(prior[3] - prior[1])
    pcx, pcy = f32((prior[0] + prior[2]) / 2.0), f32((prior[1] + prior[3]) / 2.0)
    cx = f32(var[0] * loc[0] * pw + pcx)
    cy = f32(var[1] * loc[1] * ph + pcy)
    w = f32(np.exp(f32(var[2] * loc[2])) * pw)
    h = f32(np.exp(f32(var[3] * loc[3])) * ph)
    return np.array([cx - w / 2.0, cy - h / 2.0, cx + w / 2.0, cy + h / 2.0], np.float32)


def jaccard(a, b) -> float:
    """JaccardOverlap (normalized boxes): 0 when disjoint."""
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return 0.0
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    inter = iw * ih
    size = lambda r: (r[2] - r[0]) * (r[3] - r[1])  # noqa: E731
    return inter / (size(a) + size(b) - inter)


def nms_fast(boxes, scores, threshold, nms, top_k):
    """ApplyNMSFast (eta 1): scores > threshold, stable descending, top_k, greedy IoU <= nms."""
    cand = [i for i in range(len(scores)) if scores[i] > threshold]
    cand = sorted(cand, key=lambda i: -scores[i])[:top_k]
    kept: list[int] = []
    for i in cand:
        if all(jaccard(boxes[i], boxes[k]) <= nms for k in kept):
            kept.append(i)
    return kept


def detections(boxes, scores, threshold, nms, top_k, keep_top_k, background=0):
    """Forward_cpu's selection for a batch: boxes (N, P, 4 + E) shared, scores (N, P, C).
    Rows [image, label, score, box and extra columns] by image, label, score descending;
    the fork's "no detection" rows when nothing is kept."""
    rows = []
    for i in range(len(boxes)):
        per = {}
        for c in range(scores.shape[2]):
            if c != background:
                per[c] = nms_fast(boxes[i, :, :4], scores[i, :, c], threshold, nms, top_k)
        pairs = [(scores[i, k, c], c, k) for c, ks in per.items() for k in ks]
        if -1 < keep_top_k < len(pairs):
            pairs = sorted(pairs, key=lambda t: -t[0])[:keep_top_k]
        for c in sorted({c for _, c, _ in pairs}):
            for s, _, k in sorted([p for p in pairs if p[1] == c], key=lambda t: -t[0]):
                rows.append([i, c, s, *boxes[i, k]])
    if not rows:
        width = 3 + boxes.shape[2]
        return np.array([[i] + [-1] * (width - 1) for i in range(len(boxes))], np.float32)
    return np.array(rows, np.float32)


def kept_rows(top) -> np.ndarray:
    """The rows of a caffe2jax DetectionOutput top that Caffe would have written."""
    rows = np.asarray(top)[0, 0]
    return rows[rows[:, 0] >= 0]  # padding rows are all -1, the "no detection" ones [i, -1..]
