"""Average precision, once: SSD's ``ComputeAP`` (weiliu89/caffe util/bbox_util.cpp) and the
VOC evaluation of detections in pixels.

The fork's three ``ap_version``s, in float32 as the fork computes them:

* ``"11point"``: VOC2007's 11-point AP, the mean over recall thresholds 0, 0.1, … 1 of the
  best precision at that recall or above;
* ``"MaxIntegral"``: VOC2010+'s (and ILSVRC's) area under the precision curve made
  monotone (each precision the best at that recall or above);
* ``"Integral"``: the area under the raw precision curve.

:func:`class_ap` scores pixel-box detections of one class against ground truth as VOC's
devkit does: by score, each detection matched to the unused ground truth box it overlaps
most at IoU ≥ 0.5 (+1 pixel sides), then :func:`average_precision` of the curve.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from caffe2jax.runtime.outputs.boxes import iou

AP_VERSIONS = ("11point", "MaxIntegral", "Integral")
_F = np.float32


def _cumsum(pairs: Sequence[tuple[float, int]]) -> np.ndarray:
    """``CumSum``: the flags cumulated in stable score-descending order."""
    order = sorted(range(len(pairs)), key=lambda i: -pairs[i][0])
    return np.cumsum([pairs[i][1] for i in order])


def precision_recall(
    tp: Sequence[tuple[float, int]], fp: Sequence[tuple[float, int]], num_pos: int
) -> tuple[list, list]:
    """The fork's precision and recall curves (float32) from (score, flag) pairs."""
    tp_sum, fp_sum = _cumsum(tp), _cumsum(fp)
    prec = [_F(_F(t) / _F(t + f)) for t, f in zip(tp_sum, fp_sum)]
    rec = [_F(_F(t) / _F(num_pos)) for t in tp_sum]
    return prec, rec


def eleven_point(prec: Sequence, rec: Sequence) -> float:
    """VOC2007's 11-point AP, transcribing the fork's loop (and its carry-down of maxima). The
    fork compares each float recall with the double ``j / 10.``: a recall of float32 0.9
    (0.89999998) is below 0.9 (in float32 they would be equal)."""
    max_precs = [_F(0)] * 11
    start = len(prec) - 1
    for j in range(10, -1, -1):
        for i in range(start, -1, -1):
            if float(rec[i]) < j / 10.0:
                start = i
                if j > 0:
                    max_precs[j - 1] = max_precs[j]
                break
            max_precs[j] = max(max_precs[j], prec[i])
    ap = _F(0)
    for j in range(10, -1, -1):
        ap = _F(ap + max_precs[j] / _F(11))
    return float(ap)


def max_integral(prec: Sequence, rec: Sequence) -> float:
    """VOC2010+'s AP: the area under the monotone precision curve."""
    ap = _F(0)
    cur_rec, cur_prec = rec[-1], prec[-1]
    for i in range(len(prec) - 2, -1, -1):
        cur_prec = max(prec[i], cur_prec)
        if abs(cur_rec - rec[i]) > 1e-6:
            ap = _F(ap + cur_prec * abs(cur_rec - rec[i]))
        cur_rec = rec[i]
    return float(_F(ap + cur_rec * cur_prec))


def integral(prec: Sequence, rec: Sequence) -> float:
    """The area under the raw precision curve."""
    ap, prev = _F(0), _F(0)
    for p, r in zip(prec, rec):
        if abs(r - prev) > 1e-6:
            ap = _F(ap + p * abs(r - prev))
        prev = r
    return float(ap)


_BY_VERSION = {"11point": eleven_point, "MaxIntegral": max_integral, "Integral": integral}


def average_precision(
    tp: Sequence[tuple[float, int]], num_pos: int, fp: Sequence[tuple[float, int]],
    ap_version: str,
) -> float:  # fmt: skip
    """``ComputeAP``: the AP of one class from its (score, tp) and (score, fp) pairs; 0
    without detections or positives. A ValueError for an unknown ``ap_version``."""
    if ap_version not in _BY_VERSION:
        raise ValueError(f"Unknown ap_version: {ap_version} (known: {', '.join(AP_VERSIONS)})")
    if not tp or num_pos == 0:
        return 0.0
    return _BY_VERSION[ap_version](*precision_recall(tp, fp, num_pos))


def class_ap(
    dets: Sequence[tuple[int, float, Sequence[float]]],
    truth: Sequence[tuple[np.ndarray, np.ndarray]],
    label: int,
    ap_version: str = "MaxIntegral",
    threshold: float = 0.5,
) -> float:
    """VOC's AP of class ``label``: ``dets`` are (image index, score, pixel box) rows,
    ``truth`` per image (pixel boxes (K, 4), labels (K,)); see the module docstring."""
    gts = [np.asarray(boxes, np.float64)[np.asarray(labels) == label] for boxes, labels in truth]
    used = [np.zeros(len(g), bool) for g in gts]
    tp, fp = [], []
    for image, score, box in sorted(dets, key=lambda d: -d[1]):
        hit = 0
        if len(gts[image]):
            overlaps = iou(np.asarray([box], np.float64), gts[image], offset=1)[0]
            j = int(overlaps.argmax())
            if overlaps[j] >= threshold and not used[image][j]:
                used[image][j] = True
                hit = 1
        tp.append((float(score), hit))
        fp.append((float(score), 1 - hit))
    return average_precision(tp, sum(len(g) for g in gts), fp, ap_version)
