"""lowering/forks/yolov2.py: gklz1982/caffe-yolov2's DetectionOutput and RegionLoss against NumPy
transcriptions of the fork's C++ (detection_output_layer.cpp, region_loss_layer.cpp and
include/caffe/util/bbox_util.hpp at gklz1982/caffe-yolov2@ebb2702), run jitted and inside
value_and_grad; a RegionLoss net trained a few steps through the compiled train step."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import net, ours

RNG = np.random.default_rng(31)
BIASES = [1.0, 1.2, 2.5, 1.8]  # two anchors (w, h) in cells
F = np.float32


def _sig(v):
    return F(1) / (F(1) + np.exp(-F(v)))


def _bbox(x, y, w, h):
    """setNormalizedBBox: corners clipped to [0, 1], size w·h of the clipped box (or 0)."""
    b = [max(x - w / 2, 0), max(y - h / 2, 0), min(x + w / 2, 1), min(y + h / 2, 1)]
    return [F(v) for v in b]


def _size(b):
    return F(0) if b[2] < b[0] or b[3] < b[1] else F((b[2] - b[0]) * (b[3] - b[1]))


def calc_iou(a, b):
    """Calc_iou: JaccardOverlap(normalized) of the clipped boxes."""
    a, b = _bbox(*a), _bbox(*b)
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return F(0)
    iw, ih = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return F(0)
    inter = F(iw * ih)
    return F(inter / (_size(a) + _size(b) - inter))


def _swap(x, num):
    n, c, h, w = x.shape
    return x.transpose(0, 2, 3, 1).reshape(n, h * w, num, c // num).astype(F)


def _box(s, n, i, j, side):
    w, h = np.exp(s[2]) * BIASES[2 * n] / side, np.exp(s[3]) * BIASES[2 * n + 1] / side
    return [(i + _sig(s[0])) / side, (j + _sig(s[1])) / side, w, h]


def detection_output_loop(x, side, num, classes, thr, nms):
    """DetectionOutputLayer::Forward_cpu with class_index_and_score and ApplyNms."""
    sw = _swap(x, num)[0]
    preds = []
    for j in range(side):
        for i in range(side):
            for n in range(num):
                s = sw[j * side + i, n]
                e = np.exp(s[5 : 5 + classes] - s[5 : 5 + classes].max())
                p = e / e.sum()
                conf = _sig(s[4]) * p.max()
                if conf >= thr:
                    preds.append([0, int(np.argmax(p)), conf, *_box(s, n, i, j, side)])
    dropped = set()
    for a in range(len(preds) - 1):
        if a in dropped:
            continue
        for b in range(a + 1, len(preds)):
            if b not in dropped and calc_iou(preds[a][3:], preds[b][3:]) >= nms:
                dropped.add(b)
    kept = [p for k, p in enumerate(preds) if k not in dropped]
    return np.array(kept or [[0] + [-1] * 6], np.float64)


def _output_net(side=3, num=2, classes=3, extra="") -> str:
    layer = ('layer { name: "det" type: "DetectionOutput" bottom: "x" top: "det" '
             f"detection_output_param {{ side: {side} num_classes: {classes} num_box: {num} "
             f"coords: 4 nms_threshold: 0.3 {extra} "
             + " ".join(f"biases: {b}" for b in BIASES) + " } }")  # fmt: skip
    return net(layer, {"x": (1, num * (5 + classes), side, side)})


@pytest.mark.parametrize("thr", (0.05, 0.3, 0.99))
def test_detection_output_is_the_forks_loop(thr):
    """Candidates in cell order, unsorted NMS on clipped boxes, centre-size 0-based rows."""
    x = RNG.standard_normal((1, 16, 3, 3)) * 1.5
    got = ours(_output_net(extra=f"confidence_threshold: {thr}"), {"x": x})["det"][0, 0]
    want = detection_output_loop(x, 3, 2, 3, thr, 0.3)
    np.testing.assert_allclose(got[: len(want)], want, rtol=1e-5, atol=1e-6)
    assert (got[len(want) :] == -1).all()


def test_detection_output_form_from_fields_and_bottoms():
    """One bottom or YOLO's fields: gklz1982's layer; both families' fields: refused."""
    x = RNG.standard_normal((1, 16, 3, 3))
    bare = net('layer { name: "det" type: "DetectionOutput" bottom: "x" top: "det" '
               "detection_output_param { num_classes: 3 side: 3 num_box: 2 "
               + " ".join(f"biases: {b}" for b in BIASES) + " } }",
               {"x": (1, 16, 3, 3)})  # fmt: skip
    want = detection_output_loop(x, 3, 2, 3, 0.01, 0.45)  # the fork's defaults
    np.testing.assert_allclose(ours(bare, {"x": x})["det"][0, 0, : len(want)], want, rtol=1e-5,
                               atol=1e-6)  # fmt: skip
    mixed = _output_net(extra="keep_top_k: 5")
    with pytest.raises(NetError, match="layer 'det'.*caffe-yolov2's fields.*SSD's"):
        compile_net(mixed)


