"""caffe-fast-rcnn's SmoothL1Loss and Dropout forms (lowering/forks/rcnn.py): loss and gradient
against hand-computed values for sigma 3 (the RPN's) and 1 (the RCNN head's), with and without
the inside/outside weights; Dropout with scale_train false and true."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.forks.rcnn import smooth_l1_rcnn
from tests.lowering.fork_nets import net, ours


def _layer(sigma=None):
    p = caffe_pb2.LayerParameter(name="loss", type="SmoothL1Loss")
    if sigma is not None:
        p.smooth_l1_loss_param.sigma = sigma
    return SimpleNamespace(param=p, name="loss", type="SmoothL1Loss", where="", tops=["loss"])


PRED = np.array([[0.05, 0.5, -1.0, 0.2]], np.float32).reshape(2, 2, 1, 1)
TARGET = np.array([[0.0, 0.0, 0.0, 0.0]], np.float32).reshape(2, 2, 1, 1)
W_IN = np.array([1.0, 2.0, 1.0, 0.0], np.float32).reshape(2, 2, 1, 1)
W_OUT = np.array([0.5, 0.25, 1.0, 3.0], np.float32).reshape(2, 2, 1, 1)


def _loss_and_grad(layer, *bottoms):
    def f(pred):
        return smooth_l1_rcnn(layer, [], [pred, *map(jnp.asarray, bottoms)], None)[0]

    value, grad = jax.value_and_grad(f)(jnp.asarray(PRED))
    return float(value), np.asarray(grad).ravel()


def test_sigma3_with_weights():
    """σ² = 9, threshold 1/9. d = (0.05, 1.0, −1.0, 0): f = (0.5·9·0.0025, 1 − 1/18,
    1 − 1/18, 0); loss = (0.5·0.01125 + 0.25·0.94444 + 1·0.94444 + 0)/2 (N = 2).
    Gradient w_in·w_out·f'(d)/N: f' = (9·0.05, 1, −1, 0)."""
    loss, grad = _loss_and_grad(_layer(3.0), TARGET, W_IN, W_OUT)
    f = np.array([0.5 * 9 * 0.05**2, 1 - 1 / 18, 1 - 1 / 18, 0.0])
    assert loss == pytest.approx((0.5 * f[0] + 0.25 * f[1] + f[2]) / 2, rel=1e-6)
    want = np.array([1 * 0.5 * 0.45, 2 * 0.25 * 1, 1 * 1.0 * -1, 0.0]) / 2
    np.testing.assert_allclose(grad, want, rtol=1e-6)


def test_sigma1_without_weights():
    """σ = 1 (the default), 2 bottoms: d = pred; f = (0.00125, 0.125, 0.5, 0.02);
    loss = Σf / 2; gradient d (|d| < 1) or sign(d), over 2."""
    loss, grad = _loss_and_grad(_layer(), TARGET)
    assert loss == pytest.approx((0.00125 + 0.125 + 0.5 + 0.02) / 2, rel=1e-6)
    np.testing.assert_allclose(grad, np.array([0.05, 0.5, -1.0, 0.2]) / 2, rtol=1e-6)


def test_sigma1_with_weights():
    """σ = 1: d = (0.05, 1.0, −1.0, 0) — |d| = 1 is on the linear side (|d| < 1 is strict)."""
    loss, grad = _loss_and_grad(_layer(1.0), TARGET, W_IN, W_OUT)
    f = np.array([0.00125, 0.5, 0.5, 0.0])
    assert loss == pytest.approx((0.5 * f[0] + 0.25 * f[1] + f[2]) / 2, rel=1e-6)
    np.testing.assert_allclose(grad, np.array([0.5 * 0.05, 2 * 0.25, -1.0, 0.0]) / 2, rtol=1e-6)


def test_bad_bottoms():
    with pytest.raises(NetError, match="2 bottoms .* or 4"):
        smooth_l1_rcnn(_layer(), [], [jnp.asarray(PRED)] * 3, None)
    with pytest.raises(NetError, match="bottom 1 has shape"):
        smooth_l1_rcnn(_layer(), [], [jnp.asarray(PRED), jnp.zeros((2, 2))], None)


RNG = np.random.default_rng(0)


X = (RNG.standard_normal((2, 3, 4, 5)) * 6).astype(np.float32)


def _one(type_and_param: str, shape=X.shape) -> str:
    return net(f'layer {{ name: "y" type: {type_and_param} bottom: "x" top: "y" }}', {"x": shape})


DROPOUT = '"Dropout" dropout_param { dropout_ratio: 0.25 %s }'


def test_dropout_scale_train_false():
    """Faster R-CNN: no 1/(1 − p) in TRAIN; x·(1 − p) in TEST."""
    text = _one(DROPOUT % "scale_train: false")
    np.testing.assert_allclose(ours(text, {"x": X})["y"], X * 0.75, rtol=1e-6)
    y = ours(text, {"x": X}, phase="TRAIN")["y"]
    assert np.all((y == 0) | (y == X)) and np.any(y == 0)
    kept = ours(_one(DROPOUT % "scale_train: true"), {"x": X}, phase="TRAIN")["y"]
    assert np.all((kept == 0) | np.isclose(kept, X / 0.75))
    np.testing.assert_array_equal(ours(_one(DROPOUT % "scale_train: true"), {"x": X})["y"], X)
