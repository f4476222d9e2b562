"""lowering/boxes/iou.py: the one overlap function in each fork's convention, against loops
transcribed from the forks' own code (weiliu89's bbox_util.cpp JaccardOverlap for normalized and
pixel boxes and the pointer form ApplyNMSFast uses, py-faster-rcnn's utils/bbox.pyx and
nms/py_cpu_nms.py, the YOLO forks' box_iou), in float32 as the C++ computes, jitted as the
layers run it; and the edge cases where the conventions differ (touching edges, boxes a fraction
of a pixel apart, inverted and empty boxes)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.lowering.boxes.iou import (
    RCNN,
    RCNN_NMS,
    SSD,
    SSD_NMS,
    SSD_PIXELS,
    YOLO,
    Convention,
    iou,
    iou_row,
)

F = np.float32


def _ssd_size(b, normalized=True):
    """bbox_util.cpp BBoxSize."""
    if b[2] < b[0] or b[3] < b[1]:
        return F(0)
    w, h = F(b[2] - b[0]), F(b[3] - b[1])
    return w * h if normalized else (w + F(1)) * (h + F(1))


def ssd_jaccard(b1, b2, normalized=True, size1=None, size2=None):
    """bbox_util.cpp JaccardOverlap(NormalizedBBox, NormalizedBBox, normalized)."""
    if b2[0] > b1[2] or b2[2] < b1[0] or b2[1] > b1[3] or b2[3] < b1[1]:
        inter = (F(0), F(0), F(0), F(0))  # IntersectBBox: the empty box
    else:
        inter = (max(b1[0], b2[0]), max(b1[1], b2[1]), min(b1[2], b2[2]), min(b1[3], b2[3]))
    one = F(0) if normalized else F(1)
    iw, ih = F(inter[2] - inter[0]) + one, F(inter[3] - inter[1]) + one
    if iw > 0 and ih > 0:
        s = iw * ih
        s1 = _ssd_size(b1, normalized) if size1 is None else size1
        s2 = _ssd_size(b2, normalized) if size2 is None else size2
        return s / (s1 + s2 - s)
    return F(0)


def ssd_jaccard_pointer(b1, b2):
    """bbox_util.cpp JaccardOverlap(const Dtype*, const Dtype*), ApplyNMSFast's."""
    if b2[0] > b1[2] or b2[2] < b1[0] or b2[1] > b1[3] or b2[3] < b1[1]:
        return F(0)
    iw = F(min(b1[2], b2[2]) - max(b1[0], b2[0]))
    ih = F(min(b1[3], b2[3]) - max(b1[1], b2[1]))
    inter = iw * ih
    with np.errstate(invalid="ignore", divide="ignore"):
        return inter / (_ssd_size(b1) + _ssd_size(b2) - inter)


def rcnn_overlaps(b, q):
    """utils/bbox.pyx bbox_overlaps, one pair."""
    iw = F(min(b[2], q[2]) - max(b[0], q[0])) + F(1)
    if iw > 0:
        ih = F(min(b[3], q[3]) - max(b[1], q[1])) + F(1)
        if ih > 0:
            ua = (F(b[2] - b[0]) + F(1)) * (F(b[3] - b[1]) + F(1))
            area_q = (F(q[2] - q[0]) + F(1)) * (F(q[3] - q[1]) + F(1))
            return iw * ih / (ua + area_q - iw * ih)
    return F(0)


