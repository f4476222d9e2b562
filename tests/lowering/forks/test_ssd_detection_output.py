"""SSD's DetectionOutput (lowering/forks/ssd_detection_output.py, lowering/boxes/nms.py): OpenCV dnn
parity on random nets (boxes, labels, scores and order), hand-worked cases OpenCV lacks
(CORNER_SIZE, variance in target, a two-class NMS tie, eta, the "no detection" rows)."""

from __future__ import annotations

import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from tests import jitted
from tests.lowering.opencv_parity import both, input_layer

C = 4  # classes, 0 = background


def _net(n: int, param: str, loc_classes: int = 1, hw: int = 4) -> tuple[str, dict]:
    priors = hw * hw * 6
    for field, value in (("share_location", "true"), ("background_label_id", "0")):
        if field not in param:  # OpenCV requires them
            param += f" {field}: {value}"
    shapes = {
        "data": (n, 3, 64, 64),
        "feat": (n, 8, hw, hw),
        "loc": (n, priors * 4 * loc_classes),
        "conf": (n, priors * C),
    }
    text = input_layer(shapes) + (
        'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
        "prior_box_param { min_size: 20 max_size: 40 aspect_ratio: 2 aspect_ratio: 3 "
        "flip: true clip: false variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 } }\n"
        'layer { name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "pb" '
        f'top: "det" detection_output_param {{ num_classes: {C} {param} }} }}\n'
    )
    rng = np.random.default_rng(n + loc_classes + len(param))
    logits = rng.normal(size=(n, priors, C)) * 2
    conf = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    inputs = {
        "data": np.zeros(shapes["data"], np.float32),
        "feat": np.zeros(shapes["feat"], np.float32),
        "loc": (rng.normal(size=shapes["loc"]) * 0.5).astype(np.float32),
        "conf": conf.reshape(n, -1).astype(np.float32),
    }
    return text, inputs


def _grouped(rows: np.ndarray) -> np.ndarray:
    """OpenCV's rows (sorted by score per image: its group_by_classes defaults to false) in
    Caffe's order: by image, then label, keeping the score order within a label."""
    return rows[np.lexsort((rows[:, 1], rows[:, 0]))]


CASES = [
    (1, "nms_param { nms_threshold: 0.45 top_k: 50 } code_type: CENTER_SIZE keep_top_k: 30 "
        "confidence_threshold: 0.3", 1),
    (1, "nms_param { nms_threshold: 0.3 top_k: 400 } code_type: CORNER keep_top_k: 200 "
        "confidence_threshold: 0.2", 1),
    (2, "nms_param { nms_threshold: 0.45 top_k: 20 } code_type: CENTER_SIZE keep_top_k: 25 "
        "confidence_threshold: 0.25", 1),
    (2, "share_location: false background_label_id: 2 nms_param { nms_threshold: 0.5 "
        "top_k: 30 } code_type: CENTER_SIZE keep_top_k: 40 confidence_threshold: 0.2", C),
    (1, "nms_param { nms_threshold: 0.6 } code_type: CENTER_SIZE keep_top_k: 500 "
        "confidence_threshold: 0.01", 1),
]  # fmt: skip


@pytest.mark.parametrize(("n", "param", "loc_classes"), CASES)
def test_detection_output_matches_opencv(tmp_path, n, param, loc_classes):
    text, inputs = _net(n, param, loc_classes)
    ours, theirs = both(tmp_path, text, inputs, ["det"])
    ours, theirs = ours["det"][0, 0], theirs["det"][0, 0]
    kept = ours[:, 1] >= 0
    count = int(kept.sum())
    assert count > 5 and kept[:count].all() and not kept[count:].any()
    assert (ours[count:] == -1).all()  # padding rows
    assert (theirs[count:] == 0).all()  # OpenCV's zero rows past the kept ones
    want = _grouped(theirs[:count])
    np.testing.assert_array_equal(ours[:count, :2], want[:, :2])  # images and labels, in order
    assert np.abs(ours[:count, 2:] - want[:, 2:]).max() <= 1e-4 * np.abs(want[:, 2:]).max()


def _hand(param: str, loc, conf, prior, variance=(1, 1, 1, 1)) -> np.ndarray:
    """Run DetectionOutput alone on given loc (P,4), conf (P,C) and prior boxes (P,4)."""
    loc, conf, prior = (np.asarray(a, np.float32) for a in (loc, conf, prior))
    p, c = conf.shape
    pb = np.stack([prior.ravel(), np.tile(np.float32(variance), p)])[None]
    shapes = {"loc": (1, p * 4), "conf": (1, p * c), "pb": pb.shape}
    text = input_layer(shapes) + (
        'layer { name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "pb" '
        f'top: "det" detection_output_param {{ num_classes: {c} {param} }} }}\n'
    )
    inputs = {"loc": loc.reshape(1, -1), "conf": conf.reshape(1, -1), "pb": pb}
    return np.asarray(jitted.forward(caffe2jax.compile(text), {}, {}, inputs)[0]["det"])[0, 0]


BOXES = [[0, 0, 0.4, 0.4], [0.02, 0.02, 0.42, 0.42], [0.5, 0.5, 0.9, 0.9]]