# -- RegionLoss ---------------------------------------------------------------------------------


def region_loss_loop(x, label, side, num, classes, seen, scales):
    """RegionLossLayer::Forward_cpu (no softmax_tree, no class_map): (loss, real_diff_)."""
    obj_s, noobj_s, cls_s, coord_s, thresh = scales
    sw = _swap(x, num)
    size = 5 + classes
    for b in range(sw.shape[0]):  # the activations, in place
        for c in range(side * side):
            for n in range(num):
                sw[b, c, n, 4] = _sig(sw[b, c, n, 4])
                e = np.exp(sw[b, c, n, 5:] - sw[b, c, n, 5:].max())
                sw[b, c, n, 5:] = e / e.sum()
    diff = np.zeros_like(sw)

    def delta_box(truth, b, c, n, i, j, scale):
        s = sw[b, c, n]
        tx, ty = F(truth[0] * side - i), F(truth[1] * side - j)
        tw = math.log(truth[2] * side / BIASES[2 * n])
        th = math.log(truth[3] * side / BIASES[2 * n + 1])
        sx, sy = _sig(s[0]), _sig(s[1])
        diff[b, c, n, :4] = [-scale * (tx - sx) * sx * (1 - sx), -scale * (ty - sy) * sy * (1 - sy),
                             -scale * (tw - s[2]), -scale * (th - s[3])]  # fmt: skip

    for b in range(sw.shape[0]):
        truths = label[b].reshape(30, 5)
        for j in range(side):
            for i in range(side):
                for n in range(num):
                    c, s = j * side + i, sw[b, j * side + i, n]
                    best = F(0)
                    for t in truths:
                        if not t[1]:
                            break
                        best = max(best, calc_iou(_box(s, n, i, j, side), t[1:]))
                    diff[b, c, n, 4] = -1 * noobj_s * (0 - s[4]) * s[4] * (1 - s[4])
                    if best > thresh:
                        diff[b, c, n, 4] = 0
                    if seen < 12800 // sw.shape[0]:
                        prior = [(i + 0.5) / side, (j + 0.5) / side, BIASES[2 * n] / side,
                                 BIASES[2 * n + 1] / side]  # fmt: skip
                        delta_box(prior, b, c, n, i, j, 0.01)
        for t in truths:
            if not t[3]:
                break
            i, j = int(F(t[1]) * side), int(F(t[2]) * side)
            ious = [calc_iou([0, 0, BIASES[2 * n] / side, BIASES[2 * n + 1] / side],
                             [0, 0, t[3], t[4]]) for n in range(num)]  # fmt: skip
            best_n = max(range(num), key=lambda n: (ious[n], -n))
            c = j * side + i
            delta_box(t[1:], b, c, best_n, i, j, coord_s)
            o = sw[b, c, best_n, 4]
            diff[b, c, best_n, 4] = -1.0 * obj_s * (1 - o) * (o * (1 - o))
            onehot = np.arange(classes) == int(t[0])
            diff[b, c, best_n, 5:size] = -1.0 * cls_s * (onehot - sw[b, c, best_n, 5:size])
    real = diff.reshape(x.shape[0], side, side, -1).transpose(0, 3, 1, 2)
    return float((real.astype(np.float64) ** 2).sum()), real


def _region_net(side=3, num=2, classes=3, n=2) -> str:
    layer = ('layer { name: "loss" type: "RegionLoss" bottom: "x" bottom: "label" top: "loss" '
             f"region_loss_param {{ side: {side} num_class: {classes} coords: 4 num: {num} "
             "object_scale: 5 noobject_scale: 1 class_scale: 1 coord_scale: 1 thresh: 0.6 "
             + " ".join(f"biases: {b}" for b in BIASES) + " } }")  # fmt: skip
    return net(layer, {"x": (n, num * (5 + classes), side, side), "label": (n, 150)})


