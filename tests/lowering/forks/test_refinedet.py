"""RefineDet's DetectionOutput (lowering/forks/refinedet.py, form ``refinedet``): parity,
jitted, with Forward_cpu transcribed from sfzhang15/RefineDet@52b6fe2 (OSGetConfidenceScores,
CasRegDecodeBBoxesAll, ApplyNMSFast: tests/lowering/forks/detection_loops.py); hand-worked
objectness cases; the refusals; a small RefineDet net (ARM + ODM heads, 5-bottom
DetectionOutput) compiled and run forward. Written here: the fork's own deploy nets come from
its Python generators (examples/refinedet/*.py), not committed."""

from __future__ import annotations

import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from tests import jitted
from tests.lowering.forks.detection_loops import decode_center_size, detections, kept_rows
from tests.lowering.opencv_parity import input_layer

C, HW, K = 3, 3, 3  # classes (0 background), feature side, priors per cell (min, max, ratio 2)
P = HW * HW * K
PRIOR = ("prior_box_param { min_size: 20 max_size: 40 aspect_ratio: 2 flip: false clip: false "
         "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 }")  # fmt: skip


def _text(bottoms: int, param: str) -> str:
    shapes = {"data": (2, 3, 48, 48), "feat": (2, 4, HW, HW), "loc": (2, P * 4),
              "conf": (2, P * C), "arm_conf": (2, P * 2), "arm_loc": (2, P * 4)}  # fmt: skip
    names = ["loc", "conf", "pb", "arm_conf", "arm_loc"][:bottoms]
    return input_layer(shapes) + (
        f'layer {{ name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" {PRIOR} }}\n'
        'layer { name: "det" type: "DetectionOutput" '
        + "".join(f'bottom: "{b}" ' for b in names)
        + f'top: "det" detection_output_param {{ num_classes: {C} {param} }} }}\n'
    )


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _inputs(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    arm = _softmax(rng.normal(size=(2, P, 2)) * 3)
    return {
        "data": np.zeros((2, 3, 48, 48), np.float32),
        "feat": np.zeros((2, 4, HW, HW), np.float32),
        "loc": (rng.normal(size=(2, P * 4)) * 0.5).astype(np.float32),
        "conf": _softmax(rng.normal(size=(2, P, C)) * 2).reshape(2, -1).astype(np.float32),
        "arm_conf": arm.reshape(2, -1).astype(np.float32),
        "arm_loc": (rng.normal(size=(2, P * 4)) * 0.5).astype(np.float32),
    }


def _run(text: str, inputs: dict, dialect=None):
    model = caffe2jax.compile(text, dialect=dialect)
    blobs, _ = jitted.forward(model, {}, {}, inputs)
    return model, {k: np.asarray(v) for k, v in blobs.items()}


def _fork(inputs, prior, bottoms, objectness, threshold, nms, top_k, keep_top_k):
    """RefineDet's Forward_cpu, transcribed: OS scores, cascaded decode, SSD's selection."""
    n = len(inputs["loc"])
    priors, var = prior[0, 0].reshape(P, 4), prior[0, 1].reshape(P, 4)
    loc = inputs["loc"].reshape(n, P, 4)
    scores = inputs["conf"].reshape(n, P, C).copy()
    arm = inputs["arm_conf"].reshape(n, P, 2)
    for i in range(n):
        for p in range(P):
            if arm[i, p, 1] < objectness:  # OSGetConfidenceScores: class 0 gets 1, others 0
                scores[i, p] = [1.0] + [0.0] * (C - 1)
    boxes = np.zeros((n, P, 4), np.float32)
    for i in range(n):
        for p in range(P):
            anchor = priors[p]
            if bottoms == 5:  # CasRegDecodeBBoxesAll: the prior refined by arm_loc first
                anchor = decode_center_size(
                    priors[p], var[p], inputs["arm_loc"].reshape(n, P, 4)[i, p]
                )
            boxes[i, p] = decode_center_size(anchor, var[p], loc[i, p])
    return detections(boxes, scores, threshold, nms, top_k, keep_top_k)


@pytest.mark.parametrize("bottoms", [4, 5])
@pytest.mark.parametrize(("objectness", "keep"), [(0.01, 200), (0.5, 200), (0.3, 5)])
def test_detection_output_matches_the_forks_loop(bottoms, objectness, keep):
    param = (f"objectness_score: {objectness} code_type: CENTER_SIZE keep_top_k: {keep} "
             "confidence_threshold: 0.05 nms_param { nms_threshold: 0.45 top_k: 40 }")  # fmt: skip
    inputs = _inputs(bottoms + keep)
    model, blobs = _run(_text(bottoms, param), inputs)
    det = model.net.layers[-1]
    assert (det.type, det.form) == ("DetectionOutput", "refinedet")
    want = _fork(inputs, blobs["pb"], bottoms, np.float32(objectness), np.float32(0.05),
                 np.float32(0.45), 40, keep)  # fmt: skip
    got = kept_rows(blobs["det"])
    assert got.shape == want.shape
    np.testing.assert_array_equal(got[:, :3], want[:, :3])
    # decode under jit: XLA may fuse a·b + c (one rounding); the loop rounds twice in float
    np.testing.assert_allclose(got[:, 3:], want[:, 3:], rtol=0, atol=2e-7)


def test_objectness_below_the_threshold_only_is_filtered_hand_worked():
    """One prior per class score: objectness exactly 0.25 keeps the ODM's scores (the fork
    compares with <), 0.2 turns them into [1, 0, 0] (no class-1 or -2 detection left)."""
    inputs = _inputs(0)
    arm = np.zeros((2, P, 2), np.float32)
    arm[..., 1] = 0.2
    arm[0, 0, 1] = 0.25  # only image 0's prior 0 passes
    inputs["arm_conf"] = arm.reshape(2, -1)
    conf = np.full((2, P, C), 0.1, np.float32)
    conf[:, :, 2] = 0.8
    inputs["conf"] = conf.reshape(2, -1)
    param = "objectness_score: 0.25 confidence_threshold: 0.5 code_type: CENTER_SIZE"
    _, blobs = _run(_text(4, param), inputs)
    rows = kept_rows(blobs["det"])
    np.testing.assert_array_equal(rows[:, :3], [[0, 2, np.float32(0.8)]])


def test_unset_objectness_score_is_the_forks_default_and_three_bottoms_are_ssds():
    text = _text(3, "objectness_score: 0.9 code_type: CENTER_SIZE")
    model = caffe2jax.compile(text)
    assert model.net.layers[-1].form == ""  # 3 bottoms: SSD's layer, objectness unused
    from caffe2jax.frontend import caffe_pb2

    assert caffe_pb2.DetectionOutputParameter().objectness_score == pytest.approx(0.01)
    assert caffe2jax.compile(text).net.dialect.startswith("refinedet")


def test_refusals_name_the_layer():
    with pytest.raises(NetError, match="share_location: true"):
        _run(_text(5, "share_location: false code_type: CENTER_SIZE"), _inputs(1))
    bad = _inputs(1)
    bad["arm_conf"] = bad["arm_conf"][:, :P]
    text = _text(4, "code_type: CENTER_SIZE").replace(f"dim: {P * 2} ", f"dim: {P} ")
    with pytest.raises(NetError, match="layer 'det'.*arm_conf must hold 2 scores"):
        _run(text, bad)


def _head(name: str, bottom: str, out: int) -> str:
    return (
        f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
        f"convolution_param {{ num_output: {out} kernel_size: 3 pad: 1 "
        'weight_filler { type: "gaussian" std: 0.1 } } }\n'
        f'layer {{ name: "{name}_perm" type: "Permute" bottom: "{name}" top: "{name}_perm" '
        "permute_param { order: 0 order: 2 order: 3 order: 1 } }\n"
        f'layer {{ name: "{name}_flat" type: "Flatten" bottom: "{name}_perm" '
        f'top: "{name}_flat" flatten_param {{ axis: 1 }} }}\n'
    )


def test_a_refinedet_net_compiles_and_runs_forward():
    """ARM (2-class conf, loc) and ODM heads on one feature map, softmaxed confidences, the
    5-bottom DetectionOutput, as RefineDet's generated deploy nets wire them."""
    text = (
        'name: "refinedet_tiny"\n' + input_layer({"data": (1, 3, 32, 32)})
        + 'layer { name: "feat" type: "Convolution" bottom: "data" top: "feat" convolution_param '
        '{ num_output: 8 kernel_size: 3 stride: 8 pad: 1 weight_filler { type: "xavier" } } }\n'
        + _head("arm_loc", "feat", K * 4) + _head("arm_conf", "feat", K * 2)
        + _head("odm_loc", "feat", K * 4) + _head("odm_conf", "feat", K * C)
        + 'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
        + PRIOR + " }\n"
        + 'layer { name: "arm_r" type: "Reshape" bottom: "arm_conf_flat" top: "arm_r" '
        "reshape_param { shape { dim: 0 dim: -1 dim: 2 } } }\n"
        'layer { name: "arm_s" type: "Softmax" bottom: "arm_r" top: "arm_s" '
        "softmax_param { axis: 2 } }\n"
        'layer { name: "arm_f" type: "Flatten" bottom: "arm_s" top: "arm_f" }\n'
        f'layer {{ name: "odm_r" type: "Reshape" bottom: "odm_conf_flat" top: "odm_r" '
        f"reshape_param {{ shape {{ dim: 0 dim: -1 dim: {C} }} }} }}\n"
        'layer { name: "odm_s" type: "Softmax" bottom: "odm_r" top: "odm_s" '
        "softmax_param { axis: 2 } }\n"
        'layer { name: "odm_f" type: "Flatten" bottom: "odm_s" top: "odm_f" }\n'
        'layer { name: "det" type: "DetectionOutput" bottom: "odm_loc_flat" bottom: "odm_f" '
        'bottom: "pb" bottom: "arm_f" bottom: "arm_loc_flat" top: "det" detection_output_param '
        f"{{ num_classes: {C} code_type: CENTER_SIZE objectness_score: 0.01 keep_top_k: 10 "
        "confidence_threshold: 0.01 nms_param { nms_threshold: 0.45 top_k: 20 } } }\n"
    )  # fmt: skip
    model = caffe2jax.compile(text)
    params, state = model.init(0)
    x = np.random.default_rng(3).normal(size=(1, 3, 32, 32)).astype(np.float32)
    blobs, _ = jitted.forward(model, params, state, {"data": x})
    det = np.asarray(blobs["det"])
    assert det.shape == (1, 1, 10, 7) and np.isfinite(det).all()
    assert (kept_rows(det)[:, 1] >= 1).all()
