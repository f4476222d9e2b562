"""ROIPooling (Faster R-CNN) and PSROIPooling (R-FCN), lowering/forks/rcnn_roi.py: OpenCV dnn
parity, hand-worked rounding and empty bins, float64 finite-difference gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.forks.rcnn_roi import psroi_bins
from tests import jitted
from tests.lowering import roi_loops
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
    return np.asarray(jitted.forward(model, {}, {}, {"x": x, "rois": rois})[0]["y"])


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


# --- the forks' own loops (tests/lowering/roi_loops.py), jitted as users run the layer ------

W_MAP = 80  # a map wide enough for every roi of the sweep and its float-rounded last bin


def _encoded(channels=2):
    """(1, 2, 80, 80): h·W + w + 1 and its negative, so a bin's max names its last and first
    cell exactly; an empty bin (0) is told apart from every real one."""
    cell = np.arange(W_MAP * W_MAP, dtype=np.float32).reshape(W_MAP, W_MAP) + 1
    return np.stack([cell, -cell])[None]


def _sweep_rois(scale: float, rng) -> np.ndarray:
    """Rois of every integer size 1–64 rows (and 65 − size columns) in feature cells, written
    in image pixels with fractional offsets that round to the same cell (halves included);
    then rois touching and crossing the map's edges."""
    s = np.arange(1, 65)
    start_h, start_w = s % 16, (s * 7) % 16
    cells = np.stack([start_w, start_h, start_w + 64 - s, start_h + s - 1], 1).astype(np.float64)
    jitter = rng.uniform(-0.49, 0.49, cells.shape)
    jitter[::9] = 0.5 * np.sign(jitter[::9])  # exact halves: C's round goes away from zero
    inside = (cells + jitter) / scale
    edges = np.array([[-3, -2, 10, 5], [70, 75, 79, 79], [-20, 60, 85, 90], [0, 0, 79, 79],
                      [78, -5, 95, 2], [40, 40, 30, 35]], np.float64) / scale  # fmt: skip
    boxes = np.concatenate([inside, edges]).astype(np.float32)
    return np.concatenate([np.zeros((len(boxes), 1), np.float32), boxes], 1)


def _expected_encoded(rois, pooled_h, pooled_w, scale):
    """The encoded map's top under the fork's bins (roi_loops.roi_bins)."""
    x1, y1, x2, y2 = np.array([roi_loops.roi_corners(roi, scale) for roi in rois]).T
    hs, he, _ = roi_loops.roi_bins(y1, y2, pooled_h, W_MAP)
    ws, we, _ = roi_loops.roi_bins(x1, x2, pooled_w, W_MAP)
    hs, he, ws, we = hs[:, :, None], he[:, :, None], ws[:, None], we[:, None]
    full = (he > hs) & (we > ws)
    last = np.where(full, (he - 1) * W_MAP + we, 0)
    first = np.where(full, -(hs * W_MAP + ws + 1), 0)
    return np.stack([last, first], 1).astype(np.float32)


def _roi_net(x_shape, r_shapes, layers) -> str:
    """Input (x and each rois blob) → one ROIPooling layer per (name, rois blob, pooled_h,
    pooled_w, scale)."""
    text = "force_backward: true\n" + input_layer({"x": x_shape, **r_shapes})
    for name, rois, ph, pw, scale in layers:
        text += (f'layer {{ name: "{name}" type: "ROIPooling" bottom: "x" bottom: "{rois}" '
                 f'top: "{name}" roi_pooling_param {{ pooled_h: {ph} pooled_w: {pw} '
                 f"spatial_scale: {scale!r} }} }}\n")  # fmt: skip
    return text


