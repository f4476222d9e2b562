"""FaceBoxes' PriorBox (lowering/forks/faceboxes.py, form ``faceboxes``), jitted, against its
Forward_cpu transcribed from sfzhang15/FaceBoxes@b52cc92 (src/caffe/layers/prior_box_layer.cpp)
bit for bit; a hand-worked cell; the dialect that selects it; the count refusal; a small
FaceBoxes net (its deploy.prototxt's three PriorBox layers: min sizes 32/64/128, 256, 512)
compiled and run with a DetectionOutput. The fork's models/faceboxes/deploy.prototxt was read
while developing, not committed."""

from __future__ import annotations

import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from tests import jitted
from tests.lowering.forks.detection_loops import kept_rows
from tests.lowering.opencv_parity import input_layer

f32 = np.float32


def fork_faceboxes(fh, fw, ih, iw, min_sizes, step, offset=0.5):
    """Forward_cpu: centres (w + offset)·step in float; min size 32 → 4x4 priors 8 px apart,
    64 → 2x2 16 px apart, else one; each spans centre ∓ (side − 1)/2., divided in double."""
    out = []
    for h in range(fh):
        for w in range(fw):
            cx, cy = f32(f32(w + offset) * f32(step)), f32(f32(h + offset) * f32(step))
            for ms in (int(m) for m in min_sizes):
                half = (float(f32(ms)) - 1) / 2.0
                n, gap = {32: (4, 8), 64: (2, 16)}.get(ms, (1, 0))
                for i in range(-(n // 2), n - n // 2):
                    for j in range(-(n // 2), n - n // 2):
                        x, y = float(f32(cx + f32(j * gap))), float(f32(cy + f32(i * gap)))
                        out += [f32((x - half) / iw), f32((y - half) / ih),
                                f32((x + half) / iw), f32((y + half) / ih)]  # fmt: skip
    return np.asarray(out, np.float32)


def _net(min_sizes, step, fh, fw, ih, iw, extra="") -> tuple[str, dict]:
    shapes = {"data": (1, 3, ih, iw), "feat": (1, 2, fh, fw)}
    sizes = " ".join(f"min_size: {m}" for m in min_sizes)
    text = input_layer(shapes) + (
        'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
        f"prior_box_param {{ {sizes} clip: false variance: 0.1 variance: 0.1 variance: 0.2 "
        f"variance: 0.2 step: {step} offset: 0.5 {extra} }} }}\n"
    )
    return text, {k: np.zeros(s, np.float32) for k, s in shapes.items()}


@pytest.mark.parametrize(("min_sizes", "step", "fh", "fw"), [
    ([32, 64, 128], 32, 4, 3),
    ([256], 64, 2, 2),
])  # fmt: skip
def test_priors_equal_the_forks_loop_bit_for_bit(min_sizes, step, fh, fw):
    text, inputs = _net(min_sizes, step, fh, fw, 130, 100)
    model = caffe2jax.compile(text, dialect="faceboxes")
    assert model.net.layers[-1].form == "faceboxes"
    pb = np.asarray(jitted.forward(model, {}, {}, inputs)[0]["pb"])
    want = fork_faceboxes(fh, fw, 130, 100, min_sizes, step)
    np.testing.assert_array_equal(pb[0, 0].view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(pb[0, 1], np.tile(f32([0.1, 0.1, 0.2, 0.2]), want.size // 4))


def test_hand_worked_first_cell_has_21_priors():
    """Cell (0, 0), step 32 on 64x64: centre 16. Prior 0 (32, i = j = −2) is centred at
    (0, 0): ±15.5 px; prior 16 (64, i = j = −1) at (0, 0): ±31.5; prior 20 (128) at (16, 16)."""
    text, inputs = _net([32, 64, 128], 32, 2, 2, 64, 64)
    model = caffe2jax.compile(text)  # the dialect from the text: three min sizes, 32 and 64
    assert model.net.dialect == "faceboxes"
    pb = np.asarray(jitted.forward(model, {}, {}, inputs)[0]["pb"])[0, 0].reshape(2, 2, 21, 4)
    np.testing.assert_allclose(pb[0, 0, 0], np.array([-15.5, -15.5, 15.5, 15.5]) / 64, rtol=1e-6)
    np.testing.assert_allclose(pb[0, 0, 16], np.array([-31.5, -31.5, 31.5, 31.5]) / 64, rtol=1e-6)
    np.testing.assert_allclose(pb[0, 0, 20], (16 + np.array([-63.5, -63.5, 63.5, 63.5])) / 64,
                               rtol=1e-6)  # fmt: skip
    np.testing.assert_allclose(pb[0, 0, 3], np.array([24 - 15.5, -15.5, 24 + 15.5, 15.5]) / 64,
                               rtol=1e-6)  # fmt: skip  # i = −2, j = 1: x = 16 + 8


def test_plain_ssd_nets_keep_ssds_priorbox():
    text, _ = _net([30], 8, 2, 2, 64, 64)
    model = caffe2jax.compile(text)
    assert model.net.layers[-1].form == "" and "faceboxes" not in model.net.dialect


def test_a_count_the_fork_would_overrun_is_refused():
    """Three min sizes make the fork count 21 priors; with an aspect ratio it would write
    more than that, past its top."""
    text, inputs = _net([32, 64, 128], 32, 2, 2, 64, 64, extra="aspect_ratio: 2 flip: false")
    with pytest.raises(NetError, match="layer 'pb'.*declares 21 priors per cell but"):
        jitted.forward(caffe2jax.compile(text), {}, {}, inputs)


def _head(feat: str, priors: int, sizes: str, step: int) -> str:
    return (
        f'layer {{ name: "{feat}_loc" type: "Convolution" bottom: "{feat}" top: "{feat}_loc" '
        f'convolution_param {{ num_output: {priors * 4} kernel_size: 3 pad: 1 '
        'weight_filler { type: "gaussian" std: 0.01 } } }\n'
        f'layer {{ name: "{feat}_conf" type: "Convolution" bottom: "{feat}" top: "{feat}_conf" '
        f'convolution_param {{ num_output: {priors * 2} kernel_size: 3 pad: 1 '
        'weight_filler { type: "gaussian" std: 0.1 } } }\n'
        + "".join(
            f'layer {{ name: "{feat}_{k}_p" type: "Permute" bottom: "{feat}_{k}" '
            f'top: "{feat}_{k}_p" permute_param {{ order: 0 order: 2 order: 3 order: 1 }} }}\n'
            f'layer {{ name: "{feat}_{k}_f" type: "Flatten" bottom: "{feat}_{k}_p" '
            f'top: "{feat}_{k}_f" }}\n'
            for k in ("loc", "conf")
        )
        + f'layer {{ name: "{feat}_pb" type: "PriorBox" bottom: "{feat}" bottom: "data" '
        f'top: "{feat}_pb" prior_box_param {{ {sizes} clip: false variance: 0.1 variance: 0.1 '
        f"variance: 0.2 variance: 0.2 step: {step} offset: 0.5 }} }}\n"
    )  # fmt: skip


def test_a_faceboxes_net_compiles_and_runs_forward():
    """Two heads as FaceBoxes' deploy.prototxt: 21 priors (32/64/128) at stride 32, one (256)
    at stride 64; concatenated, softmaxed, DetectionOutput."""
    conv = ('layer {{ name: "{0}" type: "Convolution" bottom: "{1}" top: "{0}" '
            'convolution_param {{ num_output: 8 kernel_size: 3 stride: {2} pad: 1 '
            'weight_filler {{ type: "xavier" }} }} }}\n')  # fmt: skip
    cat = ('layer {{ name: "{0}" type: "Concat" bottom: "a_{1}" bottom: "b_{1}" top: "{0}" '
           "concat_param {{ axis: {2} }} }}\n")  # fmt: skip
    text = (
        input_layer({"data": (1, 3, 128, 128)})
        + conv.format("a", "data", 32) + conv.format("b", "a", 2)
        + _head("a", 21, "min_size: 32 min_size: 64 min_size: 128", 32)
        + _head("b", 1, "min_size: 256", 64)
        + cat.format("loc", "loc_f", 1) + cat.format("conf", "conf_f", 1)
        + cat.format("pb", "pb", 2)
        + 'layer { name: "conf_r" type: "Reshape" bottom: "conf" top: "conf_r" reshape_param '
        "{ shape { dim: 0 dim: -1 dim: 2 } } }\n"
        'layer { name: "conf_s" type: "Softmax" bottom: "conf_r" top: "conf_s" '
        "softmax_param { axis: 2 } }\n"
        'layer { name: "conf_fl" type: "Flatten" bottom: "conf_s" top: "conf_fl" }\n'
        'layer { name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf_fl" '
        'bottom: "pb" top: "det" detection_output_param { num_classes: 2 code_type: CENTER_SIZE '
        "keep_top_k: 20 confidence_threshold: 0.05 "
        "nms_param { nms_threshold: 0.3 top_k: 100 } } }\n"
    )  # fmt: skip
    model = caffe2jax.compile(text)
    assert model.net.dialect == "faceboxes"
    assert {layer.form for layer in model.net.layers if layer.type == "PriorBox"} == {"faceboxes"}
    params, state = model.init(0)
    x = np.random.default_rng(7).normal(size=(1, 3, 128, 128)).astype(np.float32)
    blobs, _ = jitted.forward(model, params, state, {"data": x})
    assert np.asarray(blobs["pb"]).shape == (1, 2, (4 * 4 * 21 + 2 * 2) * 4)
    det = np.asarray(blobs["det"])
    assert det.shape == (1, 1, 20, 7) and np.isfinite(det).all() and len(kept_rows(det)) >= 1