def _labels(n=2):
    label = np.zeros((n, 150), np.float32)
    label[0, :10] = [2, 0.4, 0.5, 0.3, 0.5, 0, 0.8, 0.15, 0.2, 0.1]
    label[1, :15] = [1, 0.2, 0.7, 0.6, 0.25, 2, 0.55, 0.45, 0.1, 0.3, 1, 0.9, 0.9, 0.2, 0.2]
    label[1, 20:25] = [0, 0.5, 0.5, 0.5, 0.5]  # after the first empty row: never read
    return label


@pytest.mark.parametrize("seen", (0, 7000))
def test_region_loss_value_and_the_forks_delta_as_gradient(seen):
    """Loss Σ delta² and bottom diff top_diff/N · delta (the fork's rule) inside
    value_and_grad of the jitted loss; ``seen`` forwards switch the prior pull off at
    12800/N."""
    x, label = RNG.standard_normal((2, 16, 3, 3)), _labels()
    model = compile_net(_region_net(), phase="TRAIN", dialect="yolov2")
    params, state = model.init(0)
    state.carry["loss"] = [jnp.full((1,), seen, jnp.float32)]
    feed = {"label": jnp.asarray(label)}

    def loss(xx):
        blobs, _ = model.apply(params, state, {**feed, "x": xx}, None)
        return blobs["loss"] * 0.5

    value, grad = jitted.value_and_grad(loss)(jnp.asarray(x, jnp.float32))
    want, delta = region_loss_loop(x, label, 3, 2, 3, seen, (5, 1, 1, 1, 0.6))
    assert float(value) == pytest.approx(0.5 * want, rel=1e-5)
    np.testing.assert_allclose(np.asarray(grad), 0.5 / 2 * delta, rtol=1e-4, atol=1e-6)


def test_region_loss_counts_its_forwards():
    model = compile_net(_region_net(), phase="TRAIN", dialect="yolov2")
    params, state = model.init(0)
    feed = {"x": jnp.zeros((2, 16, 3, 3)), "label": jnp.asarray(_labels())}
    for _ in range(3):
        _, state = jitted.forward(model, params, state, feed)
    assert float(state.carry["loss"][0][0]) == 3


def test_region_loss_trains_through_the_train_step():
    """A conv head and gklz1982's RegionLoss: 30 SGD steps through runtime/train's compiled
    step lower the loss."""
    from caffe2jax.runtime.train.step import Trainer

    head = (
        'layer { name: "conv" type: "Convolution" bottom: "data" top: "x" convolution_param '
        '{ num_output: 16 kernel_size: 1 weight_filler { type: "gaussian" std: 0.1 } } }\n'
    )
    text = net(head + _region_net().split("\n", 2)[2], {"data": (2, 4, 3, 3), "label": (2, 150)})
    model = compile_net(text, phase="TRAIN", dialect="yolov2")
    params, state = model.init(0)
    solver = caffe_pb2.SolverParameter(base_lr=0.05, lr_policy="fixed", momentum=0.9)
    trainer = Trainer(model, solver, params, state)
    opt = trainer.init(params, state)
    batch = [{"data": RNG.standard_normal((2, 4, 3, 3)).astype(np.float32), "label": _labels()}]
    losses = []
    for it in range(30):
        params, state, opt, *rest = trainer.step(params, state, opt, batch, jax.random.key(0), it)
        blobs, _ = jitted.forward(
            model, params, state, {k: jnp.asarray(v) for k, v in batch[0].items()}
        )
        losses.append(float(blobs["loss"]))
    assert np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0], losses


def test_region_loss_with_eric612_given_wants_its_label():
    """eric612's RegionLoss (lowering/forks/yolo_eric612.py): given dialect eric612,
    gklz1982's net (4 biases, 30 truths) is refused in one line naming the layer; with no
    dialect the label decides (tests/lowering/forks/test_yolo_eric612.py)."""
    with pytest.raises(NetError, match="layer 'loss'.*eric612's RegionLoss"):
        compile_net(_region_net(), phase="TRAIN", dialect="eric612")
    assert compile_net(_region_net(), phase="TRAIN").net.layer("loss").form == ""
