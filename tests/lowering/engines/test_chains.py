"""lowering/engines/chains.py: BatchNorm (batch statistics) → Scale → ReLU as one function with
a recomputing backward, against Caffe's three layers' Forward_cpu/Backward_cpu transcribed in
float64, and against JAX's autodiff of the three layers — under jit, in value_and_grad."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.lowering.engines import chains

EPS = 1e-5


def caffe(x, gamma, beta, r):
    """BatchNormLayer, ScaleLayer, ReLULayer forward, then backward from top diff ``r`` (the
    loss Σ top·r), in float64: (loss, bottom diff, γ diff, β diff)."""
    x, gamma, beta, r = (np.asarray(a, np.float64) for a in (x, gamma, beta, r))
    mean = x.mean(axis=0)
    std = np.sqrt(((x - mean) ** 2).mean(axis=0) + EPS)
    y = (x - mean) / std
    z = y * gamma + beta
    top = np.where(z > 0, z, 0.0)
    dz = np.where(z > 0, r, 0.0)  # ReLU: the slope side (0) at z = 0
    dy = dz * gamma
    dx = (dy - dy.mean(axis=0) - y * (dy * y).mean(axis=0)) / std
    return (top * r).sum(), dx, (dz * y).sum(axis=0), dz.sum(axis=0)


def three_layers(x, gamma, beta):
    mean = jnp.mean(x, axis=0)
    y = (x - mean) / jnp.sqrt(jnp.mean(jnp.square(x - mean), axis=0) + EPS)
    z = y * gamma + beta
    return jnp.where(z > 0, z, 0.0)


def fused(x, gamma, beta):
    mean = jnp.mean(x, axis=0)
    var = jnp.mean(jnp.square(x - mean), axis=0)
    return chains.normalize_scale_relu(x, mean, var, EPS, gamma, beta)


def data(rows: int, c: int):
    rng = np.random.default_rng(rows + c)
    x = (rng.standard_normal((rows, c)) * 3 + 2).astype(np.float32)
    r = rng.standard_normal((rows, c)).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, c).astype(np.float32)
    beta = (rng.standard_normal(c) * 0.3).astype(np.float32)
    return x, gamma, beta, r


@pytest.mark.parametrize("rows,c", [(9, 3), (126, 5), (2304, 32)])
def test_fused_chain_matches_caffe_under_jit(rows, c):
    """Loss, bottom diff, γ and β diffs of the fused chain and of the three layers' autodiff,
    each jitted inside value_and_grad, within 1e-6 of each float64 array's largest value
    (float32 rounding of sums over ``rows``: both measured ≤ 2e-7)."""
    x, gamma, beta, r = data(rows, c)
    want = caffe(x, gamma, beta, r)
    for chain in (fused, three_layers):
        loss = lambda x, g, b, f=chain: jnp.sum(f(x, g, b) * r)  # noqa: E731
        value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(x, gamma, beta)
        for got, ref, what in zip((value, *grads), want, ("loss", "dx", "dgamma", "dbeta")):
            err = np.abs(np.asarray(got, np.float64) - ref).max()
            assert err <= 1e-6 * max(np.abs(ref).max(), 1e-30), (chain.__name__, what, err)


def test_fused_chain_top_equals_the_layers_and_gives_no_gradient_to_the_statistics():
    """The forward is the three layers' expressions (equal under jit); the statistics passed in
    get a zero cotangent (the bottom diff already runs through them, as BatchNorm's does)."""
    x, gamma, beta, _ = data(64, 4)
    np.testing.assert_array_equal(jax.jit(fused)(x, gamma, beta),
                                  jax.jit(three_layers)(x, gamma, beta))  # fmt: skip
    mean, var = x.mean(axis=0), x.var(axis=0)
    top = lambda m, v: jnp.sum(chains.normalize_scale_relu(x, m, v, EPS, gamma, beta))  # noqa: E731
    grads = jax.jit(jax.grad(top, argnums=(0, 1)))(mean, var)
    assert all(not np.any(g) for g in grads)


def test_the_statistics_are_not_transposed_into_the_bottom_diff():
    """x's diff is the chain's backward alone: the mean and variance enter behind
    stop_gradient, so autodiff adds no second cotangent into x (``add_any``) — a custom_vjp's
    zero cotangent is an array, and XLA would keep (x − μ)·0 as a full array per chain."""
    x, gamma, beta, r = data(12, 3)
    jaxpr = jax.make_jaxpr(jax.value_and_grad(lambda x: jnp.sum(fused(x, gamma, beta) * r)))(x)
    assert "custom_vjp_call" in str(jaxpr) and "add_any" not in str(jaxpr)
