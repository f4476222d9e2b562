"""Caffe's DataTransformer against hand-computed expectations."""

from __future__ import annotations

import numpy as np
import pytest

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.datum import write_blobproto
from caffe2jax.runtime.data.transform import DataTransformer

from .helpers import transform_param


class ScriptedRng:
    """Stands in for the Generator: hands out the draws a test prescribes, in order."""

    def __init__(self, *draws):
        self.draws = [np.asarray(d) for d in draws]
        self.calls = []

    def integers(self, low, high, size):
        self.calls.append((low, high, size))
        return self.draws.pop(0)


def test_mean_file_crop_mirror_scale_train(tmp_path):
    write_blobproto(
        tmp_path / "mean.binaryproto",
        np.arange(16, dtype=np.float32)[None, None].reshape(1, 1, 4, 4) * 0.25,
    )
    param = transform_param('mean_file: "mean.binaryproto" crop_size: 2 mirror: true scale: 0.5')
    rng = ScriptedRng([1], [1], [2])  # mirror, then h_off = 1, w_off = 2
    transformer = DataTransformer(param, "TRAIN", rng, base_dir=tmp_path)
    image = np.arange(16, dtype=np.uint8).reshape(1, 1, 4, 4)
    out = transformer(image)
    # Source rows 1..2, columns 3, 2 (mirrored); the mean is read at the same positions.
    expected = [[(7 - 1.75) * 0.5, (6 - 1.5) * 0.5], [(11 - 2.75) * 0.5, (10 - 2.5) * 0.5]]
    assert out.dtype == np.float32
    assert out.tolist() == [[expected]]
    assert rng.calls == [(0, 2, 1), (0, 3, 1), (0, 3, 1)]  # Rand(2), Rand(H − crop + 1), …
    assert transformer.output_shape((1, 4, 4)) == (1, 2, 2)


def test_test_phase_takes_the_centre_crop():
    transformer = DataTransformer(transform_param("crop_size: 3"), "TEST", ScriptedRng())
    five = np.arange(25, dtype=np.uint8).reshape(1, 1, 5, 5)
    assert transformer(five)[0, 0].tolist() == [[6, 7, 8], [11, 12, 13], [16, 17, 18]]
    four = np.arange(16, dtype=np.uint8).reshape(1, 1, 4, 4)  # (4 − 3) / 2 = 0
    assert transformer(four)[0, 0].tolist() == [[0, 1, 2], [4, 5, 6], [8, 9, 10]]


def test_mirror_applies_in_test_too():
    # Caffe's do_mirror = mirror && Rand(2) does not look at the phase.
    rng = ScriptedRng([0, 1])
    transformer = DataTransformer(transform_param("mirror: true"), "TEST", rng)
    batch = np.array([[[[1, 2, 3]]], [[[1, 2, 3]]]], np.uint8)
    assert transformer(batch)[:, 0, 0].tolist() == [[1, 2, 3], [3, 2, 1]]


def test_mean_value_per_channel_and_replicated():
    image = np.array([[[[10, 20]], [[30, 40]], [[50, 60]]]], np.uint8)  # 1×3×1×2
    per_channel = transform_param("mean_value: 1 mean_value: 2 mean_value: 3 scale: 2")
    out = DataTransformer(per_channel, "TRAIN", ScriptedRng())(image)
    assert out[0, :, 0].tolist() == [[18, 38], [56, 76], [94, 114]]
    single = transform_param("mean_value: 10")
    out = DataTransformer(single, "TRAIN", ScriptedRng())(image)
    assert out[0, :, 0].tolist() == [[0, 10], [20, 30], [40, 50]]


def test_float32_arithmetic_as_caffe():
    values = np.array([[[[0.1, 250.7]]]], np.float32)
    param = transform_param("mean_value: 0.3 scale: 0.00390625")
    out = DataTransformer(param, "TEST", ScriptedRng())(values)
    expected = (values - np.float32(0.3)) * np.float32(0.00390625)
    assert out.dtype == np.float32 and np.array_equal(out, expected)


def test_random_crops_and_flips_cover_every_choice_reproducibly():
    param = transform_param("crop_size: 2 mirror: true")
    batch = np.arange(16, dtype=np.uint8).reshape(1, 1, 4, 4).repeat(400, axis=0)
    first = DataTransformer(param, "TRAIN", np.random.default_rng(3))(batch)
    again = DataTransformer(param, "TRAIN", np.random.default_rng(3))(batch)
    assert np.array_equal(first, again)
    corners = {(int(a[0, 0, 0]), int(a[0, 0, 1])) for a in first}
    # top-left pixel h_off·4 + w_off (unmirrored) or h_off·4 + w_off + 1 (mirrored)
    starts = {row * 4 + col for row in range(3) for col in range(3)}
    assert {c for c in corners if c[1] == c[0] + 1} == {(s, s + 1) for s in starts}
    assert {c for c in corners if c[1] == c[0] - 1} == {(s + 1, s) for s in starts}


def test_transformer_errors(tmp_path):
    both = transform_param('mean_file: "m" mean_value: 1')
    with pytest.raises(DataError, match="mean_file and mean_value at the same time"):
        DataTransformer(both, "TRAIN", ScriptedRng())
    with pytest.raises(DataError, match="both force_color and force_gray"):
        DataTransformer(transform_param("force_color: true force_gray: true"), "TRAIN", None)
    write_blobproto(tmp_path / "m.binaryproto", np.zeros((1, 3, 4, 4), np.float32))
    meaned = DataTransformer(
        transform_param('mean_file: "m.binaryproto"'), "TRAIN", None, base_dir=tmp_path
    )
    with pytest.raises(DataError, match=r"has shape \(3, 4, 4\), the data \(1, 4, 4\)"):
        meaned.output_shape((1, 4, 4))
    two = DataTransformer(transform_param("mean_value: 1 mean_value: 2"), "TRAIN", None)
    with pytest.raises(DataError, match="either 1 mean_value or as many as channels: 3"):
        two.output_shape((3, 4, 4))
    crop = DataTransformer(transform_param("crop_size: 5"), "TRAIN", None)
    with pytest.raises(DataError, match="crop_size 5 is larger than the data 4×6"):
        crop.output_shape((1, 4, 6))
    with pytest.raises(DataError, match="mean_file not found: nope"):
        DataTransformer(transform_param('mean_file: "nope"'), "TRAIN", None, base_dir=tmp_path)
