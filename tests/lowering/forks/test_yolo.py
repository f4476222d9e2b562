"""The YOLO ports' layers (lowering/forks/yolo.py): eric612's Reorg against OpenCV dnn's,
loop-by-loop numpy transcriptions of the fork's C++ for YoloDetectionOutput and
Yolov3DetectionOutput (OpenCV has neither), hand-worked decodes, NMS at exactly the threshold,
no-detection rows; the nearest-neighbour Upsample by hand; darknet2caffe's Mish against OpenCV
dnn and its formula."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from tests import jitted
from tests.lowering.fork_nets import channels_last_agrees, fd_check, max_rel, net, opencv, ours
from tests.lowering.opencv_parity import both, input_layer

# -- Reorg ----------------------------------------------------------------------------------


def _reorg_text(shape, stride=2, reverse=False) -> str:
    return input_layer({"x": shape}) + (
        'layer { name: "y" type: "Reorg" bottom: "x" top: "y" '
        f"reorg_param {{ stride: {stride} reverse: {str(reverse).lower()} }} }}\n"
    )


def _reorg_cpu(x: np.ndarray, s: int, forward: bool) -> np.ndarray:
    """reorg_layer.hpp reorg_cpu, loop by loop (Forward_cpu passes forward = reverse_)."""
    b_n, b_c, b_h, b_w = x.shape
    t_c, t_w, t_h = b_c // (s * s), b_w * s, b_h * s
    src, out = x.ravel(), np.zeros(x.size, x.dtype)
    for n in range(b_n):
        for c in range(b_c):
            for h in range(b_h):
                for w in range(b_w):
                    bottom = w + b_w * (h + b_h * (c + b_c * n))
                    c2, off = c % t_c, c // t_c
                    top = (w * s + off % s) + t_w * ((h * s + off // s) + t_h * (c2 + t_c * n))
                    if forward:
                        out[top] = src[bottom]
                    else:
                        out[bottom] = src[top]
    return out


def test_reorg_matches_opencv(tmp_path):
    x = np.random.default_rng(0).normal(size=(2, 8, 4, 6)).astype(np.float32)
    cv = input_layer({"x": x.shape}) + 'layer { name: "y" type: "Reorg" bottom: "x" top: "y" }\n'
    ours, theirs = both(tmp_path, _reorg_text(x.shape), {"x": x}, ["y"], cv_text=cv)
    np.testing.assert_array_equal(ours["y"], theirs["y"])  # OpenCV's stride is 2 here


@pytest.mark.parametrize(("stride", "reverse"), [(2, False), (3, False), (2, True), (3, True)])
def test_reorg_is_the_forks_index_map(stride, reverse):
    shape = (2, 18, 6, 3) if not reverse else (1, 36, 2, 4)
    if not reverse:
        shape = (2, 18, 6, 9) if stride == 3 else (2, 8, 6, 4)
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    model = caffe2jax.compile(_reorg_text(shape, stride, reverse))
    y = np.asarray(jitted.forward(model, {}, {}, {"x": x})[0]["y"])
    np.testing.assert_array_equal(y.ravel(), _reorg_cpu(x, stride, forward=reverse))
    n, c, h, w = shape
    s2 = stride * stride
    want = (
        (n, c // s2, h * stride, w * stride) if reverse else (n, c * s2, h // stride, w // stride)
    )
    assert y.shape == want


def test_reorg_backward_is_the_forks_zero_diff():
    """eric612's Backward_cpu copies its own never-written diff_ blob into the bottom diff."""
    text = "force_backward: true\n" + _reorg_text((1, 4, 2, 2))
    model = caffe2jax.compile(text)
    x = np.ones((1, 4, 2, 2), np.float32)
    g = jax.grad(lambda v: jitted.forward(model, {}, {}, {"x": v})[0]["y"].sum())(x)
    np.testing.assert_array_equal(g, 0)


