"""Normalisation layers (lowering/layers/normalization.py) beyond the golden cases: BatchNorm's
running statistics and state blobs, and MVN's backward where it is Caffe's, not the true
derivative."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.lowering.nets import apply, grads, one_layer

jax.config.update("jax_default_matmul_precision", "highest")

RNG = np.random.default_rng(7)


# -- BatchNorm ----------------------------------------------------------------------------


def test_batchnorm_running_stats_over_three_train_steps():
    maf, eps = 0.9, 1e-5
    body = (
        '  type: "BatchNorm"\n  bottom: "x"\n  top: "y"\n'
        f"  batch_norm_param {{ moving_average_fraction: {maf} eps: {eps} }}"
    )
    model = one_layer(body, {"x": (3, 2, 2, 2)}, phase="TRAIN")
    _, state = model.init(0)
    b0, b1, b2 = np.zeros(2), np.zeros(2), np.zeros(1)
    for step in range(3):
        x = RNG.normal(loc=step, scale=1 + step, size=(3, 2, 2, 2)).astype(np.float32)
        blobs, state = apply(model, {"x": x}, state=state)
        mean = x.mean(axis=(0, 2, 3), dtype=np.float64)
        var = x.var(axis=(0, 2, 3), dtype=np.float64)  # biased: what TRAIN normalises with
        want = (x - mean[None, :, None, None]) / np.sqrt(var + eps)[None, :, None, None]
        np.testing.assert_allclose(blobs["y"], want, rtol=1e-4, atol=1e-5)
        m = x.size // 2
        b0, b1, b2 = maf * b0 + mean, maf * b1 + m / (m - 1) * var, maf * b2 + 1
        for ours, theirs in zip(state["layer"], (b0, b1, b2)):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    # TEST with those blobs: normalise by blob / factor, blobs unchanged.
    test = one_layer(body, {"x": (3, 2, 2, 2)}, phase="TEST")
    x = RNG.normal(size=(3, 2, 2, 2)).astype(np.float32)
    blobs, after = apply(test, {"x": x}, state=state)
    mu, var = b0 / b2, b1 / b2
    want = (x - mu[None, :, None, None]) / np.sqrt(var + eps)[None, :, None, None]
    np.testing.assert_allclose(blobs["y"], want, rtol=1e-4, atol=1e-5)
    for ours, theirs in zip(after["layer"], state["layer"]):
        np.testing.assert_array_equal(ours, theirs)


def caffe_batchnorm_train(x, dy, eps):
    """BatchNormLayer's TRAIN Forward_cpu and Backward_cpu in float64 over (N, C, spatial):
    y = (x − μ)/√(σ² + eps), dx = (dy − mean(dy) − y·mean(dy·y)) / √(σ² + eps)."""
    x3 = x.reshape(x.shape[0], x.shape[1], -1).astype(np.float64)
    d3 = dy.reshape(x3.shape).astype(np.float64)
    mu, var = x3.mean(axis=(0, 2), keepdims=True), x3.var(axis=(0, 2), keepdims=True)
    y = (x3 - mu) / np.sqrt(var + eps)
    mean_dy, mean_dyy = (
        d3.mean(axis=(0, 2), keepdims=True),
        (d3 * y).mean(axis=(0, 2), keepdims=True),
    )
    dx = (d3 - mean_dy - y * mean_dyy) / np.sqrt(var + eps)
    return y.reshape(x.shape), dx.reshape(x.shape)


@pytest.mark.parametrize("shape", [(5, 3), (5, 3, 1, 1), (2, 3, 4, 5)])
def test_batchnorm_train_top_and_bottom_diff_jitted(shape):
    """Under jax.jit of the vjp: a bottom with no spatial axes (after an InnerProduct: the
    (N, C) view of lowering/layers/normalization.py ``_view``) and one with them."""
    body = '  type: "BatchNorm"\n  bottom: "x"\n  top: "y"\n  batch_norm_param { eps: 0.01 }'
    model = one_layer(body, {"x": shape}, phase="TRAIN")
    x = RNG.normal(loc=2.0, size=shape).astype(np.float32)
    dy = RNG.normal(size=shape).astype(np.float32)
    y, g = grads(model, {"x": x}, "y", jnp.asarray(dy))
    want_y, want_dx = caffe_batchnorm_train(x, dy, 0.01)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g["x"], want_dx, rtol=1e-4, atol=1e-5)


def test_batchnorm_global_stats_with_zero_factor_uses_zero_mean_and_var():
    body = '  type: "BatchNorm"\n  bottom: "x"\n  top: "y"\n  batch_norm_param { eps: 0.25 }'
    model = one_layer(body, {"x": (2, 3)})
    _, state = model.init(0)
    state["layer"] = [jnp.full((3,), 5.0), jnp.full((3,), 7.0), jnp.zeros((1,))]
    x = RNG.normal(size=(2, 3)).astype(np.float32)
    blobs, _ = apply(model, {"x": x}, state=state)
    np.testing.assert_allclose(blobs["y"], x / np.sqrt(0.25), rtol=1e-6)


def test_batchnorm_declares_three_state_blobs():
    model = one_layer('  type: "BatchNorm"\n  bottom: "x"\n  top: "y"', {"x": (2, 4, 3)})
    decls = model.graph.decls["layer"]
    assert [d.shape for d in decls] == [(4,), (4,), (1,)]
    assert all(d.state for d in decls)
    params, state = model.init(0)
    assert "layer" not in params and all(float(jnp.abs(b).sum()) == 0 for b in state["layer"])


# -- MVN ----------------------------------------------------------------------------------


def caffe_mvn_backward(x, dy, eps):
    """MVNLayer::Backward_cpu with normalize_variance, rows already flattened."""
    c = x - x.mean(axis=1, keepdims=True)
    denom = np.sqrt((c * c).mean(axis=1, keepdims=True)) + eps
    y = c / denom
    return (dy - dy.mean(axis=1, keepdims=True) - y * (dy * y).mean(axis=1, keepdims=True)) / denom


def test_mvn_backward_is_caffes_not_the_true_derivative():
    x = RNG.normal(size=(2, 3, 2, 2)).astype(np.float64)
    x[0, 1] = 0.5  # a constant row: the true derivative is infinite there, Caffe's is finite
    dy = RNG.normal(size=x.shape)
    body = '  type: "MVN"\n  bottom: "x"\n  top: "y"\n  mvn_param { eps: 0.5 }'
    _, g = grads(one_layer(body, {"x": x.shape}), {"x": x}, "y", dy)
    want = caffe_mvn_backward(x.reshape(6, 4), dy.reshape(6, 4), 0.5).reshape(x.shape)
    assert np.all(np.isfinite(g["x"]))
    np.testing.assert_allclose(g["x"], want, rtol=1e-5, atol=1e-6)
