"""Elementwise chains a train step runs as one function with a recomputing backward.

Arrays in, arrays out; nothing here knows a layer (the plan that finds a chain in a net is
lowering/planning.py's, its layer-level step lowering/layers/normalization.py's).

:func:`normalize_scale_relu` is BatchNorm with batch statistics, Scale (per-channel γ, β) and
ReLU (slope 0) over a (rows, C) view. As three layers under JAX's autodiff, XLA:CPU writes
x − μ, BatchNorm's top (Scale's weight diff needs it) and the ReLU's top as three full arrays
in the forward and reads them back in the backward. Here the forward writes only x − μ (the
variance's operand) and the ReLU's top (the next layer's bottom, kept anyway), and the
backward takes BatchNorm's top as x − μ and per-channel factors of σ (benchmarks/bn_chain.py:
0.36–0.47× the three layers' fwd+bwd time, docs/performance.md rounds 5 and 6).
``jax.custom_vjp`` here is a speed choice, not a different derivative: the backward is
Caffe's, ReLULayer's, ScaleLayer's and BatchNormLayer's Backward_cpu in turn, the true
derivative of the forward (tests/lowering/engines/test_chains.py checks it against autodiff
of the three layers, jitted).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def normalized(x: jax.Array, mean: jax.Array, var: jax.Array, eps: float) -> jax.Array:
    """BatchNorm's top: Caffe's ``(x − μ) / √(σ² + ε)`` per channel (the last axis)."""
    return (x - mean) / jnp.sqrt(var + eps)


def normalize_scale_relu(x, mean, var, eps: float, gamma, beta) -> jax.Array:
    """``max((x − μ) / √(σ² + ε) · γ + β, 0)`` over (rows, C) ``x``, where ``mean`` and
    ``var`` are x's own batch statistics over the rows (the backward differentiates through
    them as BatchNorm's does; their own cotangents are zero — pass them from ``x`` only).

    The statistics enter behind ``stop_gradient``: a zero cotangent returned by a custom_vjp
    is an array, not JAX's symbolic zero, so autodiff would transpose the mean and variance
    into x's diff anyway — XLA keeps ``(x − μ)·0`` (a float multiply by 0 is not 0 for inf or
    NaN), one full array written, reduced and added per chain (MobileNet-SSD: 8.7 % of the
    step's op time, docs/performance.md round 6)."""
    stop = jax.lax.stop_gradient
    return _normalize_scale_relu(x, stop(mean), stop(var), eps, gamma, beta)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _normalize_scale_relu(x, mean, var, eps: float, gamma, beta) -> jax.Array:
    z = normalized(x, mean, var, eps) * gamma + beta
    return jnp.where(z > 0, z, 0.0)


def _forward(x, mean, var, eps, gamma, beta):
    top = _normalize_scale_relu(x, mean, var, eps, gamma, beta)
    return top, (x, mean, var, gamma, top)


def _backward(eps, res, dtop):
    """ReLU: dz = dtop where z > 0 (top > 0 exactly there); Scale: dβ = Σ dz, dγ = Σ dz·y,
    dy = dz·γ; BatchNorm: dx = (dy − mean(dy) − y·mean(dy·y)) / √(σ² + ε).

    y = (x − μ)/σ enters only through per-channel factors: dγ = Σ dz·(x − μ) / σ and
    y·k = (x − μ)·(k/σ). XLA:CPU's reductions (YNNPACK) read materialised operands, and x − μ
    is already one (the variance's); y would be a second full array written in the forward
    (MobileNet-SSD's chains: 0.57–0.88× the fwd+bwd time, docs/performance.md round 6). The
    sum is the same one up to float rounding of its terms (no cancellation: ≤ 3e-7 relative
    in tests/lowering/engines/test_chains.py)."""
    x, mean, var, gamma, top = res
    centered, std = x - mean, jnp.sqrt(var + eps)
    dz = jnp.where(top > 0, dtop, 0.0)
    dbeta, dgamma = jnp.sum(dz, axis=0), jnp.sum(dz * centered, axis=0) / std
    rows = x.shape[0]
    # mean(dy) = dβ·γ / rows and mean(dy·y) = dγ·γ / rows: the sums above, reused
    dx = (dz * gamma - (dbeta * gamma) / rows - centered * ((dgamma * gamma) / (rows * std))) / std
    return dx, jnp.zeros_like(mean), jnp.zeros_like(var), dgamma, dbeta


_normalize_scale_relu.defvjp(_forward, _backward)