def test_roi_pooling_bins_equal_the_forks_for_every_size_and_pooled_size_jitted():
    """Every integer roi size 1–64 against pooled sizes 1–14 at spatial scales 1/16 and 1/32,
    and rois crossing the edges, through the compiled net under jax.jit: 0 bins differ from
    the fork's. Rois have heights 1–64 and widths 64–1; at 1/16 pooled_h = p, pooled_w = 15 − p
    (p = 1–7), at 1/32 the other way round, so each scale meets every pooled size 1–14."""
    x = _encoded()
    rois = {f"r{d}": _sweep_rois(1 / d, np.random.default_rng(d)) for d in (16, 32)}
    layers = [(f"a{p}", "r16", p, 15 - p, 1 / 16) for p in range(1, 8)]
    layers += [(f"b{p}", "r32", 15 - p, p, 1 / 32) for p in range(1, 8)]
    model = caffe2jax.compile(_roi_net(x.shape, {k: v.shape for k, v in rois.items()}, layers))
    blobs = jitted.forward(model, {}, {}, {"x": x, **rois})[0]
    for name, r, ph, pw, scale in layers:
        want = _expected_encoded(rois[r], ph, pw, scale)
        bad = np.argwhere((np.asarray(blobs[name]) != want).any(1))
        assert len(bad) == 0, f"{name}: {len(bad)} bins differ, first (roi, ph, pw) {bad[:3]}"


def test_roi_pooling_7x7_jitted_and_eager_equal_the_forks_loop():
    """The 7×7 head of every Faster R-CNN: forward of the fork's loop on integer rois of
    every size 1–64 (and edge rois), random data with ties, jitted and eager: equal."""
    rng = np.random.default_rng(7)
    rois = _sweep_rois(1 / 16, rng)
    x = np.round(rng.normal(size=(1, 3, W_MAP, W_MAP)), 1).astype(np.float32)  # ties
    layers = [("y", "rois", 7, 7, 1 / 16)]
    model = caffe2jax.compile(_roi_net(x.shape, {"rois": rois.shape}, layers))
    want, _ = roi_loops.roi_pool_forward(x, rois, 7, 7, 1 / 16)
    on_jit = jitted.forward(model, {}, {}, {"x": x, "rois": rois})[0]["y"]
    # eager on purpose: the layer must give the fork's bins on both paths
    eager = model.apply({}, {}, {"x": x, "rois": rois})[0]["y"]
    np.testing.assert_array_equal(np.asarray(on_jit), want)
    np.testing.assert_array_equal(np.asarray(eager), want)


ROI_BACKWARD = [  # (pooled_h, pooled_w, scale, roi rows in feature cells)
    # 7 bins of a 57-row roi: the fork's last bin ends at 57.000004 → one row past the roi, and
    # the encoded map puts the max there: the fork drops that diff
    (7, 7, 1 / 16, [[2, 3, 40, 59], [5, 1, 61, 57], [40, 20, 79, 79]]),
    # 22 bins of a 58-row roi: the feasible set misses bin 10 for row 29, 11 for row 62…
    (22, 3, 1 / 32, [[1, 0, 5, 57], [0, 10, 40, 67]]),
    # malformed (x2 < x1: forced to 1×1 forward, no diff back) and edge-crossing rois
    (3, 4, 1 / 16, [[10, 10, 5, 12], [-4, -6, 6, 9], [70, 72, 90, 95]]),
]


@pytest.mark.parametrize(("ph", "pw", "scale", "cells"), ROI_BACKWARD)
def test_roi_pooling_backward_is_the_forks_argmax_routing_in_value_and_grad(ph, pw, scale, cells):
    """jax.value_and_grad of a loss over the layer, jitted: the bottom diff equals the
    fork's ROIPoolBackward loop (first maximum on ties, in-roi and feasible-set tests)."""
    rng = np.random.default_rng(ph)
    tie = np.round(rng.normal(size=(1, 2, W_MAP, W_MAP)), 0).astype(np.float32)
    x = np.concatenate([_encoded(), tie, np.maximum(tie, 0)], 1)  # increasing, ties, ReLU zeros
    boxes = np.asarray(cells, np.float32) / np.float32(scale)
    rois = np.concatenate([np.zeros((len(boxes), 1), np.float32), boxes], 1)
    layers = [("y", "rois", ph, pw, scale)]
    model = caffe2jax.compile(_roi_net(x.shape, {"rois": rois.shape}, layers))
    g = rng.normal(size=(len(rois), x.shape[1], ph, pw)).astype(np.float32)

    def loss(x):
        return jnp.sum(jitted.forward(model, {}, {}, {"x": x, "rois": rois})[0]["y"] * g)

    value, dx = jax.jit(jax.value_and_grad(loss))(x)
    top, arg = roi_loops.roi_pool_forward(x, rois, ph, pw, scale)
    want = roi_loops.roi_pool_backward(x.shape, rois, arg, g, scale)
    np.testing.assert_allclose(float(value), float(np.sum(top.astype(np.float64) * g)), rtol=1e-6)
    # float32 sums of the same diffs in another order: 1 ulp of the largest sum
    np.testing.assert_allclose(np.asarray(dx), want, rtol=0, atol=4e-6 * np.abs(want).max())
    assert (np.asarray(dx) != 0).sum() == (want != 0).sum()


