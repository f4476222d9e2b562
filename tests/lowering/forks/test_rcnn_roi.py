"""ROIPooling (Faster R-CNN) and PSROIPooling (R-FCN), lowering/forks/rcnn_roi.py: OpenCV dnn
parity, hand-worked rounding and empty bins, float64 finite-difference gradients."""

from __future__ import annotations

import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from tests.lowering.opencv_parity import both, check_fd, input_layer, rel_to_max


def _rois(rng, r: int, n: int, w: float, h: float) -> np.ndarray:
    x1, x2 = np.sort(rng.uniform(-10, w + 10, (2, r)), axis=0)
    y1, y2 = np.sort(rng.uniform(-10, h + 10, (2, r)), axis=0)
    return np.stack([rng.integers(0, n, r), x1, y1, x2, y2], 1).astype(np.float32)


def _text(kind: str, x_shape, r_shape, param: str) -> str:
    field = "roi_pooling_param" if kind == "ROIPooling" else "psroi_pooling_param"
    return input_layer({"x": x_shape, "rois": r_shape}) + (
        f'layer {{ name: "y" type: "{kind}" bottom: "x" bottom: "rois" top: "y" '
        f"{field} {{ {param} }} }}\n"
    )


ROI_CASES = [
    ((2, 5, 12, 14), "pooled_h: 3 pooled_w: 4 spatial_scale: 0.0625"),
    ((1, 3, 9, 7), "pooled_h: 6 pooled_w: 6 spatial_scale: 0.03125"),  # bins of < 1 cell
    ((2, 4, 20, 20), "pooled_h: 2 pooled_w: 2 spatial_scale: 0.1"),
    ((1, 2, 5, 6), "pooled_h: 7 pooled_w: 7 spatial_scale: 1"),
]


@pytest.mark.parametrize(("shape", "param"), ROI_CASES)
def test_roi_pooling_matches_opencv(tmp_path, shape, param):
    rng = np.random.default_rng(shape[2])
    scale = float(param.split("spatial_scale: ")[1])
    x = rng.normal(size=shape).astype(np.float32)
    rois = _rois(rng, 9, shape[0], shape[3] / scale, shape[2] / scale)
    text = _text("ROIPooling", x.shape, rois.shape, param)
    ours, theirs = both(tmp_path, text, {"x": x, "rois": rois}, ["y"])
    assert rel_to_max(ours["y"], theirs["y"]) <= 1e-6


PS_CASES = [
    ((2, 18, 12, 14), "output_dim: 2 group_size: 3 spatial_scale: 0.0625"),
    ((1, 49, 8, 9), "output_dim: 1 group_size: 7 spatial_scale: 0.0625"),
    ((1, 16, 10, 10), "output_dim: 4 group_size: 2 spatial_scale: 0.5"),
]


@pytest.mark.parametrize(("shape", "param"), PS_CASES)
def test_psroi_pooling_matches_opencv(tmp_path, shape, param):
    rng = np.random.default_rng(shape[1])
    scale = float(param.split("spatial_scale: ")[1])
    x = rng.normal(size=shape).astype(np.float32)
    rois = _rois(rng, 8, shape[0], shape[3] / scale, shape[2] / scale)
    text = _text("PSROIPooling", x.shape, rois.shape, param)
    ours, theirs = both(tmp_path, text, {"x": x, "rois": rois}, ["y"])
    assert rel_to_max(ours["y"], theirs["y"]) <= 1e-5


def _run(kind, x, rois, param):
    model = caffe2jax.compile(_text(kind, x.shape, rois.shape, param))
    return np.asarray(model.apply({}, {}, {"x": x, "rois": rois})[0]["y"])


def test_roi_pooling_by_hand_rounds_halves_away_and_empty_bins_are_zero():
    """x·scale = 2.5 rounds to 3 (numpy would say 2); a roi entirely off the map pools 0."""
    x = np.arange(1, 1 + 6 * 6, dtype=np.float32).reshape(1, 1, 6, 6)
    rois = np.array([[0, 5, 5, 9, 9], [0, 40, 40, 50, 50]], np.float32)
    y = _run("ROIPooling", x, rois, "pooled_h: 1 pooled_w: 2 spatial_scale: 0.5")
    # corners (3, 3)–(5, 5) (4.5 → 5): width 3, bins [3, 4.5) → cols 3..4, [4.5, 6) → cols 4..5
    np.testing.assert_array_equal(y[0, 0, 0], [x[0, 0, 3:6, 3:5].max(), x[0, 0, 3:6, 4:6].max()])
    np.testing.assert_array_equal(y[1], 0)


def test_psroi_pooling_by_hand_averages_its_own_channel():
    x = np.random.default_rng(3).normal(size=(1, 4, 4, 4)).astype(np.float32)
    rois = np.array([[0, 0, 0, 3, 3]], np.float32)  # corners 0 and (3+1)·1 = 4: 2×2 cells/bin
    y = _run("PSROIPooling", x, rois, "output_dim: 1 group_size: 2 spatial_scale: 1")
    want = [[x[0, 2 * i + j, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2].mean() for j in range(2)]
            for i in range(2)]  # fmt: skip
    np.testing.assert_allclose(y[0, 0], want, rtol=1e-6)


@pytest.mark.parametrize(
    ("kind", "param", "channels"),
    [
        ("ROIPooling", "pooled_h: 2 pooled_w: 3 spatial_scale: 0.5", 2),
        ("PSROIPooling", "output_dim: 2 group_size: 2 spatial_scale: 0.5", 8),
    ],
)
def test_gradients_finite_differences(kind, param, channels):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, channels, 5, 6))
    rois = np.array([[0, 1, 1, 9, 7], [1, 0, 2, 5, 9], [0, 4, 0, 11, 9]], np.float64)
    check_fd(_text(kind, x.shape, rois.shape, param), {"x": x, "rois": rois}, "y",
             fixed=("rois",))  # fmt: skip


def test_psroi_pooling_refuses_wrong_channel_count():
    with pytest.raises(NetError, match="output_dim"):
        caffe2jax.compile(_text("PSROIPooling", (1, 10, 4, 4), (1, 5), "output_dim: 2 "
                                "group_size: 2 spatial_scale: 1"))  # fmt: skip
