"""Neuron layers: Caffe's elementwise NeuronLayer family, PReLU and Dropout.

Every forward reproduces Caffe's ``Forward_cpu`` formula; gradients come from JAX autodiff.
Where Caffe's ``Backward_cpu`` picks a one-sided derivative at a kink (ReLU, PReLU and ELU
at 0 take the negative side, Clip passes the gradient on the closed interval, AbsVal uses
``sign(0) = 0``), the forward is written with ``jnp.where`` on the same predicate Caffe's
backward tests, so autodiff selects exactly Caffe's branch and no custom VJP is needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.registry import Context, ParamDecl, Shape, register
from caffe2jax.lowering.util import fail

Arrays = Sequence[jax.Array]


@register("ReLU", counts=(1, 1, 1, 1), bf16=True)
def relu(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """ReLULayer: ``y = x`` for ``x > 0``, else ``negative_slope·x``.

    Caffe's backward is ``dy·(x > 0 ? 1 : negative_slope)``: at ``x = 0`` the slope side.
    """
    (x,) = bottoms
    slope = layer.param.relu_param.negative_slope
    negative = x * slope if slope else jnp.zeros_like(x)
    return [jnp.where(x > 0, x, negative)]


relu.nhwc(relu.fn)  # element by element: the same function in any layout (lowering/layout.py)


@register("PReLU", counts=(1, 1, 1, 1))
def prelu(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """PReLULayer: ``y = x`` for ``x > 0``, else ``a_c·x`` with one learned slope per channel
    (axis 1), or a single 0-d slope with ``channel_shared``.

    Caffe's backward: ``dx = dy·(x > 0 ? 1 : a_c)`` and ``da_c = Σ dy·x·(x ≤ 0)``.
    """
    (x,) = bottoms
    (slope,) = params
    if slope.ndim:  # one slope per channel, broadcast over axis 1
        slope = jnp.reshape(slope, (1, -1) + (1,) * (x.ndim - 2))
    return [jnp.where(x > 0, x, x * slope)]


@prelu.param_shapes
def _(layer: ir.Layer, bottom_shapes: Sequence[Shape]) -> list[ParamDecl]:
    """One slope blob: shape ``()`` when ``channel_shared``, else ``(C,)``; filler constant 0.25
    unless ``prelu_param.filler`` is given (PReLULayer::LayerSetUp)."""
    (shape,) = bottom_shapes
    if len(shape) < 2:
        raise fail(layer, f"the bottom needs at least 2 axes, got shape {list(shape)}")
    p = layer.param.prelu_param
    if p.HasField("filler"):
        filler = p.filler
    else:
        filler = caffe_pb2.FillerParameter(type="constant", value=0.25)
    return [ParamDecl(() if p.channel_shared else (shape[1],), filler)]


@register("ELU", counts=(1, 1, 1, 1))
def elu(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """ELULayer: ``y = x`` for ``x > 0``, else ``alpha·(exp(x) − 1)``.

    Caffe's backward is ``dy`` for ``x > 0`` else ``dy·(y + alpha)``: at ``x = 0`` that is
    ``alpha``, the negative side. The exponential only ever sees ``x ≤ 0`` (no overflow).
    """
    (x,) = bottoms
    alpha = layer.param.elu_param.alpha
    positive = x > 0
    negative_part = jnp.where(positive, 0, x)
    return [jnp.where(positive, x, alpha * jnp.expm1(negative_part))]


@register("Sigmoid", counts=(1, 1, 1, 1))
def sigmoid(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """SigmoidLayer: ``y = 1 / (1 + exp(−x))``; backward ``dy·y·(1 − y)``."""
    return [jax.nn.sigmoid(bottoms[0])]


@register("TanH", counts=(1, 1, 1, 1))
def tanh(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """TanHLayer: ``y = tanh(x)``; backward ``dy·(1 − y²)``."""
    return [jnp.tanh(bottoms[0])]


@register("AbsVal", counts=(1, 1, 1, 1))
def absval(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """AbsValLayer: ``y = |x|``; backward ``dy·sign(x)`` with ``sign(0) = 0``.

    Written as ``x·sign(x)`` (exact) because jnp.abs's derivative at 0 is 1, not Caffe's 0.
    """
    (x,) = bottoms
    return [x * jnp.sign(x)]


@register("Power", counts=(1, 1, 1, 1))
def power(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """PowerLayer: ``y = (shift + scale·x)^power``.

    Caffe's special cases are static here: ``power = 0`` or ``scale = 0`` gives the constant
    ``1`` (power 0) or ``shift^power`` with zero gradient; ``power = 1`` is affine (gradient
    ``scale``); ``power = 2`` squares (gradient ``2·scale·(shift + scale·x)``). Other integer
    powers use exact repeated multiplication, so negative bases work as with ``std::pow``.
    Caffe's general backward ``power·y / x`` (shift 0) agrees with the true derivative except
    where the base is 0, at which Caffe divides 0 by 0.
    """
    (x,) = bottoms
    p = layer.param.power_param
    if p.power == 0 or p.scale == 0:
        value = 1.0 if p.power == 0 else math.pow(p.shift, p.power)
        return [jnp.full(x.shape, value, x.dtype)]
    base = x * p.scale if p.scale != 1 else x
    if p.shift != 0:
        base = base + p.shift
    if p.power == 1:
        return [base]
    if float(p.power).is_integer() and abs(p.power) <= 64:
        return [lax.integer_pow(base, int(p.power))]
    return [jnp.power(base, jnp.asarray(p.power, x.dtype))]


def caffe_log_base(layer: ir.Layer, base: float) -> float:
    """Caffe's ``log_base``: 1 for the default ``base = −1`` (e), else ``ln(base)``, base > 0."""
    if base == -1:
        return 1.0
    if not base > 0:
        raise fail(layer, f"base must be strictly positive (or -1 for e), got {base}")
    return math.log(base)


