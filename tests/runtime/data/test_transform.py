"""Caffe's DataTransformer, one item into its row, against hand-computed expectations and
the whole-batch formula; its per-item draws."""

from __future__ import annotations

import numpy as np
import pytest

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.records.datum import write_blobproto
from caffe2jax.runtime.data.transform.transformer import DataTransformer, Draws

from .helpers import transform_param


def _one(transformer, image, flip=False, h_off=0, w_off=0):
    """``transformer`` applied to one C×H×W item with the given draws."""
    shape = transformer.output_shape(image.shape)
    out = np.full((1, *shape), np.nan, np.float32)
    draws = Draws(np.array([flip]), np.array([h_off]), np.array([w_off]))
    return transformer(iter([image]), draws, out)[0]


def test_mean_file_crop_mirror_scale_train(tmp_path):
    write_blobproto(
        tmp_path / "mean.binaryproto",
        np.arange(16, dtype=np.float32)[None, None].reshape(1, 1, 4, 4) * 0.25,
    )
    param = transform_param('mean_file: "mean.binaryproto" crop_size: 2 mirror: true scale: 0.5')
    transformer = DataTransformer(param, "TRAIN", base_dir=tmp_path)
    image = np.arange(16, dtype=np.uint8).reshape(1, 4, 4)
    out = _one(transformer, image, flip=True, h_off=1, w_off=2)
    # Source rows 1..2, columns 3, 2 (mirrored); the mean is read at the same positions.
    expected = [[(7 - 1.75) * 0.5, (6 - 1.5) * 0.5], [(11 - 2.75) * 0.5, (10 - 2.5) * 0.5]]
    assert out.dtype == np.float32
    assert out.tolist() == [expected]
    assert transformer.output_shape((1, 4, 4)) == (1, 2, 2)


def test_test_phase_takes_the_centre_crop():
    transformer = DataTransformer(transform_param("crop_size: 3"), "TEST")
    draws = transformer.draws(np.arange(4), (1, 5, 5))
    assert draws.h_off.tolist() == draws.w_off.tolist() == [1, 1, 1, 1]
    five = np.arange(25, dtype=np.uint8).reshape(1, 5, 5)
    assert _one(transformer, five, h_off=1, w_off=1)[0].tolist() == [
        [6, 7, 8], [11, 12, 13], [16, 17, 18]]  # fmt: skip
    assert transformer.draws(np.arange(2), (1, 4, 4)).h_off.tolist() == [0, 0]  # (4 − 3) / 2


def test_mirror_applies_in_test_too():
    # Caffe's do_mirror = mirror && Rand(2) does not look at the phase.
    transformer = DataTransformer(transform_param("mirror: true"), "TEST", key=5)
    flips = transformer.draws(np.arange(400), (1, 1, 3)).flip
    assert 150 < flips.sum() < 250
    row = np.array([[[1, 2, 3]]], np.uint8)
    assert _one(transformer, row, flip=True)[0].tolist() == [[3, 2, 1]]
    assert _one(transformer, row, flip=False)[0].tolist() == [[1, 2, 3]]


def test_mean_value_per_channel_and_replicated():
    image = np.array([[[10, 20]], [[30, 40]], [[50, 60]]], np.uint8)  # 3×1×2
    per_channel = transform_param("mean_value: 1 mean_value: 2 mean_value: 3 scale: 2")
    out = _one(DataTransformer(per_channel, "TRAIN"), image)
    assert out[:, 0].tolist() == [[18, 38], [56, 76], [94, 114]]
    single = transform_param("mean_value: 10")
    out = _one(DataTransformer(single, "TRAIN"), image)
    assert out[:, 0].tolist() == [[0, 10], [20, 30], [40, 50]]


def test_float32_arithmetic_as_caffe():
    values = np.array([[[0.1, 250.7]]], np.float32)
    param = transform_param("mean_value: 0.3 scale: 0.00390625")
    out = _one(DataTransformer(param, "TEST"), values)
    expected = (values - np.float32(0.3)) * np.float32(0.00390625)
    assert out.dtype == np.float32 and np.array_equal(out, expected)