def rcnn_nms_overlap(b, q):
    """nms/py_cpu_nms.py: ovr of box i with box j."""
    xx1, yy1 = max(b[0], q[0]), max(b[1], q[1])
    xx2, yy2 = min(b[2], q[2]), min(b[3], q[3])
    w = max(F(0), F(xx2 - xx1) + F(1))
    h = max(F(0), F(yy2 - yy1) + F(1))
    inter = w * h
    area_b = (F(b[2] - b[0]) + F(1)) * (F(b[3] - b[1]) + F(1))
    area_q = (F(q[2] - q[0]) + F(1)) * (F(q[3] - q[1]) + F(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return inter / (area_b + area_q - inter)


def yolo_box_iou(a, b):
    """The YOLO forks' box_intersection / box_union on [x, y, w, h]."""

    def overlap(x1, w1, x2, w2):
        left = max(x1 - w1 / F(2), x2 - w2 / F(2))
        right = min(x1 + w1 / F(2), x2 + w2 / F(2))
        return F(right - left)

    w, h = overlap(a[0], a[2], b[0], b[2]), overlap(a[1], a[3], b[1], b[3])
    inter = F(0) if w < 0 or h < 0 else w * h
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def _table(fn, a, b):
    return np.array([[fn(x, y) for y in b] for x in a], np.float32)


def _boxes(rng, n, scale, centre=False):
    b = rng.uniform(0, scale, (n, 4)).astype(np.float32)
    if centre:
        b[:, 2:] = rng.uniform(0.05, scale / 2, (n, 2))
    else:
        b[:, 2:] = b[:, :2] + rng.uniform(0, scale / 2, (n, 2)).astype(np.float32)
    return b


# hand-made pairs where the conventions part: touching edges, a 0.5-pixel gap, an inverted box,
# a point box, the same box twice, one box inside another
EDGES = np.array(
    [[0, 0, 2, 2], [2, 0, 4, 2], [2.5, 0, 4, 2], [3, 3, 1, 1], [1, 1, 1, 1], [0, 0, 2, 2],
     [0.5, 0.5, 1.5, 1.5]], np.float32)  # fmt: skip


def _jitted(a, b, convention, sizes=None):
    return np.asarray(jax.jit(lambda a, b: iou(a, b, convention, sizes))(a, b))


@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_ssd_normalized_is_jaccard_overlap(scale):
    rng = np.random.default_rng(0)
    a, b = _boxes(rng, 12, scale), _boxes(rng, 7, scale)
    for x, y in ((a, b), (EDGES, EDGES)):
        expected = _table(ssd_jaccard, x, y)
        np.testing.assert_allclose(_jitted(x, y, SSD), expected, rtol=2e-7, atol=0)


def test_ssd_pixels_is_jaccard_overlap_unnormalized_with_cached_sizes():
    rng = np.random.default_rng(1)
    a, b = _boxes(rng, 9, 50.0), np.concatenate([_boxes(rng, 5, 50.0), EDGES * 20])
    size_a = np.array([_ssd_size(x, False) for x in a], np.float32)
    size_b = np.array([_ssd_size(y, False) for y in b], np.float32)
    expected = np.array(
        [[ssd_jaccard(x, y, False, sx, sy) for y, sy in zip(b, size_b)] for x, sx in zip(a, size_a)]
    )
    got = _jitted(a, b, SSD_PIXELS, (jnp.asarray(size_a), jnp.asarray(size_b)))
    np.testing.assert_allclose(got, expected, rtol=2e-7, atol=0)
    # boxes that do not touch: the zero intersection box, +1 sized 1 (the fork's 1/(a + b − 1))
    far = np.array([[0, 0, 9, 9], [20, 20, 29, 29]], np.float32)
    sizes = jnp.asarray([100.0, 100.0])
    assert _jitted(far[:1], far[1:], SSD_PIXELS, (sizes[:1], sizes[1:]))[0, 0] == F(1) / F(199)


def test_ssd_nms_is_the_pointer_jaccard_overlap_nan_included():
    rng = np.random.default_rng(2)
    boxes = np.concatenate([_boxes(rng, 10, 1.0), EDGES / 4])
    expected = _table(ssd_jaccard_pointer, boxes, boxes)
    got = _jitted(boxes, boxes, SSD_NMS)
    np.testing.assert_allclose(got, expected, rtol=2e-7, atol=0, equal_nan=True)
    point = EDGES[4:5]  # two empty boxes at one point: 0/0, which suppresses in ApplyNMSFast
    assert np.isnan(_jitted(point, point, SSD_NMS)[0, 0])
    assert _jitted(point, point, SSD)[0, 0] == 0  # MultiBoxLoss's form: 0


@pytest.mark.parametrize("convention, reference", [(RCNN, rcnn_overlaps),
                                                   (RCNN_NMS, rcnn_nms_overlap)])  # fmt: skip
def test_rcnn_forms_are_py_faster_rcnns(convention, reference):
    rng = np.random.default_rng(3)
    a, b = _boxes(rng, 15, 60.0), _boxes(rng, 6, 60.0)
    for x, y in ((a, b), (EDGES, EDGES)):
        np.testing.assert_allclose(_jitted(x, y, convention), _table(reference, x, y), rtol=2e-7)
    # 0.5 pixel apart: still overlapping with +1 sizes, as bbox.pyx counts them
    half = _jitted(EDGES[:1], EDGES[2:3], convention)[0, 0]
    assert half == pytest.approx(0.5 * 3 / (9 + 7.5 - 1.5))


def test_yolo_centre_boxes_are_box_iou():
    rng = np.random.default_rng(4)
    a, b = _boxes(rng, 11, 1.0, centre=True), _boxes(rng, 8, 1.0, centre=True)
    np.testing.assert_allclose(_jitted(a, b, YOLO), _table(yolo_box_iou, a, b), rtol=2e-7)


def test_a_row_is_the_matrix_row_and_batches_broadcast():
    rng = np.random.default_rng(5)
    boxes = _boxes(rng, 6, 30.0)
    row = jax.jit(iou_row(RCNN_NMS))(boxes[2], boxes)
    np.testing.assert_array_equal(np.asarray(row), _jitted(boxes, boxes, RCNN_NMS)[2])
    batch = np.stack([boxes, boxes[::-1]])
    got = _jitted(batch, batch[:, :3], SSD)
    np.testing.assert_array_equal(got[1], _jitted(boxes[::-1], boxes[::-1][:3], SSD))


def test_conventions_are_checked():
    with pytest.raises(ValueError, match="disjoint must be overlap, zero or box"):
        Convention(disjoint="never")


# -- the products rounded as the fork's floats (found by jitting the parity tests, issue 32) --


def fork_jaccard_normalized(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """JaccardOverlap(normalized) transcribed: float32 arithmetic, each product rounded."""
    ax1, ay1, ax2, ay2 = (a[:, None, i] for i in range(4))
    bx1, by1, bx2, by2 = (b[None, :, i] for i in range(4))
    disjoint = (bx1 > ax2) | (bx2 < ax1) | (by1 > ay2) | (by2 < ay1)
    iw = np.minimum(ax2, bx2) - np.maximum(ax1, bx1)
    ih = np.minimum(ay2, by2) - np.maximum(ay1, by1)
    touching = ~disjoint & (iw > 0) & (ih > 0)
    size_a = np.where((ax2 < ax1) | (ay2 < ay1), F(0), (ax2 - ax1) * (ay2 - ay1))
    size_b = np.where((bx2 < bx1) | (by2 < by1), F(0), (bx2 - bx1) * (by2 - by1))
    inter = iw * ih
    with np.errstate(invalid="ignore", divide="ignore"):
        overlap = inter / (size_a + size_b - inter)
    return np.where(touching, overlap, F(0)).astype(F)


def _normalized_boxes(rng, n):
    xy = rng.random((n, 2), dtype=F) * F(0.8)
    wh = rng.random((n, 2), dtype=F) * F(0.5) + F(0.01)
    return np.concatenate([xy, xy + wh], 1).astype(F)


def test_ssd_jaccard_is_the_forks_float32_under_jit():
    """400 × 300 boxes; where the plain expression fused under jit (one multiply-add)
    gives other bits, the layer's does not."""
    rng = np.random.default_rng(0)
    a, b = _normalized_boxes(rng, 400), _normalized_boxes(rng, 300)
    want = fork_jaccard_normalized(a, b)
    got = np.asarray(jax.jit(iou)(a, b))  # convention SSD
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))

    @jax.jit
    def fused(a, b):  # the former expression: s1 + s2 − w·h is one FMA under XLA CPU's jit
        ax1, ay1, ax2, ay2 = (a[:, None, i] for i in range(4))
        bx1, by1, bx2, by2 = (b[None, :, i] for i in range(4))
        iw = jnp.minimum(ax2, bx2) - jnp.maximum(ax1, bx1)
        ih = jnp.minimum(ay2, by2) - jnp.maximum(ay1, by1)
        inter = iw * ih
        union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
        return jnp.where((iw > 0) & (ih > 0), inter / union, 0.0)

    if jax.default_backend() == "cpu":
        assert (np.asarray(fused(a, b)) != want).sum() > 0  # the fault this guards against
