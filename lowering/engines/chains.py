"""Elementwise chains a train step runs as one function with a recomputing backward.

Arrays in, arrays out; nothing here knows a layer (the plan that finds a chain in a net is
lowering/planning.py's, its layer-level step lowering/layers/normalization.py's).

:func:`normalize_scale_relu` is BatchNorm with batch statistics, Scale (per-channel γ, β) and
ReLU (slope 0) over a (rows, C) view. As three layers under JAX's autodiff, XLA:CPU writes
x − μ, BatchNorm's top (Scale's weight diff needs it) and the ReLU's top as three full arrays
in the forward and reads them back in the backward. Here the forward writes only the ReLU's
top (the next layer's bottom, kept anyway) and the backward recomputes BatchNorm's top from
the bottom x, μ and σ² (benchmarks/bn_chain.py: 0.50–0.75× the three layers' fwd+bwd time,
docs/performance.md round 5). ``jax.custom_vjp`` here is a speed choice, not a different
derivative: the backward is Caffe's, ReLULayer's, ScaleLayer's and BatchNormLayer's
Backward_cpu in turn, the true derivative of the forward (tests/lowering/engines/
test_chains.py checks it against autodiff of the three layers, jitted).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def normalized(x: jax.Array, mean: jax.Array, var: jax.Array, eps: float) -> jax.Array:
    """BatchNorm's top: Caffe's ``(x − μ) / √(σ² + ε)`` per channel (the last axis)."""
    return (x - mean) / jnp.sqrt(var + eps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def normalize_scale_relu(x, mean, var, eps: float, gamma, beta) -> jax.Array:
    """``max((x − μ) / √(σ² + ε) · γ + β, 0)`` over (rows, C) ``x``, where ``mean`` and
    ``var`` are x's own batch statistics over the rows (the backward differentiates through
    them as BatchNorm's does; their own cotangents are zero — pass them from ``x`` only)."""
    z = normalized(x, mean, var, eps) * gamma + beta
    return jnp.where(z > 0, z, 0.0)


def _forward(x, mean, var, eps, gamma, beta):
    top = normalize_scale_relu(x, mean, var, eps, gamma, beta)
    return top, (x, mean, var, gamma, top)


def _backward(eps, res, dtop):
    """ReLU: dz = dtop where z > 0 (top > 0 exactly there); Scale: dβ = Σ dz, dγ = Σ dz·y,
    dy = dz·γ; BatchNorm: dx = (dy − mean(dy) − y·mean(dy·y)) / √(σ² + ε)."""
    x, mean, var, gamma, top = res
    y = normalized(x, mean, var, eps)
    dz = jnp.where(top > 0, dtop, 0.0)
    dbeta, dgamma = jnp.sum(dz, axis=0), jnp.sum(dz * y, axis=0)
    rows = x.shape[0]
    # mean(dy) = dβ·γ / rows and mean(dy·y) = dγ·γ / rows: the sums above, reused
    dx = (dz * gamma - (dbeta * gamma) / rows - y * ((dgamma * gamma) / rows)) / jnp.sqrt(var + eps)
    return dx, jnp.zeros_like(mean), jnp.zeros_like(var), dgamma, dbeta


normalize_scale_relu.defvjp(_forward, _backward)