def test_per_item_transform_equals_the_whole_batch_formula(tmp_path):
    """Crop, mirror, mean file and scale of an OpenCV-strided (H×W×C seen as C×H×W) image,
    one item at a time, against the same formula over the whole batch with fancy indexing
    (the batch transformer caffe2jax had before), for every draw."""
    rng = np.random.default_rng(0)
    mean = rng.random((3, 9, 8), dtype=np.float32) * 255
    write_blobproto(tmp_path / "m.binaryproto", mean[None])
    param = transform_param('mean_file: "m.binaryproto" crop_size: 5 mirror: true scale: 0.017')
    transformer = DataTransformer(param, "TRAIN", key=3, base_dir=tmp_path)
    hwc = rng.integers(0, 256, (64, 9, 8, 3), dtype=np.uint8)
    batch = hwc.transpose(0, 3, 1, 2)  # strided views, as decode_image returns
    out = transformer.transform(batch, np.arange(100, 164))
    draws = transformer.draws(np.arange(100, 164), (3, 9, 8))
    rows = draws.h_off[:, None] + np.arange(5)
    cols = draws.w_off[:, None] + np.arange(5)
    cols = np.where(draws.flip[:, None], cols[:, ::-1], cols)
    n, c = np.arange(64)[:, None, None, None], np.arange(3)[None, :, None, None]
    r, q = rows[:, None, :, None], cols[:, None, None, :]
    want = (batch[n, c, r, q].astype(np.float32) - mean[c, r, q]) * np.float32(0.017)
    assert np.array_equal(out, want)
    assert {(int(h), int(w)) for h, w in zip(draws.h_off, draws.w_off)} <= {
        (h, w) for h in range(5) for w in range(4)}  # fmt: skip


def test_draws_depend_on_key_and_position_only():
    param = transform_param("crop_size: 2 mirror: true")
    one = DataTransformer(param, "TRAIN", key=3)
    again = DataTransformer(param, "TRAIN", key=3)
    whole = one.draws(np.arange(0, 800), (1, 4, 4))
    parts = [again.draws(np.arange(s, s + 100), (1, 4, 4)) for s in range(700, -100, -100)]
    for name in ("flip", "h_off", "w_off"):
        assert np.array_equal(getattr(whole, name), np.concatenate(
            [getattr(p, name) for p in reversed(parts)]))  # fmt: skip
    choices = set(zip(whole.flip.tolist(), whole.h_off.tolist(), whole.w_off.tolist()))
    assert len(choices) == 2 * 3 * 3  # every mirror × crop offset is drawn
    other = DataTransformer(param, "TRAIN", key=4).draws(np.arange(0, 800), (1, 4, 4))
    assert not np.array_equal(other.h_off, whole.h_off)
    counts = np.bincount(whole.h_off, minlength=3)
    assert counts.min() > 200  # ~267 each


def test_transformer_errors(tmp_path):
    both = transform_param('mean_file: "m" mean_value: 1')
    with pytest.raises(DataError, match="mean_file and mean_value at the same time"):
        DataTransformer(both, "TRAIN")
    with pytest.raises(DataError, match="both force_color and force_gray"):
        DataTransformer(transform_param("force_color: true force_gray: true"), "TRAIN")
    write_blobproto(tmp_path / "m.binaryproto", np.zeros((1, 3, 4, 4), np.float32))
    meaned = DataTransformer(
        transform_param('mean_file: "m.binaryproto"'), "TRAIN", base_dir=tmp_path
    )
    with pytest.raises(DataError, match=r"has shape \(3, 4, 4\), the data \(1, 4, 4\)"):
        meaned.output_shape((1, 4, 4))
    two = DataTransformer(transform_param("mean_value: 1 mean_value: 2"), "TRAIN")
    with pytest.raises(DataError, match="either 1 mean_value or as many as channels: 3"):
        two.output_shape((3, 4, 4))
    crop = DataTransformer(transform_param("crop_size: 5"), "TRAIN")
    with pytest.raises(DataError, match="crop_size 5 is larger than the data 4×6"):
        crop.output_shape((1, 4, 6))
    with pytest.raises(DataError, match="mean_file not found: nope"):
        DataTransformer(transform_param('mean_file: "nope"'), "TRAIN", base_dir=tmp_path)
