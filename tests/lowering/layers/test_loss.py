"""Loss layers (lowering/layers/loss.py) beyond the golden cases: every loss normalisation, Caffe's
backward where it is not the true derivative, label checks, Accuracy's ties and compile-time
errors naming blobs and shapes."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.registry import lookup
from tests.lowering.nets import apply, grads, loss_layer, one_layer, softmax_np

jax.config.update("jax_default_matmul_precision", "highest")

RNG = np.random.default_rng(7)
SCORES = RNG.normal(size=(4, 3, 2)).astype(np.float32)  # (outer, classes, inner)
LABELS = np.array([[0, 2], [1, -1], [-1, -1], [2, 0]], np.float32)  # -1: ignored


# -- SoftmaxWithLoss and its normalisations -----------------------------------------------


def softmax_nll(scores, labels):
    """Per-position −log p[label] (0 where ignored), and the VALID count."""
    p = softmax_np(scores.astype(np.float64))
    valid = labels >= 0
    lab = np.where(valid, labels, 0).astype(int)
    picked = np.take_along_axis(p, lab[:, None, :], axis=1)[:, 0, :]
    return np.where(valid, -np.log(picked), 0.0), valid.sum()


@pytest.mark.parametrize(
    "loss_param, normaliser",
    [
        ("", "valid"),
        ("normalization: VALID", "valid"),
        ("normalization: FULL", 8),
        ("normalization: BATCH_SIZE", 4),
        ("normalization: NONE", 1),
        ("normalize: true", "valid"),
        ("normalize: false", 4),
    ],
)
def test_softmax_loss_normalisation(loss_param, normaliser):
    nll, n_valid = softmax_nll(SCORES, LABELS)
    norm = n_valid if normaliser == "valid" else normaliser
    model = loss_layer(
        "SoftmaxWithLoss",
        f"loss_param {{ ignore_label: -1 {loss_param} }}",
        {"s": SCORES, "label": LABELS},
    )
    loss, g = grads(model, {"s": SCORES, "label": LABELS}, "loss", 2.0)
    np.testing.assert_allclose(loss, nll.sum() / norm, rtol=1e-6)
    onehot = np.zeros_like(SCORES)
    for (i, j), lab in np.ndenumerate(LABELS):
        if lab >= 0:
            onehot[i, int(lab), j] = 1
    want = (softmax_np(SCORES) - onehot) * (LABELS >= 0)[:, None, :] * 2.0 / norm
    np.testing.assert_allclose(g["s"], want, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(g["label"], 0)


def test_softmax_loss_all_ignored_is_zero_not_nan():
    labels = np.full((4, 2), -1, np.float32)
    model = loss_layer(
        "SoftmaxWithLoss", "loss_param { ignore_label: -1 }", {"s": SCORES, "l": labels}
    )
    loss, g = grads(model, {"s": SCORES, "l": labels}, "loss")
    assert loss == 0 and np.all(g["s"] == 0)


def test_softmax_loss_clamps_at_flt_min_but_keeps_caffes_gradient():
    s = np.array([[0.0, 200.0]], np.float32)  # p[0] = e^-200 underflows FLT_MIN
    model = loss_layer("SoftmaxWithLoss", "", {"s": s, "l": np.zeros(1)})
    loss, g = grads(model, {"s": s, "l": np.zeros(1, np.float32)}, "loss")
    np.testing.assert_allclose(loss, -np.log(np.finfo(np.float32).tiny), rtol=1e-6)
    np.testing.assert_allclose(g["s"], [[-1.0, 1.0]], atol=1e-6)


def test_softmax_loss_second_top_is_prob_without_gradient():
    labels = np.zeros((4, 2), np.float32)
    model = loss_layer("SoftmaxWithLoss", "", {"s": SCORES, "l": labels}, tops=("loss", "prob"))
    blobs, _ = apply(model, {"s": SCORES, "l": labels})
    np.testing.assert_allclose(blobs["prob"], softmax_np(SCORES), rtol=1e-6)
    _, g = grads(model, {"s": SCORES, "l": labels}, "prob", np.ones_like(SCORES))
    np.testing.assert_array_equal(g["s"], 0)  # Caffe's backward reads only the loss diff


def test_softmax_loss_label_count_mismatch_names_blobs_and_shapes():
    with pytest.raises(NetError, match=r"label 'label' \[4, 3\] has 12 values but 's' \[4, 3, 2\]"):
        loss_layer("SoftmaxWithLoss", "", {"s": SCORES, "label": np.zeros((4, 3))})


def test_loss_first_dimension_mismatch_names_blobs():
    with pytest.raises(NetError, match=r"same first dimension: 's' \[4, 3, 2\], 'label' \[8\]"):
        loss_layer("SoftmaxWithLoss", "", {"s": SCORES, "label": np.zeros(8)})


def test_out_of_range_label_makes_the_loss_nan():
    labels = np.array([[0, 3], [1, 1], [0, 0], [2, 2]], np.float32)  # 3 is not a class
    model = loss_layer("SoftmaxWithLoss", "", {"s": SCORES, "l": labels})
    blobs, _ = apply(model, {"s": SCORES, "l": labels})
    assert np.isnan(blobs["loss"])


def test_loss_layers_refuse_to_force_backward_into_labels():
    def flags(type_name, n):
        layer = ir.Layer("l", type_name, (), (), (), (), (), (), (), caffe_pb2.LayerParameter())
        return lookup(layer).allow_force_backward(n)

    assert flags("SoftmaxWithLoss", 2) == (True, False)
    assert flags("EuclideanLoss", 2) == (True, True)
    assert flags("ContrastiveLoss", 3) == (True, True, False)
    assert flags("InfogainLoss", 3) == (True, False, False)


# -- SigmoidCrossEntropyLoss --------------------------------------------------------------


@pytest.mark.parametrize(
    "loss_param, norm",
    [("", 4), ("normalization: FULL", 8), ("normalization: VALID", 5), ("normalize: true", 5)],
)
def test_sigmoid_cross_entropy_normalisation(loss_param, norm):
    x = RNG.normal(size=(4, 2)).astype(np.float32)
    t = np.array([[1, 0], [-1, 1], [0, -1], [-1, 1]], np.float32)  # 5 counted
    model = loss_layer(
        "SigmoidCrossEntropyLoss",
        f"loss_param {{ ignore_label: -1 {loss_param} }}",
        {"x": x, "t": t},
    )
    loss, g = grads(model, {"x": x, "t": t}, "loss")
    x64, valid = x.astype(np.float64), t != -1
    terms = np.logaddexp(0, x64) - x64 * t
    np.testing.assert_allclose(loss, np.where(valid, terms, 0).sum() / norm, rtol=1e-6)
    want = np.where(valid, 1 / (1 + np.exp(-x64)) - t, 0) / norm
    np.testing.assert_allclose(g["x"], want, rtol=1e-5, atol=1e-7)


# -- Euclidean, Hinge, Contrastive, MultinomialLogistic, Infogain -------------------------


def test_euclidean_gradient_goes_to_both_bottoms():
    a, b = RNG.normal(size=(3, 4)), RNG.normal(size=(3, 2, 2))
    model = loss_layer("EuclideanLoss", "", {"a": a, "b": b})
    loss, g = grads(model, {"a": a, "b": b}, "loss", 3.0)
    diff = a - b.reshape(3, 4)
    np.testing.assert_allclose(loss, (diff**2).sum() / 6, rtol=1e-5)
    np.testing.assert_allclose(g["a"], 3.0 * diff / 3, rtol=1e-5)
    np.testing.assert_allclose(g["b"], -3.0 * diff.reshape(3, 2, 2) / 3, rtol=1e-5)
    with pytest.raises(NetError, match="same dimension"):
        loss_layer("EuclideanLoss", "", {"a": a, "b": np.zeros((3, 5))})


@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_hinge_gradient_follows_caffes_backward(norm):
    """HingeLossLayer::Backward_cpu on the diff its forward stashed in the bottom: sign (L1)
    or 2× the hinge (L2), negated at the label, scaled by 1/N. The golden hinge gradients are
    zero because the generator cleared bottom diffs between forward and backward."""
    s = np.array([[0.5, -2.0, 0.2], [1.5, 0.3, -0.1]], np.float32)
    lab = np.array([0, 2], np.float32)
    model = loss_layer("HingeLoss", f"hinge_loss_param {{ norm: {norm} }}", {"s": s, "l": lab})
    loss, g = grads(model, {"s": s, "l": lab}, "loss")
    delta = np.where(np.arange(3)[None, :] == lab[:, None], 1.0, -1.0)
    hinge = np.maximum(0, 1 - delta * s)
    want_loss = (hinge if norm == "L1" else hinge**2).sum() / 2
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    slope = np.sign(hinge) if norm == "L1" else 2 * hinge
    np.testing.assert_allclose(g["s"], -delta * slope / 2, rtol=1e-6)


def test_contrastive_backward_uses_caffes_offset_and_is_finite_at_zero_distance():
    a = np.array([[0.3, 0.4], [1.0, 1.0], [0.0, 0.0]], np.float32)
    b = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0]], np.float32)
    y = np.zeros(3, np.float32)  # all dissimilar; pair 1 has distance 0
    model = loss_layer(
        "ContrastiveLoss", "contrastive_loss_param { margin: 1.5 }", {"a": a, "b": b, "y": y}
    )
    loss, g = grads(model, {"a": a, "b": b, "y": y}, "loss")
    dist = np.linalg.norm(a - b, axis=1)
    short = np.maximum(1.5 - dist, 0)
    np.testing.assert_allclose(loss, (short**2).sum() / 6, rtol=1e-6)
    want = (-short / (dist + 1e-4))[:, None] * (a - b) / 3
    np.testing.assert_allclose(g["a"], want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g["b"], -want, rtol=1e-5, atol=1e-7)


def test_multinomial_logistic_clamps_probability_and_gradient():
    p = np.array([[0.0, 1.0], [0.25, 0.75]], np.float32)
    lab = np.array([0, 1], np.float32)
    model = loss_layer("MultinomialLogisticLoss", "", {"p": p, "l": lab})
    loss, g = grads(model, {"p": p, "l": lab}, "loss")
    np.testing.assert_allclose(loss, (-np.log(1e-20) - np.log(0.75)) / 2, rtol=1e-5)
    np.testing.assert_allclose(g["p"], [[-1 / 1e-20 / 2, 0], [0, -1 / 0.75 / 2]], rtol=1e-5)


def infogain_reference(scores, labels, h):
    p = softmax_np(scores.astype(np.float64))
    rows = h[labels.astype(int)]
    loss = -(rows * np.log(p)).sum() / len(labels)
    grad = (p * rows.sum(axis=1, keepdims=True) - rows) / len(labels)
    return loss, grad


def test_infogain_takes_logits_and_h_from_a_bottom():
    s = RNG.normal(size=(4, 3)).astype(np.float32)
    lab = np.array([0, 2, 1, 2], np.float32)
    h = RNG.uniform(size=(3, 3)).astype(np.float32)
    model = loss_layer("InfogainLoss", "", {"s": s, "l": lab, "H": h.reshape(1, 1, 3, 3)})
    loss, g = grads(model, {"s": s, "l": lab, "H": h.reshape(1, 1, 3, 3)}, "loss")
    want_loss, want_grad = infogain_reference(s, lab, h.astype(np.float64))
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(g["s"], want_grad, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(g["H"], 0)


def test_infogain_reads_h_from_a_binaryproto_source(tmp_path):
    s = RNG.normal(size=(4, 3)).astype(np.float32)
    lab = np.array([1, 0, 2, 2], np.float32)
    h = RNG.uniform(size=(3, 3)).astype(np.float32)
    blob = caffe_pb2.BlobProto(data=h.ravel().tolist())
    blob.shape.dim.extend([1, 1, 3, 3])
    path = tmp_path / "H.binaryproto"
    path.write_bytes(blob.SerializeToString())
    model = loss_layer(
        "InfogainLoss", f'infogain_loss_param {{ source: "{path}" }}', {"s": s, "l": lab}
    )
    loss, g = grads(model, {"s": s, "l": lab}, "loss")
    want_loss, want_grad = infogain_reference(s, lab, h.astype(np.float64))
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(g["s"], want_grad, rtol=1e-5, atol=1e-7)


def test_infogain_configuration_errors(tmp_path):
    s, lab = np.zeros((2, 3)), np.zeros(2)
    with pytest.raises(NetError, match="source must be specified"):
        loss_layer("InfogainLoss", "", {"s": s, "l": lab})
    with pytest.raises(NetError, match="cannot read the infogain matrix"):
        loss_layer(
            "InfogainLoss",
            f'infogain_loss_param {{ source: "{tmp_path}/none" }}',
            {"s": s, "l": lab},
        )
    garbage = tmp_path / "garbage.binaryproto"
    garbage.write_bytes(b"\xff\xff\xff")
    with pytest.raises(NetError, match="cannot read the infogain matrix"):
        loss_layer(
            "InfogainLoss", f'infogain_loss_param {{ source: "{garbage}" }}', {"s": s, "l": lab}
        )
    with pytest.raises(NetError, match="normalize is deprecated"):
        loss_layer(
            "InfogainLoss", "loss_param { normalize: true }", {"s": s, "l": lab, "H": np.eye(3)}
        )
    with pytest.raises(NetError, match=r"bottom 'H' \[2, 2\] has 4 values; 3 classes"):
        loss_layer("InfogainLoss", "", {"s": s, "l": lab, "H": np.eye(2)})


# -- Accuracy -----------------------------------------------------------------------------


def test_accuracy_ties_count_against_and_per_class():
    s = np.array([[1, 1, 0], [0, 2, 1], [3, 0, 0], [0, 0, 1], [5, 0, 0]], np.float32)
    lab = np.array([0, 1, 1, 2, 4], np.float32)
    body = '  type: "Accuracy"\n  bottom: "s"\n  bottom: "l"\n  top: "acc"\n  top: "per"\n'
    model = one_layer(body + "  accuracy_param { ignore_label: 4 }", {"s": (5, 3), "l": (5,)})
    blobs, _ = apply(model, {"s": s, "l": lab})
    # row 0 ties with class 1 (counted as wrong), rows 1 and 3 right, row 2 wrong, row 4 ignored
    np.testing.assert_allclose(blobs["acc"], 0.5)
    np.testing.assert_allclose(blobs["per"], [0.0, 0.5, 1.0])
    # top 2: row 0's tie now fits, row 2 (true class third) still misses
    top2 = body.replace('  top: "per"\n', "") + "  accuracy_param { top_k: 2 }"
    blobs, _ = apply(one_layer(top2, {"s": (4, 3), "l": (4,)}), {"s": s[:4], "l": lab[:4]})
    np.testing.assert_allclose(blobs["acc"], 0.75)


def test_accuracy_out_of_range_label_is_nan_and_top_k_checked():
    body = '  type: "Accuracy"\n  bottom: "s"\n  bottom: "l"\n  top: "acc"'
    model = one_layer(body, {"s": (2, 3), "l": (2,)})
    blobs, _ = apply(model, {"s": np.zeros((2, 3)), "l": np.array([0, 3])})
    assert np.isnan(blobs["acc"])
    with pytest.raises(NetError, match="top_k 4"):
        one_layer(body + "\n  accuracy_param { top_k: 4 }", {"s": (2, 3), "l": (2,)})
