"""Image decoding and resizing (runtime/data/transform/image.py) on OpenCV 4 or 5: only the
calls both versions share are made (``imdecode``, ``resize`` and their flags; never
``cv2.dnn``, which OpenCV 5 rewrote), the pixels are Caffe's (the same bytes as the Pillow
decoder, and OpenCV's INTER_LINEAR by hand), and the runtime dependency admits OpenCV 5.
.ci/run runs this file again in an environment where OpenCV 5 is installed."""

from __future__ import annotations

import ast
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from caffe2jax.runtime.data.transform import image
from caffe2jax.runtime.data.transform.image import (
    decode_image,
    encode_image,
    resize,
    resize_nearest,
)

ROOT = Path(__file__).resolve().parents[3]
RNG = np.random.default_rng(38)
# What OpenCV 4.5+ and 5.x both have, with the same meaning, and all that decoding may use.
SHARED = {
    "imdecode", "resize", "error", "IMREAD_ANYCOLOR", "IMREAD_COLOR", "IMREAD_GRAYSCALE",
    "INTER_LINEAR", "INTER_NEAREST",
}  # fmt: skip


class Recording(types.ModuleType):
    """cv2 seen through a list of the names read from it; ``dnn`` is not there."""

    def __init__(self, real):
        super().__init__("cv2")
        self.real, self.used = real, set()

    def __getattr__(self, name):
        if name == "dnn":
            raise AttributeError("cv2.dnn is not part of the decode path")
        self.used.add(name)
        return getattr(self.real, name)


@pytest.fixture
def recording(monkeypatch):
    import cv2  # a dependency of caffe2jax: a missing one fails

    fake = Recording(cv2)
    monkeypatch.setitem(sys.modules, "cv2", fake)
    monkeypatch.setenv("CAFFE2JAX_IMAGE_DECODER", "cv2")
    image._cv2.cache_clear()
    yield fake
    image._cv2.cache_clear()


def pil_decoded(data: bytes, mode: str, monkeypatch) -> np.ndarray:
    monkeypatch.setenv("CAFFE2JAX_IMAGE_DECODER", "pil")
    image._cv2.cache_clear()
    try:
        return decode_image(data, mode)
    finally:
        monkeypatch.setenv("CAFFE2JAX_IMAGE_DECODER", "cv2")
        image._cv2.cache_clear()


def test_decoding_uses_only_what_opencv_4_and_5_share(recording, monkeypatch):
    chw = RNG.integers(0, 256, (3, 17, 23), dtype=np.uint8)
    for ext in ("jpg", "png", "bmp"):
        data = encode_image(chw, ext)
        for mode in ("color", "native", "gray"):
            ours = decode_image(data, mode)
            theirs = pil_decoded(data, mode, monkeypatch)
            assert ours.shape == theirs.shape, (ext, mode)
            # gray of a PNG/BMP: OpenCV's own converter against BGR2GRAY's weights, within 1
            tol = 1 if mode == "gray" and ext != "jpg" else 0
            assert np.abs(ours.astype(int) - theirs).max() <= tol, (
                ext,
                mode,
                recording.real.__version__,
            )
        if ext == "png":
            assert np.array_equal(decode_image(data, "color"), chw)  # lossless: the BGR bytes
    assert recording.used <= SHARED and "imdecode" in recording.used


def test_resizing_is_opencv_inter_linear_and_nearest(recording):
    # 2 → 4 columns: source x = (dx + 0.5)/2 − 0.5 = −0.25, 0.25, 0.75, 1.25 → clamped ends.
    row = np.array([[[0, 200]]], np.uint8)
    assert resize(row, 1, 4).tolist() == [[[0, 50, 150, 200]]]
    labels = np.arange(12, dtype=np.uint8).reshape(1, 3, 4)
    # INTER_NEAREST: source index floor(x · src/dst): rows 0,0,1,1,2,2; columns 0,2
    assert resize_nearest(labels, 6, 2)[0].tolist() == [[0, 2], [0, 2], [4, 6], [4, 6],
                                                        [8, 10], [8, 10]]  # fmt: skip
    color = RNG.integers(0, 256, (3, 9, 7), dtype=np.uint8)
    assert resize(color, 5, 11).shape == (3, 5, 11)
    assert recording.used <= SHARED and {"resize", "INTER_LINEAR"} <= recording.used


def dnn_uses(source: str) -> int:
    """How many times code (not prose) reaches cv2.dnn: ``cv2.dnn``, ``import cv2.dnn``,
    ``from cv2 import dnn``."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "dnn":
            count += isinstance(node.value, ast.Name) and node.value.id == "cv2"
        elif isinstance(node, ast.Import):
            count += any(alias.name.startswith("cv2.dnn") for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cv2"):
            count += node.module.startswith("cv2.dnn") or any(a.name == "dnn" for a in node.names)
    return count


def test_no_cv2_dnn_outside_tests_benchmarks_and_interop():
    """cv2.dnn (OpenCV 4's Caffe importer: the parity oracle) is used only by tests/,
    benchmarks/ and the interop code (runtime/onnx/compare.py, `caffe2jax compare --opencv`)."""
    assert dnn_uses("import cv2\nnet = cv2.dnn.readNetFromCaffe(p)\nfrom cv2 import dnn") == 2
    interop = ROOT / "runtime" / "onnx"
    found = []
    for folder in ("caffe2jax", "frontend", "lowering", "runtime", "examples", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            if interop not in path.parents and dnn_uses(path.read_text()):
                found.append(str(path.relative_to(ROOT)))
    assert found == []
    assert dnn_uses((interop / "compare.py").read_text()) > 0  # the one place it is allowed


def test_the_runtime_dependency_admits_opencv_5():
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    (opencv,) = re.findall(r'"(opencv[^"]*)"', block)
    assert opencv == "opencv-python-headless>=4.5"  # no upper bound: OpenCV 5 stays installed
    for extra in ("interop", "bench", "dev"):  # OpenCV 4's dnn module, the tests' oracle
        found = re.search(rf"^{extra} = \[(.*?)\]", text, re.S | re.M).group(1)
        assert '"opencv-python-headless<5"' in found, extra
