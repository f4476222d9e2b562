"""runtime/outputs/segment.py: label maps from a segmenter's scores, and ``caffe2jax segment``."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.outputs.segment import class_counts, label_map, prepare_image
from tests import jitted
from tests.cli_runner import run_cli


def test_label_map_is_the_first_highest_class():
    scores = np.zeros((2, 3, 2, 2), np.float32)
    scores[0, 2, 0, 0] = 1
    scores[1, 1, 1, 1] = scores[1, 2, 1, 1] = 5  # a tie: the first class
    labels = caffe2jax.label_map(scores)
    assert labels.dtype == np.int32 and labels.shape == (2, 2, 2)
    np.testing.assert_array_equal(labels[0], [[2, 0], [0, 0]])
    np.testing.assert_array_equal(labels[1], [[0, 0], [0, 1]])
    np.testing.assert_array_equal(label_map(scores[0]), labels[0])  # (K, H, W)
    assert class_counts(labels[0]) == {0: 3, 2: 1}


def test_label_map_errors_are_one_line():
    with pytest.raises(DataError, match=r"shape \(N, classes, H, W\).*\[3\]"):
        label_map(np.zeros(3))
    with pytest.raises(DataError, match="NaN or infinity"):
        label_map(np.full((1, 2, 1, 1), np.nan))


NET = """
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 1 dim: 3 dim: 4 dim: 6 } } }
layer { name: "score" type: "Convolution" bottom: "data" top: "score"
        convolution_param { num_output: 3 kernel_size: 1 } }
layer { name: "up" type: "Interp" bottom: "score" top: "up" interp_param { zoom_factor: 2 } }
layer { name: "prob" type: "Softmax" bottom: "up" top: "prob" }
"""


def test_segment_command_writes_the_label_map(tmp_path):
    """The image (BGR, resized to 4×6, mean subtracted) through the net, argmax per pixel."""
    model = caffe2jax.compile(NET)
    params, state = model.init(0)
    params["score"] = [np.eye(3, dtype=np.float32).reshape(3, 3, 1, 1), np.zeros(3, np.float32)]
    (tmp_path / "net.prototxt").write_text(NET)
    caffe2jax.save_weights(tmp_path / "w.caffemodel", model, params, state)
    rng = np.random.default_rng(0)
    cv2.imwrite(str(tmp_path / "img.png"), rng.integers(0, 255, (8, 12, 3), dtype=np.uint8))
    x = prepare_image(str(tmp_path / "img.png"), (1, 3, 4, 6), (10, 20, 30))
    scores, _ = jitted.forward(model, params, state, {"data": x})
    expected = label_map(np.asarray(scores["prob"]))[0]
    result = run_cli("segment", "--model", tmp_path / "net.prototxt", "--weights",
                     tmp_path / "w.caffemodel", "--mean", "10,20,30", "--out", tmp_path / "out",
                     tmp_path / "img.png")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "7x11 label map" in result.stdout and "pixels per class" in result.stdout
    written = cv2.imread(str(tmp_path / "out" / "img.png"), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(written, expected)


def test_segment_command_errors_are_one_line(tmp_path):
    (tmp_path / "net.prototxt").write_text(NET)
    model = caffe2jax.compile(NET)
    caffe2jax.save_weights(tmp_path / "w.caffemodel", model, *model.init(0))
    result = run_cli("segment", "--model", tmp_path / "net.prototxt", "--weights",
                     tmp_path / "w.caffemodel", tmp_path / "missing.png")  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "missing.png" in result.stderr
    assert "Traceback" not in result.stderr
    (tmp_path / "bad.png").write_bytes(b"not an image")
    result = run_cli("segment", "--model", tmp_path / "net.prototxt", "--weights",
                     tmp_path / "w.caffemodel", tmp_path / "bad.png")  # fmt: skip
    assert result.returncode == 1 and result.stderr.strip().count("\n") == 0
    assert "bad.png: not an image file" in result.stderr
