"""lowering/forks/rfcn_ohem.py: R-FCN's SoftmaxWithLossOHEM, SmoothL1LossOHEM and BoxAnnotatorOHEM
on hand-worked cases from the fork's GPU code, gradients included."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import fd_check, net, ours

SCORES = np.array([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0], [2.0, 2.0, 2.0], [0.3, 0.1, -0.4]])
LABELS = np.array([2, -1, 0, 1], np.float32).reshape(4, 1, 1, 1)  # one ignored roi


def _softmax_text(loss_param: str, tops: int = 3) -> str:
    names = ["loss", "prob", "per_roi"][:tops]
    layer = ('layer { name: "s" type: "SoftmaxWithLossOHEM" bottom: "x" bottom: "labels" '
             + "".join(f'top: "{t}" ' for t in names)
             + "loss_weight: 1 " + "loss_weight: 0 " * (tops - 1)
             + f"loss_param {{ {loss_param} }} }}")  # fmt: skip
    return net(layer, {"x": SCORES.shape, "labels": LABELS.shape})


def _per_roi() -> np.ndarray:
    p = np.exp(SCORES) / np.exp(SCORES).sum(axis=1, keepdims=True)
    return np.array([-np.log(p[0, 2]), 0.0, -np.log(p[2, 0]), -np.log(p[3, 1])])


@pytest.mark.parametrize(
    "param, divisor",
    [
        ("ignore_label: -1", 3),  # VALID (default): the counted rois
        ("ignore_label: -1 normalization: FULL", 4),
        ("ignore_label: -1 normalization: BATCH_SIZE", 4),
        ("ignore_label: -1 normalization: NONE", 1),
        ("ignore_label: -1 normalize: false", 4),  # legacy: BATCH_SIZE
    ],
)
def test_softmax_loss_ohem_tops(param, divisor):
    blobs = ours(_softmax_text(param), {"x": SCORES, "labels": LABELS})
    np.testing.assert_allclose(blobs["loss"], _per_roi().sum() / divisor, rtol=1e-6)
    np.testing.assert_allclose(blobs["per_roi"], _per_roi().reshape(4, 1, 1, 1), rtol=1e-6)
    assert blobs["prob"].shape == (4, 3)


def test_softmax_loss_ohem_negative_label_without_ignore_label():
    """A −1 label with no ignore_label (the padding rows of the built-in py-R-FCN proposal
    target layer): loss 0, not counted; a label past the classes stays NaN."""
    blobs = ours(_softmax_text(""), {"x": SCORES, "labels": LABELS})
    np.testing.assert_allclose(blobs["per_roi"], _per_roi().reshape(4, 1, 1, 1), rtol=1e-6)
    np.testing.assert_allclose(blobs["loss"], _per_roi().sum() / 3, rtol=1e-6)
    high = np.array([2, 3, 0, 1], np.float32).reshape(4, 1, 1, 1)
    assert np.isnan(ours(_softmax_text(""), {"x": SCORES, "labels": high})["per_roi"][1]).all()


def test_softmax_loss_ohem_gradient_and_refusals():
    fd_check(_softmax_text("ignore_label: -1", tops=1), {"x": SCORES}, "loss",
             fixed={"labels": LABELS})  # fmt: skip
    with pytest.raises(NetError, match="no PRE_FIXED"):
        compile_net(_softmax_text("normalization: PRE_FIXED pre_fixed_normalizer: 2"))


PRED = np.array([0.5, 3.0, -2.0, 0.2], np.float32).reshape(2, 2, 1, 1)
WEIGHTS = np.array([1.0, 1.0, 0.5, 0.0], np.float32).reshape(2, 2, 1, 1)
# d = w·(pred − 0) = 0.5, 3, −1, 0 → f = 0.125, 2.5, 0.5, 0; per roi 2.625, 0.5


def _l1_text(loss_param: str) -> str:
    layer = ('layer { name: "s" type: "SmoothL1LossOHEM" bottom: "pred" bottom: "target" '
             'bottom: "w" top: "loss" top: "per_roi" loss_weight: 1 loss_weight: 0 '
             f"loss_param {{ {loss_param} }} }}")  # fmt: skip
    return net(layer, {"pred": PRED.shape, "target": PRED.shape, "w": PRED.shape})


@pytest.mark.parametrize(
    "param, divisor",
    [
        ("normalization: PRE_FIXED pre_fixed_normalizer: 4", 4),
        ("normalization: PRE_FIXED pre_fixed_normalizer: 0.5", 1),  # at least 1
        ("", 2),  # VALID: num·height·width, channels not counted
        ("normalization: FULL", 2),
        ("normalization: NONE", 1),
    ],
)
def test_smooth_l1_loss_ohem_tops(param, divisor):
    feed = {"pred": PRED, "target": np.zeros_like(PRED), "w": WEIGHTS}
    blobs = ours(_l1_text(param), feed)
    np.testing.assert_allclose(blobs["loss"], 3.125 / divisor, rtol=1e-6)
    np.testing.assert_allclose(blobs["per_roi"], np.array([2.625, 0.5]).reshape(2, 1, 1, 1))


def test_smooth_l1_loss_ohem_diff_has_no_weight_factor():
    """The fork's backward: ±f'(d)·top_diff/normaliser with f'(d) = d (|d| < 1) or sign(d),
    not multiplied by w (the chain rule would give −0.5 for the third entry), and no diff to
    w."""
    model = compile_net(_l1_text("normalization: PRE_FIXED pre_fixed_normalizer: 4"))
    params, state = model.init(0)

    def loss(feed):
        return jitted.forward(model, params, state, feed)[0]["loss"]

    feed = {"pred": PRED, "target": np.zeros_like(PRED), "w": WEIGHTS}
    grads = jax.grad(loss)({k: jnp.asarray(v) for k, v in feed.items()})
    expected = np.array([0.5, 1.0, -1.0, 0.0]).reshape(2, 2, 1, 1) / 4
    np.testing.assert_allclose(grads["pred"], expected, rtol=1e-6)
    np.testing.assert_allclose(grads["target"], -expected, rtol=1e-6)
    assert not np.any(np.asarray(grads["w"]))


def test_smooth_l1_loss_ohem_gradient_with_unit_weights():
    """With 0/1 weights (R-FCN's) the fork's backward is the true gradient."""
    w = np.array([1.0, 0.0, 1.0, 1.0]).reshape(2, 2, 1, 1)
    fd_check(_l1_text("normalization: PRE_FIXED pre_fixed_normalizer: 4"),
             {"pred": PRED.astype(np.float64) + 0.01, "target": np.zeros_like(PRED) + 0.3},
             "loss", fixed={"w": w})  # fmt: skip


def test_smooth_l1_loss_ohem_refuses_mismatched_bottoms():
    layer = ('layer { name: "s" type: "SmoothL1LossOHEM" bottom: "pred" bottom: "target" '
             'top: "loss" }')  # fmt: skip
    with pytest.raises(NetError, match="SmoothL1LossOHEM"):
        compile_net(net(layer, {"pred": (2, 4), "target": (2, 8)}))


IMAGE = [0, 0, 1, 0, 1, 1, 0]
LOSS = np.array([0.5, 0.9, 0.5, 0.5, 0.2, 0.7, 0.1], np.float32)
ROI_LABELS = np.array([1, 2, 3, 1, 2, 3, 1], np.float32)


def _annotator_text(shapes: dict) -> str:
    layer = ('layer { name: "b" type: "BoxAnnotatorOHEM" bottom: "rois" bottom: "loss" '
             'bottom: "labels" bottom: "w" top: "labels_ohem" top: "w_ohem" '
             "box_annotator_ohem_param { roi_per_img: 2 ignore_label: -1 } }")  # fmt: skip
    return net(layer, shapes)


def test_box_annotator_ohem_keeps_each_images_hardest_rois():
    """roi_per_img 2. Image 0 (rois 0, 1, 3, 6; losses .5 .9 .5 .1): rois 1 and 0 (the tie
    .5/.5 goes to the lower index); image 1 (rois 2, 4, 5; .5 .2 .7): rois 5 and 2. Rois (R, 5)
    and per-roi blobs (R,), as 2-D and 1-D blobs: the tops come out 4-D as the fork's."""
    rois = np.zeros((7, 5), np.float32)
    rois[:, 0] = IMAGE
    rois[:, 1:] = np.arange(28).reshape(7, 4)
    w = np.random.default_rng(1).uniform(0.5, 1.0, (7, 8)).astype(np.float32)
    feed = {"rois": rois, "loss": LOSS, "labels": ROI_LABELS, "w": w}
    blobs = ours(_annotator_text({k: v.shape for k, v in feed.items()}), feed)
    keep = np.array([1, 1, 1, 0, 0, 1, 0], bool)
    np.testing.assert_array_equal(blobs["labels_ohem"].ravel(), np.where(keep, ROI_LABELS, -1))
    assert blobs["labels_ohem"].shape == (7, 1, 1, 1)
    np.testing.assert_array_equal(blobs["w_ohem"], np.where(keep[:, None], w, 0)[..., None, None])


def test_box_annotator_ohem_refuses_other_shapes():
    with pytest.raises(NetError, match="rois \\(num, 5, H, W\\)"):
        compile_net(_annotator_text({"rois": (7, 4), "loss": (7,), "labels": (7,), "w": (7, 8)}))


# -- the OHEM head of py-R-FCN's ResNet-50 train_agnostic_ohem.prototxt, read in place --------

RFCN = "rfcn_resnet50_voc_train_ohem.prototxt"
#: what the RPN / proposal-target layers give the head: 300 rois of one image, 21 classes
HEAD_INPUTS = {"cls_score": (300, 21, 1, 1), "bbox_pred": (300, 8, 1, 1),
               "rois": (300, 5, 1, 1), "labels": (300, 1, 1, 1),
               "bbox_targets": (300, 8, 1, 1), "bbox_inside_weights": (300, 8, 1, 1),
               "bbox_outside_weights": (300, 8, 1, 1)}  # fmt: skip


def _rfcn_head() -> str:
    """The fork file's layers from per_roi_loss_cls on (OHEM losses, Eltwise, the annotator,
    Silence, the final SoftmaxWithLoss / Accuracy / SmoothL1LossOHEM), fed by Input layers."""
    from google.protobuf import text_format

    from caffe2jax.frontend.parse import read_net
    from tests.forks import FORK_MODELS

    full = read_net(FORK_MODELS / RFCN)
    names = [layer.name for layer in full.layer]
    head = full.layer[names.index("per_roi_loss_cls") :]
    assert [layer.type for layer in head] == [
        "SoftmaxWithLossOHEM", "SmoothL1LossOHEM", "Eltwise", "BoxAnnotatorOHEM", "Silence",
        "SoftmaxWithLoss", "Accuracy", "SmoothL1LossOHEM",
    ]  # fmt: skip
    return net("".join(f"layer {{ {text_format.MessageToString(x, as_one_line=True)} }}\n"
                       for x in head), HEAD_INPUTS)  # fmt: skip


def test_rfcn_ohem_head_from_the_fork_prototxt():
    """128 hardest of 300 rois (per-roi softmax + smooth-L1 loss) keep their labels and bbox
    weights; loss_cls averages the softmax loss over them, loss_bbox sums their smooth-L1 / 128
    (PRE_FIXED), and only they get gradients."""
    rng = np.random.default_rng(4)
    feed = {k: rng.standard_normal(s).astype(np.float32) for k, s in HEAD_INPUTS.items()}
    feed["rois"][:, 0] = 0
    feed["labels"] = rng.integers(0, 21, (300, 1, 1, 1)).astype(np.float32)
    feed["bbox_inside_weights"] = (feed["labels"] > 0) * np.ones((300, 8, 1, 1), np.float32)
    model = compile_net(_rfcn_head(), phase="TRAIN")
    params, state = model.init(0)
    blobs, _ = jitted.forward(model, params, state, feed)
    score = feed["cls_score"][:, :, 0, 0].astype(np.float64)
    logp = score - np.log(np.exp(score).sum(axis=1, keepdims=True))
    lab = feed["labels"].ravel().astype(int)
    cls = -logp[np.arange(300), lab]
    d = feed["bbox_inside_weights"] * (feed["bbox_pred"] - feed["bbox_targets"])
    l1 = np.where(np.abs(d) < 1, 0.5 * d * d, np.abs(d) - 0.5).sum(axis=(1, 2, 3))
    hard = np.argsort(-(cls + l1), kind="stable")[:128]
    keep = np.zeros(300, bool)
    keep[hard] = True
    np.testing.assert_array_equal(np.asarray(blobs["labels_ohem"]).ravel(), np.where(keep, lab, -1))
    np.testing.assert_allclose(blobs["loss_cls"], cls[keep].mean(), rtol=1e-5)
    np.testing.assert_allclose(blobs["loss_bbox"], l1[keep].sum() / 128, rtol=1e-5)
    grads = jax.grad(lambda x: model.loss(params, state, {**feed, "cls_score": x})[0])(
        jnp.asarray(feed["cls_score"])
    )
    assert np.all(np.any(np.asarray(grads)[keep] != 0, axis=1))
    assert not np.any(np.asarray(grads)[~keep])


def test_rfcn_train_net_stops_only_at_layers_outside_ohem():
    """The whole fork file: what stops its compile is named, and is not an OHEM layer (today
    SmoothL1Loss in its R-CNN form and py-R-FCN's Python layers, built by other branches)."""
    from tests.forks import FORK_MODELS

    try:
        compile_net(str(FORK_MODELS / RFCN), phase="TRAIN")
    except NetError as err:
        message = str(err)
        assert "OHEM" not in message, message
        assert "(type SmoothL1Loss)" in message or "(type Python)" in message, message