def test_reorg_refuses_missing_stride():
    text = _reorg_text((1, 4, 2, 2)).replace("stride: 2 ", "")
    with pytest.raises(NetError, match="needs stride"):
        caffe2jax.compile(text)


# -- detection outputs -----------------------------------------------------------------------


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def _apply_nms(preds: list, thr: float) -> list:
    """ApplyNms: sorted by confidence (stable), suppress j when box_iou(i, j) ≥ thr."""
    preds = sorted(preds, key=lambda p: -p[4])
    dropped = set()
    for i in range(len(preds) - 1):
        if i in dropped:
            continue
        for j in range(i + 1, len(preds)):
            if j not in dropped and _box_iou(preds[i][:4], preds[j][:4]) >= thr:
                dropped.add(j)
    return [p for k, p in enumerate(preds) if k not in dropped]


def _box_iou(a, b) -> float:
    def overlap(x1, w1, x2, w2):
        return min(x1 + w1 / 2, x2 + w2 / 2) - max(x1 - w1 / 2, x2 - w2 / 2)

    w, h = overlap(a[0], a[2], b[0], b[2]), overlap(a[1], a[3], b[1], b[3])
    inter = 0.0 if w < 0 or h < 0 else w * h
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def _rows(preds: list) -> np.ndarray:
    return np.array([[0, c + 1, s, x - w / 2, y - h / 2, x + w / 2, y + h / 2]
                     for x, y, w, h, s, c in preds]).reshape(-1, 7)  # fmt: skip


