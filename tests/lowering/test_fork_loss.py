"""lowering/fork_loss.py: SoftmaxWithLoss in SegNet's form (class weighting, `normalize`
default true) against the fork's formula in NumPy, and float64 finite differences."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import fd_check, net, ours

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 2, 3)).astype(np.float32)
LABEL = np.array([[[0, 1, 2], [2, 255, 1]], [[1, 1, 0], [255, 2, 2]]], np.float32)[:, None]
W = [0.5, 2.0, 4.0]


def _text(loss_param: str) -> str:
    layer = ('layer { name: "loss" type: "SoftmaxWithLoss" bottom: "x" bottom: "label" '
             f'top: "loss" loss_param {{ {loss_param} }} }}')  # fmt: skip
    return net(layer, {"x": X.shape, "label": LABEL.shape})


def _expected(weighted: bool, normalize: bool) -> float:
    x = X.astype(np.float64)
    logp = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    total, counted = 0.0, 0
    for n in range(2):
        for h in range(2):
            for w in range(3):
                lab = int(LABEL[n, 0, h, w])
                if lab == 255:
                    continue
                total -= logp[n, lab, h, w] * (W[lab] if weighted else 1.0)
                counted += 1
    return total / (counted if normalize else 2)


WEIGHTS = "class_weighting: 0.5 class_weighting: 2 class_weighting: 4"


@pytest.mark.parametrize(
    "param, weighted, normalize",
    [
        (f"weight_by_label_freqs: true ignore_label: 255 {WEIGHTS}", True, True),
        (f"weight_by_label_freqs: true ignore_label: 255 normalize: false {WEIGHTS}", True, False),
        ("weight_by_label_freqs: false ignore_label: 255", False, True),
    ],
)
def test_segnet_softmax_loss_by_formula(param, weighted, normalize):
    text = _text(param)
    assert compile_net(text).net.layers[-1].form == "segnet"
    loss = ours(text, {"x": X, "label": LABEL})["loss"]
    np.testing.assert_allclose(loss, _expected(weighted, normalize), rtol=1e-5)


def test_segnet_divisor_is_the_counted_pixels_not_the_weight_sum():
    """Hand-worked, as caffe-segnet's softmax_loss_layer.cpp and .cu divide: two classes, equal
    scores (p = 1/2 everywhere), labels [0, 1, ignored], weights [1, 3]: the loss is
    (1·ln 2 + 3·ln 2) / 2 counted pixels = 2 ln 2 (a weight-sum divisor would give ln 2); the
    gradient at each counted pixel is weight·(p − onehot) / 2, zero at the ignored one."""
    text = ('layer { name: "loss" type: "SoftmaxWithLoss" bottom: "x" bottom: "label" '
            'top: "loss" loss_param { weight_by_label_freqs: true ignore_label: 7 '
            "class_weighting: 1 class_weighting: 3 } }")  # fmt: skip
    x, label = np.zeros((1, 2, 1, 3), np.float32), np.array([[[[0, 1, 7]]]], np.float32)
    text = net(text, {"x": x.shape, "label": label.shape})
    np.testing.assert_allclose(ours(text, {"x": x, "label": label})["loss"], 2 * np.log(2),
                               rtol=1e-6)  # fmt: skip
    model = compile_net(text)
    params, state = model.init(0)

    def loss(v):
        return jitted.forward(model, params, state, {"x": v, "label": jnp.asarray(label)})[0][
            "loss"
        ]

    expected = [[[[-0.25, 0.75, 0]], [[0.25, -0.75, 0]]]]
    np.testing.assert_allclose(jax.grad(loss)(jnp.asarray(x)), expected, rtol=1e-6)


def test_segnet_softmax_loss_gradient():
    fd_check(_text(f"weight_by_label_freqs: true ignore_label: 255 {WEIGHTS}"),
             {"x": X.astype(np.float64)}, "loss", fixed={"label": LABEL})  # fmt: skip


def test_segnet_softmax_loss_refusals():
    with pytest.raises(NetError, match=r"\(type SoftmaxWithLoss\).*3 classes, 2 weights"):
        compile_net(_text("weight_by_label_freqs: true class_weighting: 1 class_weighting: 2"))
    with pytest.raises(NetError, match="not `normalization`"):
        compile_net(_text(f"weight_by_label_freqs: true normalization: FULL {WEIGHTS}"))
