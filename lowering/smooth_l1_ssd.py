"""SmoothL1Loss in SSD's form (weiliu89/caffe smooth_L1_loss_layer.cpp; ``layer.form ==
"ssd"``): no parameter, bottoms pred, target [, weights].

d = (pred − target)·w; f = 0.5·d² where |d| < 1, else |d| − 0.5; loss = Σf / N (N =
pred.num). Backward: pred gets f'(d)/N and target −f'(d)/N (the layer allows backward to both),
the weights nothing — and **the factor w is not applied**: Caffe's backward differentiates f
with respect to d and stops there. That is not the true gradient when weights are given, so the
layer is a ``jax.custom_vjp`` (with two bottoms it coincides with the true gradient).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from caffe2jax.frontend import ir
from caffe2jax.lowering.util import fail


def _terms(d: jax.Array) -> jax.Array:
    ad = jnp.abs(d)
    return jnp.where(ad < 1.0, 0.5 * d * d, ad - 0.5)


@jax.custom_vjp
def _loss(pred, target, weights):
    return jnp.sum(_terms((pred - target) * weights)) / pred.shape[0]


def _loss_fwd(pred, target, weights):
    d = (pred - target) * weights
    return jnp.sum(_terms(d)) / pred.shape[0], (d, weights)


def _loss_bwd(res, g):
    d, weights = res
    # f'(d) = d if |d| < 1 else sign(d), scaled by top_diff / num; NOT multiplied by w (fork)
    grad = jnp.where(jnp.abs(d) < 1.0, d, jnp.sign(d)) * (g / d.shape[0])
    return grad, -grad, jnp.zeros_like(weights)


_loss.defvjp(_loss_fwd, _loss_bwd)


def _ssd(layer: ir.Layer, params, bottoms, ctx) -> list[jax.Array]:
    """SSD's SmoothL1LossLayer::Forward_cpu / Backward_cpu (module docstring)."""
    if len(bottoms) > 3:
        raise fail(layer, f"SSD's SmoothL1Loss takes 2 or 3 bottoms (pred, target [, weights]), "
                          f"got {len(bottoms)}")  # fmt: skip
    pred, target = bottoms[0], bottoms[1]
    for b, name in zip(bottoms[1:], layer.bottom_names[1:]):
        if b.shape[1:] != pred.shape[1:] or b.ndim < 1:
            raise fail(layer, f"bottom '{name}' {list(b.shape)} must match the prediction "
                              f"{list(pred.shape)} in channels, height and width")  # fmt: skip
    if target.shape[0] != pred.shape[0]:
        raise fail(layer, "the data and label should have the same first dimension")
    weights = bottoms[2] if len(bottoms) == 3 else jnp.ones_like(pred)
    return [_loss(pred, target, jax.lax.stop_gradient(weights))]
