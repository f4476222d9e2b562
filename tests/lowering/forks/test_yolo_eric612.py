"""lowering/forks/yolo_eric612.py: eric612/MobileNet-YOLO's RegionLoss against a NumPy loop
transcribed from the fork's Forward_cpu/Backward_cpu (src/caffe/layers/region_loss_layer.cpp at
eric612/MobileNet-YOLO@69b4441, flat indices as the fork walks them), run jitted inside
value_and_grad; which port a RegionLoss is (the label decides when the text cannot); an
eric612-style YOLOv2 train net (AnnotatedData → darknet-like body → two RegionLoss) compiled."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.forks import FORK_MODELS
from tests.lowering.fork_nets import net

F = np.float32
RNG = np.random.default_rng(612)
BIASES = [1.08, 1.19, 3.42, 4.41, 6.63, 11.38, 9.42, 5.11, 16.62, 10.52]


def _sig(v):
    return F(1) / (F(1) + np.exp(-F(v)))


def box_iou(a, b):
    """The fork's overlap / box_intersection / box_union / box_iou, in float."""

    def overlap(x1, w1, x2, w2):
        left = max(F(x1 - w1 / 2), F(x2 - w2 / 2))
        right = min(F(x1 + w1 / 2), F(x2 + w2 / 2))
        return F(right - left)

    w, h = overlap(a[0], a[2], b[0], b[2]), overlap(a[1], a[3], b[1], b[3])
    inter = F(0) if w < 0 or h < 0 else F(w * h)
    return F(inter / F(F(a[2] * a[3]) + F(b[2] * b[3]) - inter))


def _region_box(x, n, index, i, j, side, stride):
    return [F((i + _sig(x[index])) / side), F((j + _sig(x[index + stride])) / side),
            F(np.exp(x[index + 2 * stride]) * F(BIASES[2 * n]) / side),
            F(np.exp(x[index + 3 * stride]) * F(BIASES[2 * n + 1]) / side)]  # fmt: skip


def _delta_box(truth, x, n, index, i, j, side, diff, scale, stride):
    pred = _region_box(x, n, index, i, j, side, stride)
    iou = box_iou(pred, truth)
    tx, ty = F(truth[0] * side - i), F(truth[1] * side - j)
    tw = F(np.log(F(truth[2] * side / F(BIASES[2 * n]))))
    th = F(np.log(F(truth[3] * side / F(BIASES[2 * n + 1]))))
    for k, t in ((0, tx), (1, ty)):
        sv = _sig(x[index + k * stride])
        diff[index + k * stride] = -1 * scale * (t - sv) * sv * (1 - sv)
    diff[index + 2 * stride] = -1 * scale * (tw - x[index + 2 * stride])
    diff[index + 3 * stride] = -1 * scale * (th - x[index + 3 * stride])
    return iou


def _activate(x, num, classes, side):
    n_img, count = x.shape[0], x[0].size
    stride, length = side * side, 5 + classes
    swap = x.reshape(-1).astype(F).copy()
    for b in range(n_img):
        for s in range(stride):
            for n in range(num):
                index = n * length * stride + s + b * count
                swap[index + 4 * stride] = _sig(swap[index + 4 * stride])
                logits = swap[index + 5 * stride : index + length * stride : stride]
                e = np.exp(logits - logits.max())
                swap[index + 5 * stride : index + length * stride : stride] = e / e.sum()
    return swap


