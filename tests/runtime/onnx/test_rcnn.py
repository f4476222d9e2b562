"""Faster R-CNN's and R-FCN's region layers exported to ONNX, against the forks' own C++
transcribed as loops (rbgirshick/caffe-fast-rcnn roi_pooling_layer.cpp Forward_cpu,
Microsoft/caffe psroi_pooling_layer.cu PSROIPoolingForward), and py-faster-rcnn's proposal
layer against caffe2jax's built-in one.

ROIPooling is checked against the fork's loop rather than caffe2jax's lowering, whose bins
under jit are issue 32's (they differ from the fork's on some rois).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.runtime.onnx import onnx_runs
from tests.runtime.onnx.small_nets import net_text, random_model

F32 = np.float32


def c_round(v: float) -> int:
    return int(math.copysign(math.floor(abs(v) + 0.5), v))


def roi_pooling_loop(x, rois, pooled_h, pooled_w, scale) -> np.ndarray:
    """roi_pooling_layer.cpp Forward_cpu."""
    _, c, h, w = x.shape
    out = np.zeros((len(rois), c, pooled_h, pooled_w), F32)
    for r, roi in enumerate(rois):
        b = int(roi[0])
        x1, y1, x2, y2 = (c_round(F32(roi[i]) * F32(scale)) for i in (1, 2, 3, 4))
        bin_h = F32(max(y2 - y1 + 1, 1)) / F32(pooled_h)
        bin_w = F32(max(x2 - x1 + 1, 1)) / F32(pooled_w)
        for ph in range(pooled_h):
            for pw in range(pooled_w):
                hs = min(max(math.floor(F32(ph) * bin_h) + y1, 0), h)
                he = min(max(math.ceil(F32(ph + 1) * bin_h) + y1, 0), h)
                ws = min(max(math.floor(F32(pw) * bin_w) + x1, 0), w)
                we = min(max(math.ceil(F32(pw + 1) * bin_w) + x1, 0), w)
                if he > hs and we > ws:
                    out[r, :, ph, pw] = x[b, :, hs:he, ws:we].reshape(c, -1).max(axis=1)
    return out


def psroi_pooling_loop(x, rois, k, dim, scale) -> np.ndarray:
    """psroi_pooling_layer.cu PSROIPoolingForward, one thread per output value."""
    _, _, h, w = x.shape
    out = np.zeros((len(rois), dim, k, k), F32)
    for r, roi in enumerate(rois):
        b = int(roi[0])
        x1, y1 = F32(c_round(roi[1])) * F32(scale), F32(c_round(roi[2])) * F32(scale)
        x2 = F32(c_round(roi[3]) + 1.0) * F32(scale)
        y2 = F32(c_round(roi[4]) + 1.0) * F32(scale)
        bin_h = max(y2 - y1, F32(0.1)) / F32(k)
        bin_w = max(x2 - x1, F32(0.1)) / F32(k)
        for c in range(dim):
            for i in range(k):
                for j in range(k):
                    hs = min(max(math.floor(F32(i) * bin_h + y1), 0), h)
                    he = min(max(math.ceil(F32(i + 1) * bin_h + y1), 0), h)
                    ws = min(max(math.floor(F32(j) * bin_w + x1), 0), w)
                    we = min(max(math.ceil(F32(j + 1) * bin_w + x1), 0), w)
                    if he > hs and we > ws:
                        out[r, c, i, j] = x[b, (c * k + i) * k + j, hs:he, ws:we].mean()
    return out


def _rois(n: int, count: int, size: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    corners = np.sort(rng.uniform(-10, size + 10, (count, 2, 2)), axis=1).reshape(count, 4)
    corners = corners[:, [0, 2, 1, 3]]
    batch = rng.integers(0, n, (count, 1))
    return np.concatenate([batch, corners], axis=1).astype(F32)


ROI = ('layer { name: "pool" type: "ROIPooling" bottom: "x" bottom: "rois" top: "y" '
       "roi_pooling_param { pooled_h: 3 pooled_w: 4 spatial_scale: 0.25 } }")  # fmt: skip


@pytest.mark.parametrize("after_relu", [False, True])
def test_roi_pooling_equals_the_forks_loop(after_relu):
    """Features of both signs (the bins from primitives in a Loop) and after a ReLU (MaxRoiPool,
    whose maxima start from FLT_MIN: the same on non-negative features)."""
    layers = ROI.replace('bottom: "x"', 'bottom: "r"') if after_relu else ROI
    if after_relu:
        layers = 'layer { name: "relu" type: "ReLU" bottom: "x" top: "r" }\n' + layers
    model, params, state = random_model(net_text(layers, {"x": (2, 5, 8, 9), "rois": (11, 5)}))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 8, 9)).astype(F32)
    rois = _rois(2, 11, 36, seed=1)
    proto = onnx_runs.export(model, params, state)
    assert ("MaxRoiPool" in {n.op_type for n in proto.graph.node}) == after_relu
    got = onnx_runs.run(proto, {"x": x, "rois": rois})["y"]
    expected = roi_pooling_loop(np.maximum(x, 0) if after_relu else x, rois, 3, 4, 0.25)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-30 if after_relu else 0)


def test_psroi_pooling_equals_the_forks_loop():
    k, dim = 3, 2
    text = net_text(
        'layer { name: "ps" type: "PSROIPooling" bottom: "x" bottom: "rois" top: "y" '
        f"psroi_pooling_param {{ spatial_scale: 0.25 output_dim: {dim} group_size: {k} }} }}",
        {"x": (2, dim * k * k, 10, 12), "rois": (9, 5)},
    )
    model, params, state = random_model(text)
    x = np.random.default_rng(2).standard_normal((2, dim * k * k, 10, 12)).astype(F32)
    rois = _rois(2, 9, 48, seed=3)
    got = onnx_runs.run(onnx_runs.export(model, params, state), {"x": x, "rois": rois})["y"]
    np.testing.assert_allclose(got, psroi_pooling_loop(x, rois, k, dim, 0.25), rtol=2e-6,
                               atol=1e-6)  # fmt: skip


def test_proposal_layer_keeps_caffe2jaxs_rois():
    """py-faster-rcnn's proposal layer (built in) on random scores and deltas: the same rois
    and scores, in the same order (the scores have no ties)."""
    a, h, w = 9, 6, 7
    text = net_text(
        'layer { name: "proposal" type: "Python" bottom: "cls" bottom: "bbox" '
        'bottom: "im_info" top: "rois" top: "scores" python_param { module: '
        "'rpn.proposal_layer' layer: 'ProposalLayer' param_str: \"'feat_stride': 16\" } }",
        {"cls": (1, 2 * a, h, w), "bbox": (1, 4 * a, h, w), "im_info": (1, 3)},
    )
    model, params, state = random_model(text)
    rng = np.random.default_rng(4)
    inputs = {
        "cls": rng.uniform(0, 1, (1, 2 * a, h, w)).astype(F32),
        "bbox": rng.normal(0, 0.3, (1, 4 * a, h, w)).astype(F32),
        "im_info": np.array([[96.0, 112.0, 1.2]], F32),
    }
    got = onnx_runs.run(onnx_runs.export(model, params, state), inputs)
    ours = onnx_runs.reference(model, params, state, inputs)
    for top in ("rois", "scores"):
        np.testing.assert_allclose(got[top], ours[top], rtol=1e-5, atol=1e-4)
    assert (got["scores"] > 0).sum() > 20