def _v2_reference(x: np.ndarray, boxes: int, classes: int, biases, thr, nms) -> np.ndarray:
    """yolo_detection_output_layer.cpp Forward_cpu on one bottom, in float64."""
    n, c, h, w = x.shape
    swap = x.astype(np.float64).transpose(0, 2, 3, 1).reshape(n, h * w, boxes, c // boxes)
    preds = []
    for b in range(n):
        for j in range(w):
            for i in range(w):
                for a in range(boxes):
                    t = swap[b, j * w + i, a]
                    px, py = (i + _sig(t[0])) / w, (j + _sig(t[1])) / w
                    pw, ph = np.exp(t[2]) * biases[2 * a] / w, np.exp(t[3]) * biases[2 * a + 1] / w
                    e = np.exp(t[5 : 5 + classes] - t[5 : 5 + classes].max())
                    prob = e / e.sum()
                    conf = _sig(t[4]) * prob.max()
                    if conf >= thr:
                        preds.append((px, py, pw, ph, conf, int(np.argmax(prob))))
    return _rows(_apply_nms(preds, nms))


BIASES_V2 = [1.08, 1.19, 3.42, 4.41, 6.63, 11.38, 9.42, 5.11, 16.62, 10.52]


def _v2_text(shape, thr=0.3, nms=0.45, classes=20) -> str:
    biases = " ".join(f"biases: {b}" for b in BIASES_V2)
    return input_layer({"x": shape}) + (
        'layer { name: "det" type: "YoloDetectionOutput" bottom: "x" top: "det" '
        f"yolo_detection_output_param {{ num_classes: {classes} confidence_threshold: {thr} "
        f"nms_threshold: {nms} {biases} }} }}\n"
    )


def _run(text: str, inputs: dict) -> np.ndarray:
    return np.asarray(jitted.forward(caffe2jax.compile(text), {}, {}, inputs)[0]["det"])[0, 0]


@pytest.mark.parametrize(("seed", "thr"), [(0, 0.3), (1, 0.2), (2, 0.5)])
def test_yolo_v2_output_matches_the_forks_loops(seed, thr):
    x = (np.random.default_rng(seed).normal(size=(1, 125, 7, 7)) * 1.5).astype(np.float32)
    ours = _run(_v2_text(x.shape, thr), {"x": x})
    want = _v2_reference(x, 5, 20, BIASES_V2, thr, 0.45)
    assert len(want) >= 3
    np.testing.assert_allclose(ours[: len(want)], want, rtol=1e-5, atol=1e-6)
    assert (ours[len(want) :] == -1).all()


def _v3_reference(xs, classes, biases, masks, scales, thr, nms) -> np.ndarray:
    """yolov3_detection_output_layer.cpp Forward_cpu, in float64 (num_box 3)."""
    preds, groups = [], len(masks) // len(xs)
    for t, x in enumerate(xs):
        n, c, h, w = x.shape
        ln = 5 + classes
        for b in range(n):
            for s in range(h * w):
                j, i = divmod(s, w)
                for a in range(3):
                    t_ = x[b, a * ln : (a + 1) * ln].reshape(ln, -1)[:, s].astype(np.float64)
                    m = masks[a + t * groups]
                    px, py = (i + _sig(t_[0])) / w, (j + _sig(t_[1])) / h
                    pw = np.exp(t_[2]) * biases[2 * m] / (w * scales[t])
                    ph = np.exp(t_[3]) * biases[2 * m + 1] / (h * scales[t])
                    for k in range(classes):
                        score = _sig(t_[5 + k]) * _sig(t_[4])
                        if score > thr:
                            preds.append((px, py, pw, ph, score, k))
    return _rows(_apply_nms(preds, nms))


BIASES_V3 = [10, 14, 23, 27, 37, 58, 81, 82, 135, 169, 344, 319]


def _v3_text(shapes, classes, thr, nms=0.45) -> str:
    biases = " ".join(f"biases: {b}" for b in BIASES_V3)
    names = [f"x{i}" for i in range(len(shapes))]
    bottoms = " ".join(f'bottom: "{n}"' for n in names)
    return input_layer(dict(zip(names, shapes))) + (
        f'layer {{ name: "det" type: "Yolov3DetectionOutput" {bottoms} top: "det" '
        f"yolov3_detection_output_param {{ num_classes: {classes} confidence_threshold: {thr} "
        f"nms_threshold: {nms} {biases} mask: 3 mask: 4 mask: 5 mask: 0 mask: 1 mask: 2 "
        "anchors_scale: 32 anchors_scale: 16 mask_group_num: 2 } }\n"
    )


@pytest.mark.parametrize("thr", [0.3, 0.5])
def test_yolo_v3_output_matches_the_forks_loops(thr):
    rng = np.random.default_rng(4)
    shapes = [(1, 3 * 9, 3, 4), (1, 3 * 9, 6, 8)]  # 4 classes, a non-square map
    xs = [(rng.normal(size=s) * 1.5).astype(np.float32) for s in shapes]
    ours = _run(_v3_text(shapes, 4, thr), {f"x{i}": x for i, x in enumerate(xs)})
    want = _v3_reference(xs, 4, BIASES_V3, [3, 4, 5, 0, 1, 2], [32, 16], thr, 0.45)
    assert len(want) >= 3
    np.testing.assert_allclose(ours[: len(want)], want, rtol=1e-5, atol=1e-6)
    assert (ours[len(want) :] == -1).all()


def test_yolo_v3_hand_worked_decode_and_class_agnostic_nms():
    """One 1×1 map, 1 class: anchor 1's tw, th make its box anchor 0's (scores σ(2)σ(2) and
    σ(2)σ(1)): IoU 1 ≥ 0.45 drops it. Anchor 2's box is far smaller (IoU < 0.45): kept."""
    ln = 6
    x = np.zeros((1, 3 * ln, 1, 1), np.float32)
    same = (np.log(81 / 135), np.log(82 / 169))
    for a, (obj, cls, tw, th) in enumerate([(2, 2, 0, 0), (2, 1, *same), (2, 0, -3, -3)]):
        x[0, a * ln + 2 : a * ln + 6, 0, 0] = [tw, th, obj, cls]
    text = _v3_text([x.shape, (1, 3 * ln, 1, 1)], 1, 0.3)
    out = _run(text, {"x0": x, "x1": np.full((1, 3 * ln, 1, 1), -9, np.float32)})
    rows = out[out[:, 1] >= 0]
    # bottom 0: masks 3, 4, 5 → biases (81, 82), (135, 169), (344, 319); input 32×32
    w0, h0 = 81 / 32, 82 / 32
    assert rows.shape == (2, 7)
    np.testing.assert_allclose(rows[0], [0, 1, _sig(2) ** 2, 0.5 - w0 / 2, 0.5 - h0 / 2,
                                         0.5 + w0 / 2, 0.5 + h0 / 2], rtol=1e-6)  # fmt: skip
    w2, h2 = np.exp(-3) * 344 / 32, np.exp(-3) * 319 / 32
    np.testing.assert_allclose(rows[1, 2:], [_sig(2) * 0.5, 0.5 - w2 / 2, 0.5 - h2 / 2,
                                             0.5 + w2 / 2, 0.5 + h2 / 2], rtol=1e-6)  # fmt: skip


def test_no_detection_rows_and_refusals():
    x = np.full((1, 125, 3, 3), -9, np.float32)
    out = _run(_v2_text(x.shape), {"x": x})
    np.testing.assert_array_equal(out[0], [0, -1, -1, -1, -1, -1, -1])
    assert (out[1:] == -1).all()
    with pytest.raises(NetError, match="mask_group_num"):
        caffe2jax.compile(_v3_text([(1, 27, 2, 2)], 4, 0.3))


RNG = np.random.default_rng(0)


X = (RNG.standard_normal((2, 3, 4, 5)) * 6).astype(np.float32)


def _one(type_and_param: str, shape=X.shape) -> str:
    return net(f'layer {{ name: "y" type: {type_and_param} bottom: "x" top: "y" }}', {"x": shape})


def test_mish_matches_opencv():
    kind = '"Mish"'
    x = np.concatenate([X, X * 5], axis=0)  # |x| up to ~100: both softplus thresholds
    text = _one(kind, x.shape)
    assert max_rel(ours(text, {"x": x})["y"], opencv(text, {"x": x}, ["y"])["y"][0]) < 1e-4


def test_mish_formula_and_gradient():
    x = np.array([-30.0, -5.0, 0.0, 1.0, 25.0])
    text = _one('"Mish"', x.shape)
    softplus = np.where(x > 20, x, np.where(x < -20, np.exp(x), np.log1p(np.exp(x))))
    np.testing.assert_allclose(ours(text, {"x": x})["y"], x * np.tanh(softplus), rtol=1e-6)
    fd_check(text, {"x": np.array([-25.0, -3.0, -0.3, 2.0, 22.0])}, "y")


def test_mish_channels_last():
    kind = '"Mish"'
    channels_last_agrees(f'layer {{ name: "y" type: {kind} bottom: "c" top: "y" }}', X.shape)


def _upsample_one(type_and_param: str, shape, name: str = "y") -> str:
    return net(f'layer {{ name: "{name}" type: {type_and_param} bottom: "x" top: "{name}" }}',
               {"x": shape})  # fmt: skip


def test_nearest_upsample_by_hand_and_gradient():
    text = _upsample_one('"Upsample" upsample_param { scale: 2 }', (1, 1, 2, 2))
    y = ours(text, {"x": np.array([[[[1, 2], [3, 4]]]])})["y"][0, 0]
    np.testing.assert_array_equal(y, [[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]])
    fd_check(_upsample_one('"Upsample" upsample_param { scale: 3 }', (1, 2, 2, 3)),
             {"x": np.random.default_rng(1).standard_normal((1, 2, 2, 3))}, "y")  # fmt: skip


def test_nearest_upsample_channels_last():
    text = 'layer { name: "y" type: "Upsample" bottom: "c" top: "y" upsample_param { scale: 2 } }'
    channels_last_agrees(text, (2, 3, 4, 5))
