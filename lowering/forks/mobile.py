"""The mobile nets' layers: ShuffleChannel (ShuffleNet), Axpy (SENet), ReLU6 (eric612's
MobileNet-YOLO), and the depthwise convolution type strings ConvolutionDepthwise (farmingyard /
yonghenglh6 style, ShuffleNet and ChenYingpeng's prototxts) and DepthwiseConvolution (eric612,
ShuffleNet v2 ports).

* ShuffleChannel (shuffle_channel_layer.cpp): ``C = g·k``; top channel ``j·g + i`` is bottom
  channel ``i·k + j`` (a reshape to (N, g, k, H, W), a transpose of g and k, a reshape back).
  Its backward is the inverse permutation (autodiff of the transpose).
* Axpy (axpy_layer.cpp): bottoms ``[a (N, C, 1, 1) or (N, C), x, y]``, top ``a·x + y``; the
  fork's backward is the true gradient (``da = Σ_hw dtop·x``, ``dx = a·dtop``, ``dy = dtop``).
* ReLU6 (relu6_layer.cpp, ``relu6_param`` a ReLUParameter): ``y = min(max(x, 0) +
  negative_slope·min(x, 0), 6)``; its backward passes ``dy`` on ``0 < x < 6``,
  ``negative_slope·dy`` on ``x ≤ 0`` and nothing on ``x ≥ 6``: the ``jnp.where`` below tests
  the same predicates, so autodiff takes the fork's branch at the kinks.
* ConvolutionDepthwise / DepthwiseConvolution: Caffe's Convolution with ``group`` equal to the
  bottom's channel count (``num_output`` a multiple of it); weights (num_output, 1, kh, kw). A
  ``group`` the prototxt gives must be that channel count. The lowering is Convolution's own
  (its engines and channels-last form) on the layer with that group.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.layers import vision
from caffe2jax.lowering.registry import Context, ParamDecl, Planning, Shape, register
from caffe2jax.lowering.util import fail, nchw

Arrays = Sequence[jax.Array]


# -- ReLU6 -------------------------------------------------------------------------------------


def relu6_slope(layer: ir.Layer) -> float:
    p = layer.param
    return (
        p.relu6_param.negative_slope if p.HasField("relu6_param") else p.relu_param.negative_slope
    )


@register("ReLU6", counts=(1, 1, 1, 1))
def relu6(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """ReLU6Layer: the ReLU (with its negative slope) clipped at 6."""
    (x,) = bottoms
    slope = relu6_slope(layer)
    negative = x * slope if slope else jnp.zeros_like(x)
    six = jnp.full_like(x, 6.0)
    return [jnp.where(x > 0, jnp.where(x < 6, x, six), negative)]


relu6.nhwc(relu6.fn)  # element by element


# -- ShuffleChannel ---------------------------------------------------------------------------


def _groups(layer: ir.Layer, channels: int) -> int:
    g = layer.param.shuffle_channel_param.group
    if g < 1 or channels % g:
        raise fail(layer, f"{channels} channels are not divisible by shuffle group {g}")
    return g


@register("ShuffleChannel", counts=(1, 1, 1, 1))
def shuffle_channel(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context):
    """ShuffleChannelLayer: interleave the channels of ``group`` groups."""
    (x,) = bottoms
    if x.ndim < 2:
        raise fail(layer, f"ShuffleChannel needs a channel axis, got shape {tuple(x.shape)}")
    g = _groups(layer, x.shape[1])
    n, c = x.shape[:2]
    rest = x.shape[2:]
    y = x.reshape((n, g, c // g) + rest).swapaxes(1, 2)
    return [y.reshape(x.shape)]


@shuffle_channel.nhwc
def _(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    (x,) = bottoms
    g = _groups(layer, x.shape[3])
    y = x.reshape(x.shape[:3] + (g, x.shape[3] // g)).swapaxes(3, 4)
    return [y.reshape(x.shape)]


# -- Axpy -------------------------------------------------------------------------------------


def _axpy_scale(layer: ir.Layer, a: jax.Array, x: jax.Array) -> jax.Array:
    n, c = x.shape[:2]
    if a.shape not in ((n, c), (n, c, 1, 1)) or x.ndim != 4:
        raise fail(
            layer,
            f"Axpy takes a (N, C, 1, 1) or (N, C) scale and 4-D x, y of shape (N, C, H, W); "
            f"got a {tuple(a.shape)}, x {tuple(x.shape)}",
        )
    return a.reshape(n, c, 1, 1)


@register("Axpy", counts=(3, 3, 1, 1))
def axpy(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """AxpyLayer (SENet): ``a·x + y`` with one scale per (sample, channel)."""
    a, x, y = bottoms
    if x.shape != y.shape:
        raise fail(layer, f"x {tuple(x.shape)} and y {tuple(y.shape)} must have one shape")
    return [_axpy_scale(layer, a, x) * x + y]


@axpy.nhwc
def _(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """Channels-last: a is (N, 1, 1, C), x and y (N, H, W, C)."""
    a, x, y = bottoms
    if x.shape != y.shape or a.shape != (x.shape[0], 1, 1, x.shape[3]):
        raise fail(layer, f"Axpy bottoms a {nchw(a.shape)}, x {nchw(x.shape)}, "
                          f"y {nchw(y.shape)} do not fit")  # fmt: skip
    return [a * x + y]


# -- depthwise convolution --------------------------------------------------------------------


def depthwise(layer: ir.Layer, shape: Shape) -> ir.Layer:
    """``layer`` as the grouped Convolution it computes: group = the bottom's channels."""
    p = layer.param.convolution_param
    channels = shape[vision.conv_geometry(layer, shape).axis]
    if p.HasField("group") and p.group not in (1, channels):
        raise fail(layer, f"a depthwise convolution's group is its {channels} input channels; "
                          f"got group {p.group}")  # fmt: skip
    if p.num_output % channels:
        raise fail(layer, f"num_output {p.num_output} is not a multiple of the {channels} "
                          "input channels")  # fmt: skip
    param = caffe_pb2.LayerParameter()
    param.CopyFrom(layer.param)
    param.convolution_param.group = channels
    return dataclasses.replace(layer, param=param)


def depthwise_convolution(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context):
    """ConvolutionDepthwise / DepthwiseConvolution: Convolution with group = input channels."""
    conv = vision.convolution
    return conv.fn(depthwise(layer, tuple(bottoms[0].shape)), params, bottoms, ctx)


def _decls(layer: ir.Layer, bottom_shapes) -> list[ParamDecl]:
    conv = vision.convolution
    return conv.declare(depthwise(layer, tuple(bottom_shapes[0])), bottom_shapes)


def _eligible(layer: ir.Layer, shapes) -> bool:
    return vision.convolution.has_nhwc(layer, shapes)


def _nhwc(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context):
    conv = vision.convolution
    return conv.nhwc_fn(depthwise(layer, nchw(bottoms[0].shape)), params, bottoms, ctx)


def _engine(layer: ir.Layer, bottom_shapes, planning: Planning):
    grouped = depthwise(layer, tuple(bottom_shapes[0]))
    return vision.convolution.choose_engine(grouped, bottom_shapes, planning)


for _type in ("ConvolutionDepthwise", "DepthwiseConvolution"):
    _lowering = register(_type, counts=(1, None, 1, None), equal_bottom_top=True)(
        depthwise_convolution
    )
    _lowering.param_shapes(_decls)
    _lowering.nhwc(_nhwc, when=_eligible, starts=True)
    _lowering.engine(_engine)
