"""The built-in py-faster-rcnn RoIDataLayer (runtime/data/roi_data.py) over an AnnotatedDatum
LMDB from scripts/frcnn_boxes.py: tops, scaling, box conversion, flips, padding, resume."""

from __future__ import annotations

import numpy as np
import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.roi_data import PIXEL_MEANS, RoIDataSource, im_scale, pixel_boxes
from scripts.frcnn_boxes import make_boxes


def _layer(source, **extra) -> caffe_pb2.LayerParameter:
    p = caffe_pb2.LayerParameter(name="input-data", type="RoIData")
    p.top.extend(["data", "im_info", "gt_boxes"])
    keys = {"num_classes": 4, "source": f"'{source}'", **extra}
    p.python_param.module = "roi_data_layer.layer"
    p.python_param.layer = "RoIDataLayer"
    p.python_param.param_str = "\n".join(f"'{k}': {v}" for k, v in keys.items())
    return p


@pytest.fixture(scope="module")
def boxes_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("roi") / "boxes_lmdb"
    return path, make_boxes(path, count=5, size=64, seed=1)


def test_scale_rule():
    """prep_im_for_blob: shorter side to the target, unless the longer passes max_size."""
    assert im_scale(375, 500, 600, 1000) == pytest.approx(1.6)
    assert im_scale(200, 800, 600, 1000) == pytest.approx(1.25)  # 3 × 800 > 1000


def test_tops_boxes_and_flips(boxes_db):
    """An epoch holds every image twice (plain and mirrored), each box ·scale, padding rows
    zero; pixels are BGR − PIXEL_MEANS resized by the scale."""
    path, truth = boxes_db
    src = RoIDataSource(_layer(path, scale=96, max_boxes=4), "TRAIN", seed=0)
    assert src.top_shapes() == [(1, 3, 96, 96), (1, 3), (4, 5)]
    seen = []
    for _ in range(10):
        key, flip = src.plan().records[0]
        seen.append((int(key), flip))
    assert sorted(seen) == sorted((i, f) for i in range(5) for f in (False, True))
    src = RoIDataSource(_layer(path, scale=96, max_boxes=4), "TRAIN", seed=0)
    for i, flip in seen[:3]:
        data, info, gt = src.next_batch()
        boxes, labels = truth[i]
        want = boxes.copy()
        if flip:
            want[:, [0, 2]] = 64 - boxes[:, [2, 0]] - 1
        k = len(labels)
        np.testing.assert_allclose(gt[:k, :4], want * 1.5, atol=1e-4)
        np.testing.assert_array_equal(gt[:k, 4], labels)
        assert not gt[k:].any()
        np.testing.assert_allclose(info, [[96, 96, 1.5]])
        assert abs(float(data[0].mean()) + float(PIXEL_MEANS.mean()) - 127) < 100


def test_pixel_boxes_round_trip():
    """convert_annoset's (x+1)/W back to py-faster-rcnn's 0-based pixels."""
    norm = (np.array([[0, 5, 19, 30]], np.float64) + 1) / 32
    np.testing.assert_allclose(pixel_boxes(norm, 32, 32, False), [[0, 5, 19, 30]])
    np.testing.assert_allclose(pixel_boxes(norm, 32, 32, True), [[12, 5, 31, 30]])


def test_resume_is_exact(boxes_db):
    path, _ = boxes_db
    a = RoIDataSource(_layer(path), "TRAIN", seed=3)
    for _ in range(7):
        a.next_batch()
    state = a.get_state()
    b = RoIDataSource(_layer(path), "TRAIN", seed=3)
    b.set_state(state)
    for _ in range(6):
        for x, y in zip(a.next_batch(), b.next_batch()):
            np.testing.assert_array_equal(x, y)


def test_errors(boxes_db, tmp_path):
    path, _ = boxes_db
    with pytest.raises(DataError, match="more than max_boxes 1"):
        src = RoIDataSource(_layer(path, max_boxes=1), "TRAIN", seed=0)
        for _ in range(10):
            src.next_batch()
    bad = _layer(path)
    bad.python_param.param_str = "'num_classes': 4"
    with pytest.raises(DataError, match="needs 'num_classes' and 'source'"):
        RoIDataSource(bad, "TRAIN")
