"""`caffe2jax detect` (caffe2jax/cli/detect.py) and examples/detection/draw_detections.py, run
as a user would, in a subprocess: one line per detection, the same as caffe2jax.detect; one
line errors with a non-zero exit; the example writes the image with its boxes drawn."""

from __future__ import annotations

import subprocess
import sys

import cv2
import numpy as np
import pytest

import caffe2jax
from caffe2jax.runtime.formats.weights import save_weights
from tests.cli_runner import run_cli
from tests.golden import ROOT

EXAMPLE = ROOT / "examples" / "detection"
TINY_SSD = EXAMPLE / "tiny_ssd.prototxt"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("detect")
    model = caffe2jax.compile(TINY_SSD)
    params, state = model.init(0)
    weights = save_weights(tmp / "tiny.caffemodel", model, params, state)
    image = np.random.default_rng(3).integers(0, 256, (60, 90, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp / "noise.png"), image)
    (tmp / "labels.txt").write_text("background\ncat\ndog\nbird\n")
    return tmp, model, params, state, weights, image


def test_detect_prints_one_line_per_detection(files):
    tmp, model, params, state, weights, image = files
    proc = run_cli("detect", TINY_SSD, weights, tmp / "noise.png", "--mean", "127.5",
                   "--scale", "0.007843", "--labels", tmp / "labels.txt",
                   "--threshold", "0.5")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    want = caffe2jax.detect(model, params, state, image, mean=(127.5,) * 3, scale=0.007843,
                            threshold=0.5, names=["background", "cat", "dog", "bird"])  # fmt: skip
    assert len(lines) == len(want) > 0
    for line, d in zip(lines, want):
        path, label, name, score, *box = line.split()
        assert path.endswith("noise.png") and int(label) == d.label and name == d.name
        assert float(score) >= 0.5 and abs(float(score) - d.score) < 1e-4
        np.testing.assert_allclose([float(v) for v in box], [d.xmin, d.ymin, d.xmax, d.ymax],
                                   atol=0.05)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.png"], "missing.png: could not open or find file"),
        (["labels.txt"], "not an image OpenCV can decode"),
        (["noise.png", "--mean", "1,2"], "--mean takes one value or three"),
    ],
)
def test_detect_errors_are_one_line(files, args, message):
    tmp, *_, weights, _ = files
    args = [str(tmp / args[0]), *args[1:]]
    proc = run_cli("detect", TINY_SSD, weights, *args)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("caffe2jax detect: error: ") and message in line


def test_draw_detections_example_writes_the_boxes(files):
    tmp, *_, weights, image = files
    out = tmp / "drawn.png"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / "draw_detections.py"), str(TINY_SSD), str(weights),
         str(tmp / "noise.png"), str(out), "--mean", "127.5", "--scale", "0.007843",
         "--threshold", "0.6"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(float(line.split()[3]) >= 0.6 for line in lines)
    drawn = cv2.imread(str(out))
    assert drawn.shape == image.shape
    assert (drawn != image).any(axis=2).sum() > 50  # the boxes' pixels


def test_detect_refuses_unreadable_labels_and_huge_headers_in_one_line(files, tmp_path):
    """Non-UTF-8 --labels; a PNG whose header claims 60000 × 60000 (refused from its header,
    before OpenCV tries to decode it)."""
    tmp, *_, weights, _ = files
    (tmp_path / "latin1.txt").write_bytes(b"background\ncaf\xe9\n")
    png = cv2.imencode(".png", np.zeros((2, 2, 3), np.uint8))[1].tobytes()
    huge = png[:16] + (60000).to_bytes(4, "big") * 2 + png[24:]  # IHDR width, height
    (tmp_path / "huge.png").write_bytes(huge)
    for args, message in (
        ([tmp / "noise.png", "--labels", tmp_path / "latin1.txt"], "--labels must be UTF-8"),
        ([tmp_path / "huge.png"], "declares 60000 x 60000 pixels"),
    ):
        proc = run_cli("detect", TINY_SSD, weights, *args)
        assert proc.returncode == 1
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("caffe2jax detect: error: ") and message in line, line


@pytest.mark.parametrize(
    ("image", "mean", "message"),
    [
        (None, (0, 0, 0), "got NoneType"),
        (np.zeros((0, 0, 3), np.uint8), (0, 0, 0), "H, W >= 1"),
        (np.zeros((8, 8, 3), np.uint8), (1, 2), "one finite value or three"),
        (np.zeros((8, 8, 3), np.uint8), ("a", "b", "c"), "one number or three"),
    ],
)
def test_detect_api_refuses_bad_images_and_means(files, image, mean, message):
    from caffe2jax.frontend.errors import DataError

    _, model, params, state, *_ = files
    with pytest.raises(DataError, match=message):
        caffe2jax.detect(model, params, state, image, mean=mean)
