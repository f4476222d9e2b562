"""Average precision (runtime/outputs/average_precision.py): the fork's three ``ap_version``s
against VOC's own formulas (the devkit's VOC07 11-point and VOC2010+ area, transcribed), and
the VOC matching of pixel-box detections by hand."""

from __future__ import annotations

import numpy as np
import pytest

from caffe2jax.runtime.outputs.average_precision import (
    average_precision,
    class_ap,
    eleven_point,
    integral,
    max_integral,
    precision_recall,
)


def _voc_ap(rec: np.ndarray, prec: np.ndarray, use_07: bool) -> float:
    """VOC devkit's voc_ap (py-faster-rcnn lib/datasets/voc_eval.py), transcribed."""
    if use_07:
        ap = 0.0
        for t in np.arange(0.0, 1.1, 0.1):
            p = 0 if np.sum(rec >= t) == 0 else np.max(prec[rec >= t])
            ap += p / 11.0
        return ap
    mrec = np.concatenate(([0.0], rec, [1.0]))
    mpre = np.concatenate(([0.0], prec, [0.0]))
    for i in range(mpre.size - 1, 0, -1):
        mpre[i - 1] = np.maximum(mpre[i - 1], mpre[i])
    i = np.where(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[i + 1] - mrec[i]) * mpre[i + 1]))


@pytest.mark.parametrize("seed", range(8))
def test_the_forks_versions_are_vocs(seed):
    """11point is VOC2007's, MaxIntegral VOC2010+'s, within float32 (the fork's arithmetic).
    The positives are a count prime to 10, so that no recall but 1 falls on a tenth (there the
    fork's float32 recall may fall below VOC's double one: see the test below)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    scores = rng.permutation(n).astype(float)
    hits = (rng.random(n) < 0.6).astype(int)
    num_pos = int(hits.sum()) + int(rng.integers(0, 4))
    while np.gcd(num_pos, 10) != 1:
        num_pos += 1
    tp = list(zip(scores, hits))
    fp = list(zip(scores, 1 - hits))
    prec, rec = precision_recall(tp, fp, num_pos)
    order = np.argsort(-scores, kind="stable")
    ctp, cfp = np.cumsum(hits[order]), np.cumsum(1 - hits[order])
    np.testing.assert_allclose(rec, ctp / num_pos, rtol=1e-6)
    np.testing.assert_allclose(prec, ctp / (ctp + cfp), rtol=1e-6)
    voc_rec, voc_prec = ctp / num_pos, ctp / (ctp + cfp)
    assert eleven_point(prec, rec) == pytest.approx(_voc_ap(voc_rec, voc_prec, True), abs=1e-6)
    assert max_integral(prec, rec) == pytest.approx(_voc_ap(voc_rec, voc_prec, False), abs=1e-6)
    area = float(np.sum(np.diff(np.concatenate([[0.0], voc_rec])) * voc_prec))
    assert integral(prec, rec) == pytest.approx(area, abs=1e-6)
    for version, fn in (("11point", eleven_point), ("MaxIntegral", max_integral),
                        ("Integral", integral)):  # fmt: skip
        assert average_precision(tp, num_pos, fp, version) == fn(prec, rec)


def test_eleven_point_compares_float_recalls_with_double_tenths():
    """The fork: ``rec[i] < j / 10.`` with a float recall. 9 of 10 positives found is the
    float32 0.89999998 < 0.9, so the best precision at recall ≥ 0.9 is 0 there (VOC's double
    recall 0.9 would count it)."""
    tp = [(1.0 - k / 100, 1) for k in range(9)]
    fp = [(s, 0) for s, _ in tp]
    prec, rec = precision_recall(tp, fp, 10)
    assert float(rec[-1]) < 0.9
    assert eleven_point(prec, rec) == pytest.approx(9 / 11, abs=1e-6)
    assert _voc_ap(np.arange(1, 10) / 10, np.ones(9), True) == pytest.approx(10 / 11)


def test_no_detections_or_positives_score_zero_and_unknown_versions_fail():
    assert average_precision([], 3, [], "11point") == 0.0
    assert average_precision([(0.9, 0)], 0, [(0.9, 1)], "Integral") == 0.0
    with pytest.raises(ValueError, match="Unknown ap_version: VOC"):
        average_precision([(0.9, 1)], 1, [(0.9, 0)], "VOC")


def test_class_ap_matches_each_ground_truth_once():
    """Two ground truth boxes in image 0, one in image 1; by score: a hit (IoU 1), a second
    detection of the same box (a false positive), a hit at IoU 0.5 exactly with +1 pixel
    sides, a miss of another class's box. Precision 1, 1/2, 2/3, 2/4 at recall 1/3, 1/3, 2/3,
    2/3: VOC2010+'s AP 1·1/3 + 2/3·1/3."""
    truth = [(np.array([[0, 0, 9, 9], [20, 20, 39, 39]]), np.array([1, 1])),
             (np.array([[0, 0, 9, 9], [50, 50, 60, 60]]), np.array([1, 2]))]  # fmt: skip
    dets = [(0, 0.9, (0, 0, 9, 9)), (0, 0.8, (0, 0, 9, 9)), (0, 0.7, (20, 20, 39, 19 + 10)),
            (1, 0.6, (50, 50, 60, 60))]  # fmt: skip
    assert class_ap(dets, truth, 1) == pytest.approx(1 / 3 + 2 / 9, abs=1e-6)
    assert class_ap(dets, truth, 1, "11point") == pytest.approx((4 * 1 + 3 * 2 / 3) / 11, abs=1e-6)
