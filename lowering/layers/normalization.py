"""Normalisation layers: BatchNorm (with its running statistics as state) and MVN.

BatchNorm reproduces Caffe's BatchNormLayer: no affine part, three state blobs (running mean
sum, running variance sum, scale factor), batch statistics with the biased variance in TRAIN
and the unbiased one accumulated. MVN reproduces MVNLayer, including its backward, which is not
the derivative of its forward when eps ≠ 0 (see :func:`_mvn_rows`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from caffe2jax.frontend import ir
from caffe2jax.lowering.engines import chains
from caffe2jax.lowering.registry import ParamDecl, Shape, register
from caffe2jax.lowering.util import count, fail

# -- BatchNorm ----------------------------------------------------------------------------


def _bn_channels(shape: Shape) -> int:
    """Caffe: channels = shape(1), or 1 for a 1-D bottom."""
    return shape[1] if len(shape) > 1 else 1


def _use_global_stats(layer: ir.Layer, phase: str) -> bool:
    """use_global_stats: as given, else true in TEST and false in TRAIN."""
    p = layer.param.batch_norm_param
    return p.use_global_stats if p.HasField("use_global_stats") else phase == ir.TEST


@register("BatchNorm", counts=(1, 1, 1, 1), stateful=True)
def batch_norm(layer, params, bottoms, ctx):
    """y = (x − μ) / √(σ² + eps) per channel over (N, spatial).

    With ``use_global_stats``: μ, σ² are blobs 0, 1 times 1/blob 2 (0 when blob 2 is 0), and
    the blobs come back unchanged. Otherwise μ, σ² are the batch mean and biased variance, and
    the blobs come back as maf·b0 + μ, maf·b1 + m/(m−1)·σ² (m = count / channels; factor 1
    when m = 1) and maf·b2 + 1.
    """
    return _batch_norm(layer, params, bottoms[0], ctx, nhwc=False)


@batch_norm.nhwc
def _(layer, params, bottoms, ctx):
    """The same on a channels-last (N, H, W, C) bottom (lowering/layout.py: a Convolution →
    BatchNorm → Scale → ReLU chain stays channels-last, MobileNet-SSD's and ResNet's)."""
    return _batch_norm(layer, params, bottoms[0], ctx, nhwc=True)


def _view(x: jax.Array, c: int, nhwc: bool) -> tuple[jax.Array, tuple[int, ...]]:
    """``x`` as (N, C, H·W) in Caffe's layout, or as (N·H·W, C) where the channels are last
    (channels-last, or no spatial axes), and the axes its statistics run over. No trailing
    axis of 1: XLA:CPU's YNNPACK reduction over the rows of an (M, C, 1) array took 3× the
    time of the same sums over (M, C) (a MobileNet-SSD train step, docs/performance.md)."""
    if nhwc or count(x.shape) == x.shape[0] * c:
        return x.reshape(-1, c), (0,)
    return x.reshape(x.shape[0], c, -1), (0, 2)


def _batch_norm(layer, params, x, ctx, nhwc: bool):
    """BatchNorm over ``x`` viewed by :func:`_view`: statistics per channel (axis 1)."""
    c = x.shape[-1] if nhwc else _bn_channels(x.shape)
    x3, axes = _view(x, c, nhwc)
    per_channel = (None, slice(None), None)[: x3.ndim]
    mean, var, new_state = _statistics(layer, params, x3, axes, ctx)
    centered = x3 - mean[per_channel]
    y = centered / jnp.sqrt(var + layer.param.batch_norm_param.eps)[per_channel]
    return [y.reshape(x.shape)], new_state


def _statistics(layer, params, x3, axes, ctx):
    """The mean and variance BatchNorm normalises with, and its three state blobs after the
    forward (Caffe: running sums ``maf·old + new``, the variance's unbiased m/(m − 1))."""
    mean_sum, var_sum, factor = params
    if _use_global_stats(layer, ctx.phase):
        zero = factor[0] == 0
        inv = jnp.where(zero, 0.0, 1.0 / jnp.where(zero, 1.0, factor[0]))
        return mean_sum * inv, var_sum * inv, [mean_sum, var_sum, factor]
    per_channel = (None, slice(None), None)[: x3.ndim]
    mean = jnp.mean(x3, axis=axes)
    var = jnp.mean(jnp.square(x3 - mean[per_channel]), axis=axes)
    m = x3.size // mean.size
    correction = m / (m - 1) if m > 1 else 1.0
    maf = layer.param.batch_norm_param.moving_average_fraction
    return mean, var, [maf * mean_sum + mean, maf * var_sum + correction * var, maf * factor + 1.0]


def uses_batch_statistics(layer: ir.Layer, phase: str) -> bool:
    """Whether this BatchNorm normalises with its bottom's own statistics in ``phase``."""
    return not _use_global_stats(layer, phase)


def batch_norm_chain(bias: bool, layer, params, bottoms, ctx):
    """A channels-last BatchNorm (batch statistics) → Scale (per-channel γ, ``bias`` β) →
    ReLU (slope 0) chain as one step (lowering/planning.py finds it): ``params`` BatchNorm's
    three blobs then Scale's, the tops BatchNorm's, Scale's and ReLU's. The ReLU's top is
    lowering/engines/chains.py's fused function (its backward recomputes BatchNorm's top); the
    other two tops are the layers' own expressions, which XLA drops when nothing reads them."""
    if _use_global_stats(layer, ctx.phase):
        raise fail(layer, "a fused BatchNorm chain needs batch statistics")
    x = bottoms[0]
    x2 = x.reshape(-1, x.shape[-1])
    mean, var, new_state = _statistics(layer, params[:3], x2, (0,), ctx)
    gamma, beta = params[3], params[4] if bias else jnp.zeros_like(params[3])
    eps = layer.param.batch_norm_param.eps
    y = chains.normalized(x2, mean, var, eps)
    scaled = y * gamma + beta if bias else y * gamma
    top = chains.normalize_scale_relu(x2, mean, var, eps, gamma, beta)
    return [t.reshape(x.shape) for t in (y, scaled, top)], new_state


@batch_norm.param_shapes
def _(layer, bottom_shapes):
    c = _bn_channels(bottom_shapes[0])
    return [
        ParamDecl((c,), None, state=True),
        ParamDecl((c,), None, state=True),
        ParamDecl((1,), None, state=True),
    ]


# -- MVN ----------------------------------------------------------------------------------


def _mvn_forward(x: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
    centered = x - jnp.mean(x, axis=1, keepdims=True)
    denom = jnp.sqrt(jnp.mean(jnp.square(centered), axis=1, keepdims=True)) + eps
    return centered / denom, denom


@jax.custom_vjp
def _mvn_rows(x: jax.Array, eps: jax.Array) -> jax.Array:
    """Rows of x normalised to mean 0 and std 1: (x − μ) / (σ + eps).

    custom_vjp because Caffe's MVNLayer::Backward_cpu computes
    dx = (dy − mean(dy) − y·mean(dy·y)) / (σ + eps), which drops the eps from the derivative
    of σ (the true derivative has (σ + eps)/σ on the last term) and stays finite for a
    constant row, where the true derivative is infinite.
    """
    return _mvn_forward(x, eps)[0]


def _mvn_fwd(x, eps):
    y, denom = _mvn_forward(x, eps)
    return y, (y, denom, eps)


def _mvn_bwd(res, dy):
    y, denom, eps = res
    dx = dy - jnp.mean(dy, axis=1, keepdims=True) - y * jnp.mean(dy * y, axis=1, keepdims=True)
    return dx / denom, jnp.zeros_like(eps)


_mvn_rows.defvjp(_mvn_fwd, _mvn_bwd)


@register("MVN", counts=(1, 1, 1, 1))
def mvn(layer, params, bottoms, ctx):
    """Mean (and variance) normalisation per (n, c), or per n with ``across_channels``.

    y = x − mean, then with ``normalize_variance`` divided by std + eps (eps on the std, not
    the variance; std from the biased variance).
    """
    p = layer.param.mvn_param
    (x,) = bottoms
    if x.ndim > 4:
        raise fail(
            layer,
            f"Caffe's MVN views the bottom as (num, channels, …): at most 4 axes, got {x.ndim}",
        )
    num = x.shape[0] if x.ndim else 1
    channels = x.shape[1] if x.ndim > 1 else 1
    rows = num if p.across_channels else num * channels
    flat = x.reshape(rows, -1)
    if p.normalize_variance:
        y = _mvn_rows(flat, jnp.asarray(p.eps, x.dtype))
    else:
        y = flat - jnp.mean(flat, axis=1, keepdims=True)
    return [y.reshape(x.shape)]
