"""The host's box maths (runtime/outputs/boxes.py): IoU under both of Caffe's conventions by
hand, py-faster-rcnn's py_cpu_nms and bbox_transform_inv transcribed as loops."""

from __future__ import annotations

import numpy as np
import pytest

from caffe2jax.runtime.outputs.boxes import areas, decode_deltas, intersections, iou, nms


def test_iou_normalized_by_hand():
    a = np.array([[0, 0, 0.5, 0.5], [0.25, 0.25, 0.75, 0.75]], np.float32)
    b = np.array([[0, 0, 0.5, 0.5], [0.5, 0, 1, 0.5], [0.6, 0.6, 1, 1], [0.4, 0.4, 0.1, 0.1]],
                 np.float32)  # fmt: skip
    got = iou(a, b)
    assert got.shape == (2, 4) and got.dtype == np.float32
    # itself 1; touching 0; apart 0; an inverted box has area 0 and overlaps nothing
    np.testing.assert_allclose(got[0], [1, 0, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(got[1], [0.0625 / 0.4375, 0.0625 / 0.4375, 0.0225 / 0.3875, 0],
                               rtol=1e-6)  # fmt: skip
    assert areas(b[3:]).tolist() == [0.0]


def test_iou_pixel_boxes_count_both_edges():
    """py-faster-rcnn / VOC: [0, 0, 9, 9] is 10×10 pixels; [9, 9, 18, 18] shares one pixel."""
    a = np.array([[0.0, 0, 9, 9]])
    b = np.array([[0.0, 0, 9, 9], [9, 9, 18, 18], [10, 10, 20, 20], [0, 0, 4, 9]])
    np.testing.assert_allclose(areas(b, 1), [100, 100, 121, 50])
    np.testing.assert_allclose(intersections(a, b, 1)[0], [100, 1, 0, 50])
    np.testing.assert_allclose(iou(a, b, 1)[0], [1, 1 / 199, 0, 0.5])


def _py_cpu_nms(dets: np.ndarray, thresh: float) -> list[int]:
    """py-faster-rcnn lib/nms/py_cpu_nms.py, transcribed (scores in column 4)."""
    x1, y1, x2, y2, scores = dets.T
    areas_ = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = scores.argsort()[::-1]
    keep = []
    while order.size > 0:
        i = order[0]
        keep.append(int(i))
        xx1 = np.maximum(x1[i], x1[order[1:]])
        yy1 = np.maximum(y1[i], y1[order[1:]])
        xx2 = np.minimum(x2[i], x2[order[1:]])
        yy2 = np.minimum(y2[i], y2[order[1:]])
        w = np.maximum(0.0, xx2 - xx1 + 1)
        h = np.maximum(0.0, yy2 - yy1 + 1)
        inter = w * h
        ovr = inter / (areas_[i] + areas_[order[1:]] - inter)
        order = order[np.where(ovr <= thresh)[0] + 1]
    return keep


@pytest.mark.parametrize("seed", range(5))
def test_nms_is_py_cpu_nms(seed):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 80, (60, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(5, 40, (60, 2))], 1)
    scores = rng.permutation(60) / 60.0  # distinct: argsort's order is then unique
    for threshold in (0.3, 0.5, 0.7):
        want = _py_cpu_nms(np.concatenate([boxes, scores[:, None]], 1), threshold)
        assert nms(boxes, scores, threshold) == want


def test_decode_deltas_is_bbox_transform_inv():
    boxes = np.array([[10.0, 20, 29, 59]])  # w 20, h 40, centre (20, 40)
    deltas = np.array([[0.0, 0, 0, 0, 0.1, -0.25, np.log(2), 0]])  # class 1: centre (22, 30)
    out = decode_deltas(boxes, deltas)
    np.testing.assert_allclose(out[0, :4], [10, 20, 30, 60])  # no −1 on the far corner
    np.testing.assert_allclose(out[0, 4:], [22 - 20, 30 - 20, 22 + 20, 30 + 20])
