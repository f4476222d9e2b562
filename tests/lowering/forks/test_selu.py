"""lowering/forks/selu.py: soeaver's caffe-priv SeLu and SeLuDropout against loops transcribed
from the fork's C++ (soeaver/py-RFCN-priv@ec89b86, caffe-priv/src/caffe/layers/selu_layer.cpp
and selu_dropout_layer.cpp), run jitted; gradients against float64 finite differences and the
fork's Backward_cpu; a small PSPNet-SELU-style net compiled and trained one step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import fd_check, net, ours


def _selu_loop(x, lam=1.050700987, alpha=1.67326324):
    """SeLuLayer::Forward_cpu in float32: x > 0 ? λx : λα(exp(x) − 1)."""
    lam, alpha = np.float32(lam), np.float32(alpha)
    top = np.empty_like(x)
    for i, v in np.ndenumerate(x):
        top[i] = lam * v if v > 0 else lam * alpha * (np.exp(v) - np.float32(1))
    return top


def _selu_backward_loop(x, dy, lam=1.050700987, alpha=1.67326324):
    """SeLuLayer::Backward_cpu: x > 0 ? λ·dy : λα·dy·exp(x)."""
    lam, alpha = np.float32(lam), np.float32(alpha)
    out = np.empty_like(x)
    for i, v in np.ndenumerate(x):
        out[i] = lam * dy[i] if v > 0 else lam * alpha * dy[i] * np.exp(v)
    return out


def _layer(kind: str, param: str = "") -> str:
    return f'layer {{ name: "y" type: "{kind}" bottom: "x" top: "y" {param} }}'


X = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32) * 3
X[0, 0, 0, :3] = [0.0, 90.0, -90.0]  # the boundary and both far sides (no overflow)


@pytest.mark.parametrize("param, lam, alpha", [
    ("", 1.050700987, 1.67326324),
    ("selu_param { lambda: 2 alpha: 0.5 }", 2.0, 0.5),
])  # fmt: skip
def test_selu_matches_the_fork_jitted(param, lam, alpha):
    y = ours(net(_layer("SeLu", param), {"x": X.shape}), {"x": X})["y"]
    np.testing.assert_allclose(y, _selu_loop(X, lam, alpha), rtol=2e-7, atol=1e-7)


def test_selu_backward_is_the_forks_under_value_and_grad():
    model = compile_net(net(_layer("SeLu"), {"x": X.shape}))
    params, state = model.init(0)
    dy = np.random.default_rng(1).standard_normal(X.shape).astype(np.float32)

    def loss(x):
        return jnp.sum(model.apply(params, state, {"x": x})[0]["y"] * dy)

    _, grad = jitted.value_and_grad(loss)(jnp.asarray(X))
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(grad, _selu_backward_loop(X, dy), rtol=2e-6, atol=1e-6)


def test_selu_gradient_float64_finite_differences():
    x = np.random.default_rng(3).standard_normal((2, 2, 3, 3)) + 0.05
    fd_check(net(_layer("SeLu"), {"x": x.shape}), {"x": x}, "y")


def _alpha_dropout_constants(ratio=0.1, alpha=-1.75809934):
    """SeLuDropoutLayer::LayerSetUp in float32 (pow in double, as C++ promotes it)."""
    ratio, alpha, one = np.float32(ratio), np.float32(alpha), np.float32(1)
    q = one - ratio
    tmp = np.float32(q * (one + alpha * alpha * (one - q)))
    a = np.float32(np.float64(tmp) ** -0.5)
    return q, alpha, a, np.float32(-a * (one - q) * alpha)


def _alpha_dropout_loop(x, mask, ratio=0.1, alpha=-1.75809934):
    """SeLuDropoutLayer::Forward_cpu in TRAIN: a·(mask ? x : α) + b."""
    _, alpha, a, b = _alpha_dropout_constants(ratio, alpha)
    top = np.empty_like(x)
    for i, v in np.ndenumerate(x):
        top[i] = a * (v if mask[i] == 1 else alpha) + b
    return top


@pytest.mark.parametrize("param, ratio, alpha", [
    ("", 0.1, -1.75809934),
    ("selu_dropout_param { dropout_ratio: 0.5 alpha: -1 }", 0.5, -1.0),
])  # fmt: skip
def test_selu_dropout_train_matches_the_fork_given_its_mask(param, ratio, alpha):
    x = np.random.default_rng(4).standard_normal((4, 8, 6, 6)).astype(np.float32)
    y = ours(net(_layer("SeLuDropout", param), {"x": x.shape}), {"x": x}, phase="TRAIN")["y"]
    _, alpha32, a, b = _alpha_dropout_constants(ratio, alpha)
    dropped = np.isclose(y, a * alpha32 + b, rtol=0, atol=1e-6) & ~np.isclose(x, alpha32, atol=1e-3)
    mask = (~dropped).astype(np.uint32)
    np.testing.assert_allclose(y, _alpha_dropout_loop(x, mask, ratio, alpha), rtol=1e-6,
                               atol=1e-6)  # fmt: skip
    assert abs(dropped.mean() - ratio) < 0.05  # Bernoulli(1 − ratio) keeps


def test_selu_dropout_test_is_identity_and_train_gradient_is_a_on_kept():
    x = np.random.default_rng(5).standard_normal((2, 4, 5, 5)).astype(np.float32)
    text = net(_layer("SeLuDropout"), {"x": x.shape})
    np.testing.assert_array_equal(ours(text, {"x": x})["y"], x)
    model = compile_net(text, phase="TRAIN")
    params, state = model.init(0)
    rng = jax.random.key(3)

    def loss(v):
        return jnp.sum(model.apply(params, state, {"x": v}, rng=rng)[0]["y"])

    _, grad = jitted.value_and_grad(loss)(jnp.asarray(x))
    y = jitted.forward(model, params, state, {"x": jnp.asarray(x)}, rng)[0]["y"]
    _, alpha, a, b = _alpha_dropout_constants()
    kept = ~np.isclose(np.asarray(y), a * alpha + b, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.where(kept, a, 0), rtol=1e-6)  # Backward_cpu
    fd_check(text, {"x": x.astype(np.float64)}, "y", phase="TRAIN")


@pytest.mark.parametrize("param", ["dropout_ratio: 0", "dropout_ratio: 1", "alpha: nan"])
def test_selu_dropout_refuses_what_the_fork_checks(param):
    text = net(_layer("SeLuDropout", f"selu_dropout_param {{ {param} }}"), {"x": (1, 2)})
    with pytest.raises(NetError, match=r"layer 'y' \(type SeLuDropout\): selu_dropout_param"):
        compile_net(text, phase="TRAIN")


def test_pspnet_selu_head_compiles_trains_and_detects_the_fork():
    """The head of soeaver/caffe-model's psp_resnet101-v2-merge-selu.prototxt, made tiny:
    Convolution → SeLu → SeLuDropout → score → SoftmaxWithLoss."""
    text = net(
        'layer { name: "conv" type: "Convolution" bottom: "x" top: "feat" '
        "convolution_param { num_output: 4 kernel_size: 3 pad: 1 "
        'weight_filler { type: "msra" } } }\n'
        'layer { name: "relu" type: "SeLu" bottom: "feat" top: "feat" }\n'
        'layer { name: "drop" type: "SeLuDropout" bottom: "feat" top: "feat" '
        "selu_dropout_param { dropout_ratio: 0.1 } }\n"
        'layer { name: "score" type: "Convolution" bottom: "feat" top: "score" '
        'convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "msra" } } }\n'
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" '
        'top: "loss" }',
        {"x": (2, 3, 6, 6), "label": (2, 1, 6, 6)},
    )
    model = compile_net(text, phase="TRAIN")
    assert model.net.dialect == "caffe-priv"
    params, state = model.init(0)
    rng = np.random.default_rng(6)
    feed = {
        "x": jnp.asarray(rng.standard_normal((2, 3, 6, 6)), jnp.float32),
        "label": jnp.asarray(rng.integers(0, 3, (2, 1, 6, 6)), jnp.float32),
    }

    def loss(p):
        return model.apply(p, state, feed, rng=jax.random.key(0))[0]["loss"]

    value, grads = jitted.value_and_grad(loss)(params)
    assert np.isfinite(value) and np.abs(grads["conv"][0]).sum() > 0
