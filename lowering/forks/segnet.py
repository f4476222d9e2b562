"""The forks' ``BN`` layer, in each fork's form (``ir.Layer.form``, frontend/forks/forms.py).

* ``segnet`` (SegNet, ENet: caffe-segnet bn_layer.cpp): blobs ``[scale, shift]`` of shape
  (1, C, 1, 1), no running statistics. ``bn_mode: LEARN`` normalises with the batch
  statistics in every phase (TEST included): ``μ = E[x]``, ``σ² = E[x²] − μ²`` over (N, H, W),
  ``y = scale·(x − μ)/√(σ² + 1e-9) + shift`` (eps hard-coded); optional tops 1 and 2 are μ and
  σ² (before eps), shaped (1, C, 1, 1). ``bn_mode: INFERENCE``: ``y = scale·x + shift`` (the
  statistics are folded into the blobs by SegNet's compute_bn_statistics.py).
* ``pspnet`` (PSPNet bn_layer.cpp): blobs ``[slope, bias, mean, variance]`` (1, C, 1, 1);
  mean and variance are state. TEST, or ``frozen``: ``y = slope·(x − mean)/√(variance + eps) +
  bias``. TRAIN: the batch mean and biased variance (of ``x − μ``) normalise, and the running
  blobs become ``momentum·blob + (1 − momentum)·batch statistic``.

Gradients are JAX's derivative of these forwards: both forks' backward passes are the true
gradient (LEARN and PSPNet TRAIN through the batch statistics; INFERENCE, TEST and frozen with
the statistics held constant).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.registry import Context, ParamDecl, Shape, register
from caffe2jax.lowering.util import fail

Arrays = Sequence[jax.Array]
SEGNET_EPS = 1e-9  # caffe-segnet bn_layer.cpp: var_eps_, not a parameter
LEARN = caffe_pb2.BNParameter.LEARN


def _channels(layer: ir.Layer, shape: Shape) -> int:
    if len(shape) != 4:
        raise fail(layer, f"BN takes a 4-D bottom (num, channels, height, width), got {shape}")
    return shape[1]


# the (N, H, W) axes and the per-channel shape of a bottom: NCHW, or channels-last (NHWC)
_AXES = {False: ((0, 2, 3), (1, -1, 1, 1)), True: ((0, 1, 2), (1, 1, 1, -1))}


@register("BN", counts=(1, 1, 1, 3), stateful=True)
def bn(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context):
    """The fork BN layer of ``layer.form`` (see the module docstring)."""
    return _bn(layer, params, bottoms[0], ctx, nhwc=False)


@bn.nhwc(when=lambda layer, shapes: len(layer.tops) == 1)
def _(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context):
    """The same on a channels-last (N, H, W, C) bottom (lowering/layout.py)."""
    return _bn(layer, params, bottoms[0], ctx, nhwc=True)


def _bn(layer: ir.Layer, params: Arrays, x: jax.Array, ctx: Context, nhwc: bool):
    if layer.form == "pspnet":
        if len(layer.tops) != 1:
            raise fail(layer, f"PSPNet's BN has one top, got {len(layer.tops)}")
        return _pspnet(layer, params, x, ctx, nhwc)
    return _segnet(layer, params, x, nhwc), []


def _segnet(layer: ir.Layer, params: Arrays, x: jax.Array, nhwc: bool) -> list[jax.Array]:
    axes, column = _AXES[nhwc]
    scale, shift = (p.reshape(column) for p in params)
    if layer.param.bn_param.bn_mode != LEARN:
        if len(layer.tops) != 1:
            raise fail(layer, "bn_mode INFERENCE has one top (no batch statistics)")
        return [scale * x + shift]
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x), axis=axes, keepdims=True) - jnp.square(mean)
    y = scale * (x - mean) / jnp.sqrt(var + SEGNET_EPS) + shift
    return [y, mean, var][: len(layer.tops)]


def _pspnet(layer: ir.Layer, params: Arrays, x: jax.Array, ctx: Context, nhwc: bool):
    p = layer.param.bn_param
    axes, column = _AXES[nhwc]
    slope, bias, mean, var = (b.reshape(column) for b in params)
    if ctx.train and not p.frozen:
        batch_mean = jnp.mean(x, axis=axes, keepdims=True)
        batch_var = jnp.mean(jnp.square(x - batch_mean), axis=axes, keepdims=True)
        m = p.momentum
        new_state = [
            (m * mean + (1 - m) * batch_mean).reshape(params[2].shape),
            (m * var + (1 - m) * batch_var).reshape(params[3].shape),
        ]
        mean, var = batch_mean, batch_var
    else:
        new_state = [params[2], params[3]]
    y = slope * (x - mean) / jnp.sqrt(var + p.eps) + bias
    return [y], new_state


@bn.param_shapes
def _(layer: ir.Layer, bottom_shapes: Sequence[Shape]) -> list[ParamDecl]:
    """SegNet: scale (scale_filler), shift (shift_filler). PSPNet: slope, bias (their
    fillers), then the running mean and variance (state, zeros)."""
    c = _channels(layer, tuple(bottom_shapes[0]))
    p = layer.param.bn_param
    shape = (1, c, 1, 1)
    if layer.form == "pspnet":
        return [
            ParamDecl(shape, p.slope_filler),
            ParamDecl(shape, p.bias_filler),
            ParamDecl(shape, None, state=True),
            ParamDecl(shape, None, state=True),
        ]
    return [ParamDecl(shape, p.scale_filler), ParamDecl(shape, p.shift_filler)]