def test_two_class_nms_tie_keeps_the_lower_prior_and_orders_by_label():
    """Priors 0 and 1 overlap (IoU ≈ 0.82) and tie in class 1: the stable sort puts prior 0
    first, so it survives; class 2 runs its own NMS; rows come by label, then score."""
    conf = [[0.1, 0.6, 0.3], [0.1, 0.6, 0.3], [0.2, 0.3, 0.5]]
    out = _hand("nms_param { nms_threshold: 0.5 } code_type: CORNER", np.zeros((3, 4)), conf,
                BOXES)  # fmt: skip
    rows = out[out[:, 1] >= 0]
    want = [
        [0, 1, 0.6, *BOXES[0]],
        [0, 1, 0.3, *BOXES[2]],
        [0, 2, 0.5, *BOXES[2]],
        [0, 2, 0.3, *BOXES[0]],
    ]
    np.testing.assert_allclose(rows, want, rtol=1e-6)
    assert out.shape == (2 * 3, 7)  # 2 classes · 3 candidates and (out[4:] == -1).all()


def test_keep_top_k_and_confidence_threshold_are_strict():
    conf = [[0.1, 0.6, 0.3], [0.1, 0.6, 0.3], [0.2, 0.3, 0.5]]
    param = "nms_param { nms_threshold: 0.5 } code_type: CORNER keep_top_k: 2 "
    out = _hand(param + "confidence_threshold: 0.3", np.zeros((3, 4)), conf, BOXES)
    assert out.shape == (2, 7)  # keep_top_k rows per image
    np.testing.assert_allclose(out[:, 1:3], [[1, 0.6], [2, 0.5]], rtol=1e-6)


def test_no_detection_rows_are_the_forks():
    conf = [[0.9, 0.05, 0.05]] * 3
    out = _hand("nms_param { nms_threshold: 0.5 } confidence_threshold: 0.5", np.zeros((3, 4)),
                conf, BOXES)  # fmt: skip
    np.testing.assert_array_equal(out[0], [0, -1, -1, -1, -1, -1, -1])
    assert (out[1:] == -1).all()


@pytest.mark.parametrize("encoded", [False, True])
def test_corner_size_and_center_size_decoding_by_hand(encoded):
    prior = [[0.2, 0.2, 0.6, 0.4]]
    loc = [[0.5, -1.0, 0.25, 2.0]]
    var = (0.1, 0.1, 0.2, 0.2)
    v = np.ones(4) if encoded else np.float64(var)
    t = np.float64(loc[0]) * v
    flag = f"variance_encoded_in_target: {str(encoded).lower()} "
    out = _hand(flag + "code_type: CORNER_SIZE", loc, [[0, 1.0]], prior, var)
    pw, ph = 0.4, 0.2
    want = [0.2 + t[0] * pw, 0.2 + t[1] * ph, 0.6 + t[2] * pw, 0.4 + t[3] * ph]
    np.testing.assert_allclose(out[0, 3:], want, rtol=1e-5)
    out = _hand(flag + "code_type: CENTER_SIZE", loc, [[0, 1.0]], prior, var)
    cx, cy = t[0] * pw + 0.4, t[1] * ph + 0.3
    w, h = np.exp(t[2]) * pw, np.exp(t[3]) * ph
    np.testing.assert_allclose(out[0, 3:], [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2],
                               rtol=1e-5)  # fmt: skip


def test_adaptive_eta_lowers_the_threshold_after_each_keep():
    """Three boxes with IoU(0,2) = 0.6 (below 0.7) but above 0.7·0.8 = 0.56 once box 0 and
    1 are kept: eta 0.8 suppresses box 2, eta 1 keeps it."""
    boxes = [[0, 0, 1, 0.5], [0, 0.6, 1, 1], [0, 0, 1, 0.3]]  # IoU(0,2) = 0.3/0.5 = 0.6
    conf = [[0, 0.9], [0, 0.8], [0, 0.7]]
    for eta, kept in ((1.0, 3), (0.8, 2)):
        out = _hand(f"nms_param {{ nms_threshold: 0.7 eta: {eta} }} code_type: CORNER",
                    np.zeros((3, 4)), conf, boxes)  # fmt: skip
        assert int((out[:, 1] >= 0).sum()) == kept, eta


def test_refuses_mismatched_bottoms():
    text, _ = _net(1, "nms_param { nms_threshold: 0.45 }")
    with pytest.raises(NetError, match="number of priors must match"):
        caffe2jax.compile(text.replace(f"dim: {16 * 6 * C}", f"dim: {16 * 6 * C + 1}"))


def test_save_output_param_warns_that_no_files_are_written(tmp_path):
    """ssd_pascal.py's test nets set save_output_param; the detections are computed as ever,
    and a warning names the layer and the directory nothing is written to."""
    conf = [[0.1, 0.6, 0.3], [0.1, 0.6, 0.3], [0.2, 0.3, 0.5]]
    save = (f'save_output_param {{ output_directory: "{tmp_path / "results"}" '
            'output_name_prefix: "comp4_det_test_" output_format: "VOC" }')  # fmt: skip
    param = "nms_param { nms_threshold: 0.5 } code_type: CORNER keep_top_k: 2 "
    with pytest.warns(UserWarning, match=r"'det' \(DetectionOutput\): save_output_param .*results"):
        out = _hand(param + save, np.zeros((3, 4)), conf, BOXES)
    plain = _hand(param, np.zeros((3, 4)), conf, BOXES)
    np.testing.assert_array_equal(out, plain)
    assert not (tmp_path / "results").exists()