def _noobj_pass(swap, label, diff, b, num, classes, side, scales):
    count, stride, length = swap.size // (label.size // 1500), side * side, 5 + classes
    _, noobj, _, _, thresh, _, _ = scales
    for s in range(stride):
        for n in range(num):
            index = n * length * stride + s + b * count
            pred = _region_box(swap, n, index, s % side, s // side, side, stride)
            best = F(0)
            for t in range(300):
                x, y, w, h = label[b * 1500 + t * 5 + 1 : b * 1500 + t * 5 + 5]
                if not x:
                    break
                iou = box_iou(pred, [x, y, w, h])
                best = iou if iou > best else best
            o = swap[index + 4 * stride]
            diff[index + 4 * stride] = -1 * noobj * (0 - o) * ((1 - o) * o)
            if best > thresh:
                diff[index + 4 * stride] = 0


def _truth_pass(swap, label, diff, b, num, classes, side, scales):
    count, stride, length = swap.size // (label.size // 1500), side * side, 5 + classes
    obj_s, _, cls_s, coord_s, _, rescore, bias_match = scales
    for t in range(300):
        cls, x, y, w, h = label[b * 1500 + t * 5 : b * 1500 + t * 5 + 5]
        if not w:
            break
        truth, i, j = [x, y, w, h], int(F(x * side)), int(F(y * side))
        best, best_index, best_n = F(0), 0, 0
        for n in range(num):
            index2 = n * length * stride + j * side + i + b * count
            pred = _region_box(swap, n, index2, i, j, side, stride)
            if bias_match:
                pred[2], pred[3] = F(F(BIASES[2 * n]) / side), F(F(BIASES[2 * n + 1]) / side)
            iou = box_iou([0, 0, pred[2], pred[3]], [0, 0, w, h])
            if iou > best:
                best, best_index, best_n = iou, index2, n
        scale = coord_s if rescore else coord_s * (2 - F(w * h))
        iou = _delta_box(truth, swap, best_n, best_index, i, j, side, diff, scale, stride)
        o = swap[best_index + 4 * stride]
        target = iou if rescore else 1
        diff[best_index + 4 * stride] = -1.0 * obj_s * (target - o) * ((1 - o) * o)
        for c in range(classes):
            at = best_index + (5 + c) * stride
            diff[at] = -1.0 * cls_s * ((1 if c == int(cls) else 0) - swap[at])


def region_loss_loop(x, label, num, classes, scales):
    """Forward_cpu: (loss Σ diff² / N, diff_ in the bottom's layout)."""
    side = x.shape[3]
    label = label.reshape(-1).astype(F)
    swap = _activate(x, num, classes, side)
    diff = np.zeros_like(swap)
    for b in range(x.shape[0]):
        _noobj_pass(swap, label, diff, b, num, classes, side, scales)
        _truth_pass(swap, label, diff, b, num, classes, side, scales)
    return float((diff.astype(np.float64) ** 2).sum() / x.shape[0]), diff.reshape(x.shape)


def _labels(n=2):
    label = np.zeros((n, 1, 300, 5), F)
    label[0, 0, :2] = [[2, 0.4, 0.5, 0.3, 0.5], [0, 0.8, 0.15, 0.2, 0.1]]
    label[1, 0, :3] = [[1, 0.2, 0.7, 0.6, 0.25], [2, 0.55, 0.45, 0.1, 0.3], [1, 0.9, 0.9, 0.2, 0.2]]
    label[1, 0, 4] = [0, 0.5, 0.5, 0.5, 0.5]  # after the first empty row: never read
    return label


def _loss_layer(name="loss", bottom="x", classes=3, rescore=1, bias_match=1, thresh=0.6, side=13):
    return (f'layer {{ name: "{name}" type: "RegionLoss" bottom: "{bottom}" bottom: "label" '
            f'top: "{name}" region_loss_param {{ side: {side} num_class: {classes} coords: 4 '
            f"num: 5 rescore: {rescore} bias_match: {bias_match} object_scale: 5 "
            f"noobject_scale: 1 class_scale: 1 coord_scale: 1 thresh: {thresh} "
            + " ".join(f"biases: {b}" for b in BIASES) + " } }\n")  # fmt: skip


@pytest.mark.parametrize(("rescore", "bias_match", "thresh"), ((1, 1, 0.6), (0, 1, 0.6),
                                                              (1, 0, 0.02)))  # fmt: skip
def test_region_loss_value_and_the_forks_diff_as_gradient(rescore, bias_match, thresh):
    """Loss Σ diff² / N and bottom diff top_diff / N · diff_ (the fork's Backward_cpu) inside
    value_and_grad of the jitted loss, for both ``rescore`` settings, anchors chosen by the
    biases' shapes or the predicted ones, and a ``thresh`` low enough that overlapping boxes
    lose their no-object delta; the label decides the port (300 × 5 per image: eric612's)
    with no dialect given. The middle image of three has no truth."""
    label = np.concatenate([_labels()[:1], np.zeros((1, 1, 300, 5), F), _labels()[1:]])
    x = RNG.standard_normal((3, 40, 3, 3)).astype(F)
    layer = _loss_layer(rescore=rescore, bias_match=bias_match, thresh=thresh)
    text = net(layer, {"x": x.shape, "label": label.shape})
    model = compile_net(text, phase="TRAIN")
    assert model.net.layer("loss").form == ""
    params, state = model.init(0)

    def loss(xx):
        blobs, _ = model.apply(params, state, {"label": jnp.asarray(label), "x": xx}, None)
        return blobs["loss"] * 0.5

    value, grad = jitted.value_and_grad(loss)(jnp.asarray(x))
    want, diff = region_loss_loop(x, label, 5, 3, (5, 1, 1, 1, thresh, rescore, bias_match))
    assert (diff.reshape(3, 5, 8, 9)[:, :, 4] == 0).any() == (thresh < 0.5)
    assert float(value) == pytest.approx(0.5 * want, rel=1e-5)
    assert np.abs(diff[1, :]).max() > 0 and np.abs(diff[2]).max() > 0
    # diff_ entries are products of four float32 factors; XLA fuses and reorders them
    np.testing.assert_allclose(np.asarray(grad), 0.5 / 3 * diff, rtol=2e-5, atol=1e-7)


def _gklz_labels(n=2):
    label = np.zeros((n, 150), F)
    label[0, :10] = [2, 0.4, 0.5, 0.3, 0.5, 0, 0.8, 0.15, 0.2, 0.1]
    label[1, :5] = [1, 0.2, 0.7, 0.6, 0.25]
    return label


def test_the_label_decides_the_port_when_the_text_cannot():
    """Both ports declare the same RegionLossParameter, so a net whose only YOLOv2 evidence is
    RegionLoss has form "": a label of 30 × 5 values per image runs gklz1982's loss (the same
    value as dialect yolov2's), one of 300 × 5 eric612's; the given dialects pick their form."""
    x = RNG.standard_normal((2, 40, 3, 3)).astype(F)
    gklz = _gklz_labels()
    text = net(_loss_layer(side=3), {"x": x.shape, "label": gklz.shape})
    values = {}
    for dialect in (None, "yolov2"):
        model = compile_net(text, phase="TRAIN", dialect=dialect)
        assert model.net.layer("loss").form == ("yolov2" if dialect else "")
        params, state = model.init(0)
        blobs, _ = jitted.forward(model, params, state, {"x": x, "label": gklz})
        values[dialect] = float(blobs["loss"])
    assert values[None] == values["yolov2"]
    eric = _labels()
    model = compile_net(net(_loss_layer(), {"x": x.shape, "label": eric.shape}), phase="TRAIN",
                        dialect="eric612")  # fmt: skip
    assert model.net.layer("loss").form == "eric612"
    params, state = model.init(0)
    blobs, _ = jitted.forward(model, params, state, {"x": x, "label": eric})
    want, _ = region_loss_loop(x, eric, 5, 3, (5, 1, 1, 1, 0.6, 1, 1))
    assert float(blobs["loss"]) == pytest.approx(want, rel=1e-5)


def test_gklz1982_evidence_keeps_its_form():
    """A net with gklz1982's YOLO DetectionOutput fields reads as caffe-yolov2's: form
    yolov2 without a dialect."""
    out = ('layer { name: "det" type: "DetectionOutput" bottom: "x" top: "det" '
           'include { phase: TEST } detection_output_param { side: 3 num_box: 5 '
           "num_classes: 3 coords: 4 } }\n")  # fmt: skip
    text = net(_loss_layer(side=3) + out, {"x": (2, 40, 3, 3), "label": (2, 150)})
    assert compile_net(text, phase="TRAIN").net.layer("loss").form == "yolov2"


@pytest.mark.parametrize(
    ("layer", "shapes", "message"),
    (
        (_loss_layer(), {"x": (2, 40, 3, 3), "label": (2, 1, 30, 8)},
         r"layer 'loss' \(type RegionLoss\): the label \[2, 1, 30, 8\] is neither gklz1982's"),
        (_loss_layer().replace("biases: 16.62 biases: 10.52", ""),
         {"x": (2, 40, 3, 3), "label": (2, 1, 300, 5)}, "8 biases: eric612's RegionLoss"),
        (_loss_layer(), {"x": (2, 40, 3, 4), "label": (2, 1, 300, 5)}, "a square grid"),
        (_loss_layer(), {"x": (2, 45, 3, 3), "label": (2, 1, 300, 5)}, "45 channels"),
    ),
)  # fmt: skip
def test_refusals_are_one_line_naming_the_layer(layer, shapes, message):
    with pytest.raises(NetError, match=message) as err:
        model = compile_net(net(layer, shapes), phase="TRAIN")
        model.init(0)
    assert "\n" not in str(err.value)


def _eric612_train_net() -> str:
    """The real eric612 darknet19 YOLOv2 net (../shared/forks/models, its Input header
    dropped) in the form of eric612's own train prototxts (models/yolov2/
    mobilenet_yolo_train.prototxt): AnnotatedData with yolo_data_type 1 in TRAIN and the
    RegionLoss on the head (its YoloDetectionOutput is TEST only)."""
    deploy = (FORK_MODELS / "yolov2_darknet19_eric612.prototxt").read_text()
    body = deploy[deploy.index("layer {") :]
    data = ('layer { name: "data" type: "AnnotatedData" top: "data" top: "label" '
            "include { phase: TRAIN } transform_param { scale: 0.007843 mirror: true "
            "mean_value: 127.5 mean_value: 127.5 mean_value: 127.5 } "
            'data_param { source: "voc_lmdb" batch_size: 1 backend: LMDB } '
            "annotated_data_param { yolo_data_type: 1 yolo_data_jitter: 0.3 } }\n")  # fmt: skip
    loss = _loss_layer("det_loss1", "conv23_indoor", classes=20)
    return data + body + loss.replace("coord_scale: 1", "coord_scale: 1 jitter: 0.2 random: 0")


def test_eric612_train_net_compiles_and_its_loss_is_the_forks():
    """The eric612 YOLOv2 train form compiled from the text alone (dialect eric612 from
    yolo_data_type, RegionLoss's form from its label), 96×96 input (a 3×3 grid): its loss
    inside value_and_grad equals the fork's loop on the head's blob."""
    text = _eric612_train_net()
    model = compile_net(text, phase="TRAIN", input_shapes={"data": (1, 3, 96, 96),
                                                            "label": (1, 1, 300, 5)})  # fmt: skip
    assert model.net.dialect == "eric612"
    assert model.net.layer("det_loss1").form == ""
    params, state = model.init(0)
    label = np.zeros((1, 1, 300, 5), F)
    label[0, 0, :2] = [[14, 0.5, 0.4, 0.6, 0.7], [3, 0.2, 0.8, 0.1, 0.2]]
    feed = {"data": RNG.uniform(-1, 1, (1, 3, 96, 96)).astype(F), "label": label}

    def loss(head_params):
        blobs, _ = model.apply({**params, "conv23_indoor": head_params}, state, feed, None)
        return blobs["det_loss1"], blobs["conv23_indoor"]

    # the gradient taken for the head's params only: the loss is the train step's, and the
    # backward of the 22 layers below it (which adds a minute of compile on 2 cores) is no part
    # of what this test checks (RegionLoss's gradient: the test above)
    (value, head), grads = jitted.value_and_grad(loss, has_aux=True)(params["conv23_indoor"])
    want, _ = region_loss_loop(np.asarray(head), label, 5, 20, (5, 1, 1, 1, 0.6, 1, 1))
    assert float(value) == pytest.approx(want, rel=1e-5)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree_util.tree_leaves(grads))
