"""The built-in py-faster-rcnn RoIDataLayer (runtime/data/readers/roi_data.py) over an
AnnotatedDatum LMDB from examples/detection/synthetic_boxes.py: tops, scaling, box conversion,
flips, padding, resume."""

from __future__ import annotations

import numpy as np
import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.readers.roi_data import (
    PIXEL_MEANS,
    RoIDataSource,
    im_scale,
    pixel_boxes,
)
from examples.detection.synthetic_boxes import make_boxes


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


def _mixed_db(path, encode: bool):
    """Two records: a 64×64 image with box [0.25, 0.25, 0.5, 0.5] (label 1) and a 48×96
    (h × w) one with box [0.5, 0.5, 1, 1] (label 2); JPEG-encoded or raw."""
    import cv2

    from caffe2jax.runtime.data.records.annotated_datum import Boxes, annotated_datum
    from caffe2jax.runtime.data.records.datum import array_to_datum
    from caffe2jax.runtime.data.records.db import Writer

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (3, 64, 64), np.uint8), rng.integers(0, 255, (3, 48, 96),
                                                                        np.uint8)]  # fmt: skip
    boxes = [[[0.25, 0.25, 0.5, 0.5]], [[0.5, 0.5, 1.0, 1.0]]]
    with Writer(path) as db:
        for i, (chw, box) in enumerate(zip(images, boxes)):
            datum = array_to_datum(chw)
            if encode:
                datum = caffe_pb2.Datum(encoded=True, channels=3, data=cv2.imencode(
                    ".png", chw.transpose(1, 2, 0))[1].tobytes())  # fmt: skip
            record = annotated_datum(datum, Boxes.of(np.asarray(box), np.asarray([i + 1])))
            db.put(f"{i:08d}", record.SerializeToString())
    return images


@pytest.mark.parametrize("encode", [False, True])
def test_mixed_sizes_on_one_canvas_with_pad(tmp_path, encode):
    """scale 64: the 64×64 image stays (s 1), the 48×96 one becomes 64×128 (s 4/3); the canvas
    is 64×128, each image at the top left, zeros elsewhere; im_info and boxes per image."""
    images = _mixed_db(tmp_path / "mixed", encode)
    src = RoIDataSource(_layer(tmp_path / "mixed", scale=64, flip=0, pad=1), "TRAIN", seed=0)
    assert src.top_shapes() == [(1, 3, 64, 128), (1, 3), (32, 5)]
    seen = set()
    for _ in range(2):
        data, info, gt = (np.asarray(x) for x in src.next_batch())
        key = 0 if info[0, 1] == 64 else 1
        seen.add(key)
        if key == 0:
            np.testing.assert_allclose(info, [[64, 64, 1.0]])
            want = images[0] - PIXEL_MEANS[:, None, None]
            np.testing.assert_allclose(data[0, :, :, :64], want, atol=1e-4)
            assert not data[0, :, :, 64:].any()
            np.testing.assert_allclose(gt[0], [15, 15, 31, 31, 1])  # (0.25·64 − 1)·1
        else:
            np.testing.assert_allclose(info, [[64, 128, 4 / 3]], rtol=1e-6)
            assert data.shape == (1, 3, 64, 128) and data[0, :, :, 64:].any()
            want = [47 * 4 / 3, 23 * 4 / 3, 95 * 4 / 3, 47 * 4 / 3, 2]  # (0.5·96 − 1)·s …
            np.testing.assert_allclose(gt[0], want, rtol=1e-6)
    assert seen == {0, 1}


def test_mixed_sizes_without_pad_name_the_key(tmp_path):
    _mixed_db(tmp_path / "mixed", encode=False)
    src = RoIDataSource(_layer(tmp_path / "mixed", scale=64, flip=0), "TRAIN", seed=0)
    with pytest.raises(DataError, match=r"record '0000000\d'.*'pad': 1 in param_str"):
        for _ in range(4):
            src.next_batch()


@pytest.mark.parametrize("key,value", [("scale", "nan"), ("scale", "0"), ("scale", "inf"),
                                       ("max_size", "-5"), ("scale", "'big'")])  # fmt: skip
def test_a_scale_that_sizes_no_image_is_refused_in_one_line(boxes_db, key, value):
    path, _ = boxes_db
    with pytest.raises(DataError, match=rf"'input-data'.*'{key}' must be a number") as error:
        RoIDataSource(_layer(path, **{key: value}), "TRAIN", seed=0)
    assert len(str(error.value).splitlines()) == 1
