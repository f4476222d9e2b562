"""TextBoxes++ (lowering/forks/textboxes.py): PriorBox ``denser_prior_boxes`` and the polygon
DetectionOutput, jitted, against loops transcribed from MhLiao/TextBoxes_plusplus@39d4898
(prior_box_layer.cpp Forward_cpu, bbox_util.cpp DecodeBBoxPolygon, detection_output_layer.cpp
with use_polygon); the refusals; a small TextBoxes++ net (its deploy.prototxt's wiring: 12
locations per prior, denser priors) compiled and run. The fork's models/deploy.prototxt was
read while developing, not committed."""

from __future__ import annotations

import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from tests import jitted
from tests.lowering.forks.detection_loops import decode_center_size, detections, kept_rows
from tests.lowering.forks.test_ssd import fork_prior_box
from tests.lowering.opencv_parity import input_layer

f32 = np.float32
PRIOR = (
    "min_size: 12 max_size: 24 aspect_ratio: 2 aspect_ratio: 5 flip: false clip: false "
    "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 denser_prior_boxes: true"
)
K = 2 * (1 + 1 + 2)  # (min, max, 2 ratios) x 2


def fork_denser(fh, fw, ih, iw):
    """Forward_cpu with denser_prior_boxes: each SSD prior, then a copy centred at
    (h + 1.0) * step_h (x unchanged)."""
    ssd = fork_prior_box(fh, fw, ih, iw, [12], [24], [2, 5], flip=False).reshape(fh, fw, -1, 4)
    step_h = f32(ih) / f32(fh)
    out = np.empty((fh, fw, ssd.shape[2], 2, 4), np.float32)
    for h in range(fh):
        cy1 = f32((h + 1.0) * float(step_h))
        for w in range(fw):
            for k in range(ssd.shape[2]):
                box = ssd[h, w, k]
                bh = [12, np.float32(np.sqrt(12 * 24)), 12 / np.sqrt(2), 12 / np.sqrt(5)][k]
                bh = float(f32(bh))
                out[h, w, k, 0] = box
                out[h, w, k, 1] = [box[0], f32((float(cy1) - bh / 2.0) / ih), box[2],
                                   f32((float(cy1) + bh / 2.0) / ih)]  # fmt: skip
    return out.reshape(-1)


def _prior_net(fh=3, fw=4, ih=40, iw=36) -> tuple[str, dict]:
    shapes = {"data": (1, 3, ih, iw), "feat": (1, 2, fh, fw)}
    text = input_layer(shapes) + (
        'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
        f"prior_box_param {{ {PRIOR} }} }}\n"
    )
    return text, {k: np.zeros(s, np.float32) for k, s in shapes.items()}