@register("Exp", counts=(1, 1, 1, 1))
def exp(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """ExpLayer: ``y = base^(shift + scale·x)``, computed as Caffe does,
    ``outer·exp(inner·x)`` with ``inner = ln(base)·scale`` and ``outer = base^shift``."""
    (x,) = bottoms
    p = layer.param.exp_param
    log_base = caffe_log_base(layer, p.base)
    inner = log_base * p.scale
    outer = 1.0 if p.shift == 0 else math.exp(log_base * p.shift)
    y = jnp.exp(x * inner if inner != 1 else x)
    return [y * outer if outer != 1 else y]


@register("Log", counts=(1, 1, 1, 1))
def log(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """LogLayer: ``y = log_base(shift + scale·x)`` (base −1 means e); base 1 is refused."""
    (x,) = bottoms
    p = layer.param.log_param
    log_base = caffe_log_base(layer, p.base)
    if log_base == 0:
        raise fail(layer, "base 1 has no logarithm (1/log(base) is infinite)")
    inner = x * p.scale if p.scale != 1 else x
    if p.shift != 0:
        inner = inner + p.shift
    y = jnp.log(inner)
    return [y * (1.0 / log_base) if log_base != 1 else y]


@register("BNLL", counts=(1, 1, 1, 1))
def bnll(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """BNLLLayer: ``y = log(1 + exp(x))``, computed stably; backward ``dy·sigmoid(x)``
    (Caffe clamps the exponent at 50, where the sigmoid is already 1 in float32)."""
    return [jax.nn.softplus(bottoms[0])]


@register("Threshold", counts=(1, 1, 1, 1))
def threshold(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """ThresholdLayer: ``y = 1`` where ``x > threshold``, else 0.

    Caffe has no backward for it (NOT_IMPLEMENTED); a step function's gradient here is 0.
    """
    (x,) = bottoms
    return [(x > layer.param.threshold_param.threshold).astype(x.dtype)]


@register("Clip", counts=(1, 1, 1, 1))
def clip(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """ClipLayer: ``y = max(min, min(x, max))``; Caffe's backward passes ``dy`` exactly where
    ``min ≤ x ≤ max`` (both ends included) and 0 elsewhere."""
    (x,) = bottoms
    p = layer.param.clip_param
    clipped = jnp.maximum(p.min, jnp.minimum(x, p.max)).astype(x.dtype)
    inside = (x >= p.min) & (x <= p.max)
    return [jnp.where(inside, x, lax.stop_gradient(clipped))]


@register("Swish", counts=(1, 1, 1, 1))
def swish(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """SwishLayer: ``y = x·sigmoid(beta·x)``; backward ``dy·(beta·y + σ·(1 − beta·y))``."""
    (x,) = bottoms
    beta = layer.param.swish_param.beta
    return [x * jax.nn.sigmoid(x * beta if beta != 1 else x)]


def dropout_ratio(layer: ir.Layer) -> float:
    """``dropout_param.dropout_ratio``, refused outside [0, 1) (1 would scale by infinity)."""
    ratio = layer.param.dropout_param.dropout_ratio
    if not 0 <= ratio < 1:
        raise fail(layer, f"dropout_ratio must be in [0, 1), got {ratio}")
    return ratio


def dropped(x: jax.Array, ratio: float, ctx: Context, scale: bool = True) -> jax.Array:
    """``x`` with each element kept with probability ``1 − ratio`` (a Bernoulli mask from the
    layer's key) and, when ``scale``, the kept ones scaled by ``1/(1 − ratio)``."""
    keep = jax.random.bernoulli(ctx.key(), 1.0 - ratio, x.shape)
    return jnp.where(keep, x * (1.0 / (1.0 - ratio)) if scale else x, jnp.zeros_like(x))


@register("Dropout", counts=(1, 1, 1, 1), bf16=True)
def dropout(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """DropoutLayer: in TRAIN each element is kept with probability ``1 − dropout_ratio``
    (a Bernoulli mask from this layer's key) and scaled by ``1/(1 − dropout_ratio)``; the
    backward applies the same mask and scale. TEST is the identity. Ratios outside [0, 1) are
    refused (1 would scale by infinity). (Faster R-CNN's and SegNet's forms of it:
    lowering/forks/rcnn.py, lowering/forks/segnet.py.)
    """
    (x,) = bottoms
    ratio = dropout_ratio(layer)
    return [dropped(x, ratio, ctx) if ctx.train else x]
