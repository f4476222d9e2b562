"""Caffe's WindowData layer (runtime/data/readers/window_data.py): the window file, the foreground /
background split and batch layout, the warp with context padding (hand-computed from
window_data_layer.cpp's arithmetic), mirror, means and scale, and its errors."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.readers.window_data import parse_window_file
from caffe2jax.runtime.data.records.datum import write_blobproto
from caffe2jax.runtime.data.sources import make_source
from caffe2jax.runtime.data.transform.image import resize

from .helpers import layer

RNG = np.random.default_rng(1)


def window_setup(tmp_path, windows: str, size=(8, 8)) -> np.ndarray:
    """One 8×8 colour PNG (image 0) with ``windows`` lines; returns its BGR C×H×W pixels."""
    rgb = RNG.integers(0, 256, (*size, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "im.png")
    lines = windows.strip().splitlines()
    (tmp_path / "windows.txt").write_text(
        f"# 0\nim.png\n3\n{size[0]}\n{size[1]}\n{len(lines)}\n" + "\n".join(lines) + "\n"
    )
    return rgb[..., ::-1].transpose(2, 0, 1)


def window_layer(tmp_path, batch: int, fg: float, extra: str = "", transform: str = ""):
    return layer(
        f'name: "w" type: "WindowData" top: "data" top: "label" transform_param {{ '
        f"crop_size: 8 {transform} }} window_data_param {{ source: "
        f'"{tmp_path}/windows.txt" root_folder: "{tmp_path}/" batch_size: {batch} '
        f"fg_fraction: {fg} {extra} }}"
    )


def test_window_file_and_split(tmp_path):
    window_setup(tmp_path, "3 0.9 0 0 7 7\n0 0.1 1 1 5 5\n2 0.4 0 0 3 3\n5 0.7 2 2 6 6")
    images, windows = parse_window_file(tmp_path / "windows.txt", f"{tmp_path}/")
    assert images == [(f"{tmp_path}/im.png", 3)] and len(windows) == 4
    source = make_source(window_layer(tmp_path, 8, 0.25), "TRAIN", seed=0)
    assert source.top_shapes() == [(8, 3, 8, 8), (8,)]
    assert [w[1] for w in source.fg] == [3, 5] and [w[1:3] for w in source.bg] == [(0, 0.0)] * 2
    labels = source.next_batch()[1]
    # 8 − int(8 × 0.25) = 6 background windows (label 0), then 2 foreground ones
    assert labels[:6].tolist() == [0] * 6 and set(labels[6:].tolist()) <= {3, 5}


def test_whole_image_window_is_the_image_minus_mean_times_scale(tmp_path):
    bgr = window_setup(tmp_path, "1 1.0 0 0 7 7")
    param = window_layer(tmp_path, 2, 1.0, "scale: 0.5", "mean_value: 10 mean_value: 20 "
                         "mean_value: 30 mirror: true")  # fmt: skip
    data, labels = make_source(param, "TRAIN", seed=3).next_batch()
    want = (bgr.astype(np.float32) - np.array([10, 20, 30], np.float32)[:, None, None]) * 0.5
    for row in data:  # mirrored or not, at random
        assert np.array_equal(row, want) or np.array_equal(row, want[:, :, ::-1])
    assert labels.tolist() == [1, 1]


def test_context_padding_warps_into_the_centre(tmp_path):
    """Window (0,0)-(7,7) of an 8×8 image, crop 8, context_pad 2: context_scale 8/4 = 2, the
    region grows to (−4,−4)-(12,12) (17 wide), clipped to the image (pads 4 before, 5 after);
    it warps to round(8·8/17) = 4 pixels placed at round(4·8/17) = 2 (mirrored: the after
    pad round(5·8/17) = 2); the rest stays 0. The mean file's centre is read at the same
    square positions, never mirrored."""
    bgr = window_setup(tmp_path, "1 1.0 0 0 7 7")
    mean = RNG.random((1, 3, 10, 10), dtype=np.float32) * 50
    write_blobproto(tmp_path / "mean.binaryproto", mean)
    param = window_layer(tmp_path, 16, 1.0, "context_pad: 2",
                         f'mirror: true mean_file: "{tmp_path}/mean.binaryproto"')  # fmt: skip
    data, _ = make_source(param, "TRAIN", seed=5).next_batch()
    warped = resize(bgr, 4, 4).astype(np.float32)
    centre = mean[0, :, 1:9, 1:9]  # (10 − 8) / 2 = 1
    seen = set()
    for row in data:
        flipped = not np.array_equal(row[:, 2:6, 2:6], warped - centre[:, 2:6, 2:6])
        pixels = warped[:, :, ::-1] if flipped else warped
        assert np.array_equal(row[:, 2:6, 2:6], pixels - centre[:, 2:6, 2:6])
        outside = np.ones((8, 8), bool)
        outside[2:6, 2:6] = False
        assert not row[:, outside].any()
        seen.add(flipped)
    assert seen == {True, False}


def test_square_crop_mode_and_clipping(tmp_path):
    """A 2-wide, 4-high window (1,1)-(2,4) made square (half width = half height = 2)
    around its centre (2, 3): columns 0..4, rows 1..5, warped onto the whole crop."""
    bgr = window_setup(tmp_path, "1 1.0 1 1 2 4")
    param = window_layer(tmp_path, 1, 1.0, 'crop_mode: "square"')
    data, _ = make_source(param, "TEST", seed=0).next_batch()
    assert np.array_equal(data[0], resize(bgr[:, 1:6, 0:5], 8, 8).astype(np.float32))


def test_window_data_errors(tmp_path):
    window_setup(tmp_path, "0 0.9 0 0 7 7")
    with pytest.raises(DataError, match="foreground window of image 0 has label 0"):
        make_source(window_layer(tmp_path, 2, 0.5), "TRAIN")
    window_setup(tmp_path, "1 0.9 0 0 7 7")
    with pytest.raises(DataError, match="no background windows, and a batch needs 1"):
        make_source(window_layer(tmp_path, 2, 0.5), "TRAIN")
    window_setup(tmp_path, "1 0.9 0 0 9 7")
    with pytest.raises(DataError, match=r"window \(0, 0, 9, 7\) lies outside its 8×8 image"):
        make_source(window_layer(tmp_path, 1, 1.0), "TRAIN").next_batch()
    (tmp_path / "windows.txt").write_text("# 0\nim.png\n3\n8\n")
    with pytest.raises(DataError, match="truncated or malformed window file"):
        make_source(window_layer(tmp_path, 1, 1.0), "TRAIN")