def test_denser_prior_boxes_equal_the_forks_loop_bit_for_bit():
    text, inputs = _prior_net()
    model = caffe2jax.compile(text)
    assert model.net.layers[-1].form == "textboxes" and "textboxes" in model.net.dialect
    pb = np.asarray(jitted.forward(model, {}, {}, inputs)[0]["pb"])
    assert pb.shape == (1, 2, 3 * 4 * K * 4)
    want = fork_denser(3, 4, 40, 36)
    np.testing.assert_array_equal(pb[0, 0].view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(pb[0, 1], np.tile(f32([0.1, 0.1, 0.2, 0.2]), 3 * 4 * K))


def test_denser_hand_worked_first_cell():
    """Cell (0, 0) of a 2x2 map on 20x20 (step 10): the 12-pixel prior at (5, 5) and its copy
    at (5, 10)."""
    shapes = {"data": (1, 3, 20, 20), "feat": (1, 1, 2, 2)}
    text = input_layer(shapes) + (
        'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
        "prior_box_param { min_size: 12 denser_prior_boxes: true } }\n"
    )
    model = caffe2jax.compile(text)
    inputs = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    pb = np.asarray(jitted.forward(model, {}, {}, inputs)[0]["pb"])[0, 0]
    np.testing.assert_allclose(pb[:8], [-0.05, -0.05, 0.55, 0.55, -0.05, 0.2, 0.55, 0.8],
                               rtol=1e-6)  # fmt: skip


def _det_net(n, priors_per_cell, param, hw=3) -> tuple[str, dict]:
    p = hw * hw * priors_per_cell
    shapes = {"data": (n, 3, 30, 30), "feat": (n, 2, hw, hw), "loc": (n, p * 12),
              "conf": (n, p * 2)}  # fmt: skip
    text = input_layer(shapes) + (
        'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
        "prior_box_param { min_size: 10 max_size: 20 denser_prior_boxes: true "
        "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 } }\n"
        'layer { name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "pb" '
        f'top: "det" detection_output_param {{ num_classes: 2 {param} }} }}\n'
    )
    rng = np.random.default_rng(n + len(param))
    conf = rng.uniform(size=(n, p))
    inputs = {
        "data": np.zeros(shapes["data"], np.float32),
        "feat": np.zeros(shapes["feat"], np.float32),
        "loc": (rng.normal(size=shapes["loc"]) * 0.5).astype(np.float32),
        "conf": np.stack([1 - conf, conf], -1).reshape(n, -1).astype(np.float32),
    }
    return text, inputs


def fork_polygon(prior, var, quad):
    """DecodeBBoxPolygon's CENTER_SIZE branch (variances in the prior), float arithmetic."""
    pw, ph = f32(prior[2] - prior[0]), f32(prior[3] - prior[1])
    corners = [(prior[0], prior[1]), (prior[2], prior[1]), (prior[2], prior[3]),
               (prior[0], prior[3])]  # fmt: skip
    out = []
    for k, (x0, y0) in enumerate(corners):
        out += [
            f32(f32(var[0] * quad[2 * k]) * pw + x0),
            f32(f32(var[1] * quad[2 * k + 1]) * ph + y0),
        ]
    return np.array(out, np.float32)


@pytest.mark.parametrize(("n", "param"), [
    (1, "code_type: CENTER_SIZE confidence_threshold: 0.3 "
        "nms_param { nms_threshold: 0.45 top_k: 30 }"),
    (2, "code_type: CENTER_SIZE use_polygon: true keep_top_k: 6 confidence_threshold: 0.2 "
        "nms_param { nms_threshold: 0.3 top_k: 100 }"),
])  # fmt: skip
def test_polygon_detection_output_matches_the_forks_loop(n, param):
    text, inputs = _det_net(n, 4, param)
    model = caffe2jax.compile(text)
    assert model.net.layers[-1].form == "textboxes"  # use_polygon unset: the dialect's default
    blobs = {k: np.asarray(v) for k, v in jitted.forward(model, {}, {}, inputs)[0].items()}
    p = 3 * 3 * 4
    priors, var = blobs["pb"][0, 0].reshape(p, 4), blobs["pb"][0, 1].reshape(p, 4)
    loc = inputs["loc"].reshape(n, p, 12)
    rows = np.zeros((n, p, 12), np.float32)
    for i in range(n):
        for j in range(p):
            rows[i, j, :4] = decode_center_size(priors[j], var[j], loc[i, j, :4])
            rows[i, j, 4:] = fork_polygon(priors[j], var[j], loc[i, j, 4:])
    threshold = f32(0.3) if n == 1 else f32(0.2)
    nms, top_k, keep = (f32(0.45), 30, -1) if n == 1 else (f32(0.3), 100, 6)
    want = detections(rows, inputs["conf"].reshape(n, p, 2), threshold, nms, top_k, keep)
    got = kept_rows(blobs["det"])
    assert blobs["det"].shape[-1] == 15 and got.shape == want.shape
    np.testing.assert_array_equal(got[:, :3], want[:, :3])
    # under jit XLA may fuse v·q·w + corner into one multiply-add (one rounding fewer)
    np.testing.assert_allclose(got[:, 3:], want[:, 3:], rtol=0, atol=2e-7)


def test_refusals_name_the_layer():
    text, inputs = _det_net(1, 4, "code_type: CENTER_SIZE use_polygon: false")
    with pytest.raises(NetError, match="layer 'det'.*use_polygon: false"):
        jitted.forward(caffe2jax.compile(text), {}, {}, inputs)
    text, inputs = _det_net(1, 4, "code_type: CORNER")
    with pytest.raises(NetError, match="layer 'det'.*CENTER_SIZE"):
        jitted.forward(caffe2jax.compile(text), {}, {}, inputs)


def test_a_textboxes_net_compiles_and_runs_forward():
    """One head as TextBoxes++' deploy.prototxt wires it: 3x5 kernels, denser priors with
    ratios 2 and 5 (flip), 12 locations per prior, softmax over 2 classes."""
    k = 2 * (1 + 1 + 4)  # (min, max, 2, 1/2, 5, 1/5) x 2
    text = input_layer({"data": (1, 3, 32, 32)}) + (
        'layer { name: "feat" type: "Convolution" bottom: "data" top: "feat" convolution_param '
        '{ num_output: 8 kernel_size: 3 stride: 8 pad: 1 weight_filler { type: "xavier" } } }\n'
        f'layer {{ name: "loc" type: "Convolution" bottom: "feat" top: "loc" convolution_param '
        f'{{ num_output: {k * 12} kernel_h: 3 kernel_w: 5 pad_h: 1 pad_w: 2 '
        'weight_filler { type: "gaussian" std: 0.01 } } }\n'
        f'layer {{ name: "conf" type: "Convolution" bottom: "feat" top: "conf" convolution_param '
        f'{{ num_output: {k * 2} kernel_h: 3 kernel_w: 5 pad_h: 1 pad_w: 2 '
        'weight_filler { type: "gaussian" std: 0.1 } } }\n'
        'layer { name: "loc_p" type: "Permute" bottom: "loc" top: "loc_p" permute_param '
        "{ order: 0 order: 2 order: 3 order: 1 } }\n"
        'layer { name: "loc_f" type: "Flatten" bottom: "loc_p" top: "loc_f" }\n'
        'layer { name: "conf_p" type: "Permute" bottom: "conf" top: "conf_p" permute_param '
        "{ order: 0 order: 2 order: 3 order: 1 } }\n"
        'layer { name: "conf_r" type: "Reshape" bottom: "conf_p" top: "conf_r" reshape_param '
        "{ shape { dim: 0 dim: -1 dim: 2 } } }\n"
        'layer { name: "conf_s" type: "Softmax" bottom: "conf_r" top: "conf_s" '
        "softmax_param { axis: 2 } }\n"
        'layer { name: "conf_f" type: "Flatten" bottom: "conf_s" top: "conf_f" }\n'
        'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
        "prior_box_param { min_size: 8 max_size: 16 aspect_ratio: 2 aspect_ratio: 5 flip: true "
        "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 denser_prior_boxes: true } }\n"
        'layer { name: "det" type: "DetectionOutput" bottom: "loc_f" bottom: "conf_f" '
        'bottom: "pb" top: "det" detection_output_param { num_classes: 2 code_type: CENTER_SIZE '
        "keep_top_k: 8 confidence_threshold: 0.1 nms_param { nms_threshold: 0.45 top_k: 50 } } }\n"
    )  # fmt: skip
    model = caffe2jax.compile(text)
    params, state = model.init(0)
    x = np.random.default_rng(5).normal(size=(1, 3, 32, 32)).astype(np.float32)
    det = np.asarray(jitted.forward(model, params, state, {"data": x})[0]["det"])
    assert det.shape == (1, 1, 8, 15) and np.isfinite(det).all()
    assert len(kept_rows(det)) >= 1
