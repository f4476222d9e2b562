"""Neuron layers (lowering/layers/neuron.py) beyond the golden cases: Caffe's backward rules at
kinks, Dropout's statistics, and compile-time errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from tests import jitted
from tests.lowering.nets import forward, input_grad, one_layer

jax.config.update("jax_default_matmul_precision", "highest")


def neuron(type_and_params: str, x) -> tuple[np.ndarray, np.ndarray]:
    """(y, dy/dx with a cotangent of ones) of a neuron layer at the points ``x``."""
    x = np.asarray(x, np.float32)
    model = one_layer(f'  type: {type_and_params}\n  bottom: "x"\n  top: "y"', {"x": x.shape})
    y = forward(model, {"x": x})["y"]
    dx = input_grad(model, {"x": x}, "y", np.ones_like(x))["x"]
    return np.asarray(y), np.asarray(dx)


# -- Caffe's backward at the kinks --------------------------------------------------------


def test_relu_kink_takes_the_slope_side():
    _, dx = neuron('"ReLU"', [-1.0, 0.0, 1.0])
    np.testing.assert_array_equal(dx, [0.0, 0.0, 1.0])
    y, dx = neuron('"ReLU" relu_param { negative_slope: 0.1 }', [-2.0, 0.0, 3.0])
    np.testing.assert_allclose(y, [-0.2, 0.0, 3.0], rtol=1e-7)
    np.testing.assert_allclose(dx, [0.1, 0.1, 1.0], rtol=1e-7)


def test_clip_passes_the_gradient_on_the_closed_interval():
    y, dx = neuron('"Clip" clip_param { min: -0.5 max: 0.7 }', [-1.0, -0.5, 0.0, 0.7, 2.0])
    np.testing.assert_allclose(y, [-0.5, -0.5, 0.0, 0.7, 0.7], rtol=1e-7)
    np.testing.assert_array_equal(dx, [0.0, 1.0, 1.0, 1.0, 0.0])


def test_clip_with_min_above_max_is_min_everywhere_with_no_gradient():
    y, dx = neuron('"Clip" clip_param { min: 1 max: -1 }', [-2.0, 0.0, 2.0])
    np.testing.assert_array_equal(y, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(dx, [0.0, 0.0, 0.0])


def test_absval_gradient_is_sign_with_zero_at_zero():
    y, dx = neuron('"AbsVal"', [-2.0, 0.0, 3.0])
    np.testing.assert_array_equal(y, [2.0, 0.0, 3.0])
    np.testing.assert_array_equal(dx, [-1.0, 0.0, 1.0])


def test_elu_kink_takes_alpha_and_large_negatives_stay_finite():
    y, dx = neuron('"ELU" elu_param { alpha: 0.5 }', [-200.0, 0.0, 1.0, 100.0])
    np.testing.assert_allclose(y, [-0.5, 0.0, 1.0, 100.0], rtol=1e-7)
    np.testing.assert_allclose(dx, [0.0, 0.5, 1.0, 1.0], rtol=1e-7)


def test_prelu_kink_and_slope_gradient():
    x = np.array([[-2.0, 0.0], [3.0, -1.0]], np.float32)  # (N=2, C=2)
    model = one_layer('  type: "PReLU"\n  bottom: "x"\n  top: "y"', {"x": x.shape})
    params, state = model.init(0)
    np.testing.assert_array_equal(params["layer"][0], [0.25, 0.25])  # Caffe's default filler

    def f(params, x):
        return jitted.forward(model, params, state, {"x": x})[0]["y"]

    y, vjp = jax.vjp(f, params, jnp.asarray(x))
    np.testing.assert_allclose(y, [[-0.5, 0.0], [3.0, -0.25]], rtol=1e-7)
    dparams, dx = vjp(jnp.ones_like(y))
    np.testing.assert_allclose(dx, [[0.25, 0.25], [1.0, 0.25]], rtol=1e-7)
    # da_c = Σ dy·x·(x ≤ 0): channel 0 sees -2, channel 1 sees 0 and -1.
    np.testing.assert_allclose(dparams["layer"][0], [-2.0, -1.0], rtol=1e-7)


def test_prelu_shared_slope_is_a_0d_blob():
    model = one_layer(
        '  type: "PReLU"\n  bottom: "x"\n  top: "y"\n  prelu_param { channel_shared: true }',
        {"x": (2, 3, 4)},
    )
    assert model.graph.decls["layer"][0].shape == ()


def test_power_special_cases_have_caffes_gradients():
    x = [-2.0, 0.0, 1.5]
    y, dx = neuron('"Power" power_param { power: 0 scale: 3 shift: 0 }', x)
    np.testing.assert_array_equal(y, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(dx, [0.0, 0.0, 0.0])  # no 0·inf at a zero base
    y, dx = neuron('"Power" power_param { power: 3 scale: 1 shift: 0 }', x)
    np.testing.assert_allclose(y, [-8.0, 0.0, 3.375], rtol=1e-7)  # negative base, integer power
    np.testing.assert_allclose(dx, [12.0, 0.0, 6.75], rtol=1e-7)
    y, dx = neuron('"Power" power_param { power: 2 scale: 0 shift: 3 }', x)
    np.testing.assert_array_equal(y, [9.0, 9.0, 9.0])
    np.testing.assert_array_equal(dx, [0.0, 0.0, 0.0])


def test_threshold_is_a_step_with_zero_gradient():
    y, dx = neuron('"Threshold" threshold_param { threshold: 0.5 }', [0.0, 0.5, 0.6])
    np.testing.assert_array_equal(y, [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(dx, [0.0, 0.0, 0.0])


@pytest.mark.parametrize("type_", ["Exp", "Log"])
def test_exp_log_refuse_a_non_positive_base(type_):
    param = f"{type_.lower()}_param {{ base: -2 }}"
    with pytest.raises(NetError, match="base must be strictly positive"):
        neuron(f'"{type_}" {param}', [1.0])


def test_log_refuses_base_one():
    with pytest.raises(NetError, match="base 1"):
        neuron('"Log" log_param { base: 1 }', [1.0])


# -- Dropout -------------------------------------------------------------------------------


def dropout_model(phase: str, ratio: float = 0.3, shape=(50, 40, 10)):
    param = f"dropout_param {{ dropout_ratio: {ratio} }}"
    body = f'  type: "Dropout"\n  bottom: "x"\n  top: "y"\n  {param}'
    return one_layer(body, {"x": shape}, phase)


def test_dropout_train_keep_rate_scale_and_mask_gradient():
    ratio = 0.3
    x = np.random.default_rng(0).uniform(0.5, 1.5, (50, 40, 10)).astype(np.float32)
    model = dropout_model("TRAIN", ratio)
    rng = jax.random.key(1)
    y = np.asarray(forward(model, {"x": x}, rng=rng)["y"])
    kept = y != 0
    n = kept.size
    assert abs(kept.mean() - (1 - ratio)) < 4 * np.sqrt(ratio * (1 - ratio) / n)
    np.testing.assert_allclose(y[kept], x[kept] / (1 - ratio), rtol=1e-6)
    dy = np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
    dx = np.asarray(input_grad(model, {"x": x}, "y", dy, rng=rng)["x"])
    np.testing.assert_allclose(dx, dy * kept / (1 - ratio), rtol=1e-6)
    other = np.asarray(forward(model, {"x": x}, rng=jax.random.key(2))["y"])
    assert ((other != 0) != kept).any()  # another key, another mask


def test_dropout_test_is_identity_and_needs_no_rng():
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    model = dropout_model("TEST", 0.5, x.shape)
    np.testing.assert_array_equal(forward(model, {"x": x})["y"], x)
    np.testing.assert_array_equal(input_grad(model, {"x": x}, "y", np.ones_like(x))["x"], 1.0)


def test_dropout_train_without_rng_says_so():
    model = dropout_model("TRAIN", 0.5, (2, 3))
    with pytest.raises(NetError, match="rng"):
        forward(model, {"x": np.ones((2, 3), np.float32)})


def test_dropout_ratio_one_is_refused():
    with pytest.raises(NetError, match="dropout_ratio"):
        dropout_model("TRAIN", 1.0, (2, 3))