def _psroi_text(x_shape, r_shape, dim, k, scale):
    return "force_backward: true\n" + _text(
        "PSROIPooling", x_shape, r_shape,
        f"output_dim: {dim} group_size: {k} spatial_scale: {scale!r}",
    )  # fmt: skip


def test_psroi_pooling_bins_equal_the_forks_for_every_size_and_group_size_jitted():
    """R-FCN's bins (psroi_bins, jitted as the layer runs it) for every roi of 1–2048 pixels
    (1–64 cells at 1/32, 1–128 at 1/16), group sizes 1–14, fractional and edge-crossing
    corners: 0 bins differ from the kernel's float32 expressions."""
    rng = np.random.default_rng(3)
    pixels = np.arange(1, 2049, dtype=np.float32)
    x1 = rng.integers(-40, 1200, len(pixels)) + rng.uniform(-0.5, 0.5, len(pixels))
    x1 = x1.astype(np.float32)
    corners = np.array([roi_loops.psroi_corners([0, a, a, a + w - 1, a + w - 1], s)[::2]
                        for s in (1 / 16, 1 / 32) for a, w in zip(x1, pixels)])  # fmt: skip
    start, end = corners[:, 0], corners[:, 1]

    @jax.jit
    def bins(start, end):
        return [psroi_bins(start, end, k, W_MAP) for k in range(1, 15)]

    for k, (lo, hi) in enumerate(bins(start, end), 1):
        want_lo, want_hi = roi_loops.psroi_bins(start, end, k, W_MAP)
        assert (np.asarray(lo) != want_lo).sum() + (np.asarray(hi) != want_hi).sum() == 0, k


@pytest.mark.parametrize(("dim", "k", "scale"), [(2, 7, 1 / 16), (3, 3, 1 / 32), (1, 14, 1 / 16)])
def test_psroi_pooling_forward_and_even_spread_backward_equal_the_forks_loop(dim, k, scale):
    """value_and_grad of a loss over the layer, jitted, against PSROIPoolingForward and
    PSROIPoolingBackwardAtomic transcribed: same tops, same bottom diffs."""
    rng = np.random.default_rng(k)
    x = rng.normal(size=(2, dim * k * k, 30, 34)).astype(np.float32)
    rois = _rois(rng, 12, 2, 34 / scale, 30 / scale)
    rois[:3, 1:] = np.array([[-40, -40, 900, 900], [31.5, 16.5, 47.5, 80.5], [500, 8, 400, 7]])
    g = rng.normal(size=(len(rois), dim, k, k)).astype(np.float32)
    model = caffe2jax.compile(_psroi_text(x.shape, rois.shape, dim, k, scale))

    def loss(x):
        top = jitted.forward(model, {}, {}, {"x": x, "rois": rois})[0]["y"]
        return jnp.sum(top * g), top

    (_, top), dx = jax.jit(jax.value_and_grad(loss, has_aux=True))(x)
    want_top, want_dx = roi_loops.psroi_pool(x, rois, dim, k, scale, g)
    # float32 sums over a bin in another order than the kernel's running sum: a few ulps
    np.testing.assert_allclose(np.asarray(top), want_top, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(np.asarray(dx), want_dx, rtol=2e-6, atol=2e-6)
