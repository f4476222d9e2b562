"""The MobileNet / ShuffleNet / SENet forks' layers in ONNX (lowering/forks/mobile.py,
lowering/fork_neuron.py):

* ConvolutionDepthwise / DepthwiseConvolution → Conv with ``group`` = the input channels.
* ShuffleChannel → Reshape (N, g, C/g, …), Transpose of the two group axes, Reshape back.
* Axpy (SENet) → ``a·x + y`` with ``a`` (N, C[, 1, 1]) broadcast over H, W.
* ReLU6 → Clip(0, 6), or with ``negative_slope`` ``x > 0 ? min(x, 6) : slope·x``.
* Mish → ``x·tanh(softplus(x))`` with the fork's thresholded softplus (x above 20, exp(x)
  below −20, log(exp(x) + 1) between).
"""

from __future__ import annotations

from caffe2jax.lowering.forks.mobile import depthwise, relu6_slope
from caffe2jax.runtime.onnx.layers.vision import convolution_group
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site


@register("ConvolutionDepthwise")
@register("DepthwiseConvolution")
def depthwise_convolution(site: Site) -> list[str]:
    """A depthwise convolution: Caffe's Convolution with group = input channels."""
    grouped = depthwise(site.layer, site.bottom_shapes[0])
    return convolution_group(site, grouped.param.convolution_param.group)


@register("ShuffleChannel")
def shuffle_channel(site: Site) -> list[str]:
    shape = site.bottom_shapes[0]
    groups = site.param.shuffle_channel_param.group
    if not site.batch_at(0):
        site.refuse("a batch elsewhere than axis 0")
    n = -1 if site.bottom_batch[0] is not None else shape[0]
    g = site.g
    split = g.reshape(site.bottoms[0], [n, groups, shape[1] // groups, *shape[2:]])
    perm = [0, 2, 1, *range(3, len(shape) + 1)]
    return [site.reshape_top(g.op("Transpose", [split], perm=perm))]


@register("Axpy")
def axpy(site: Site) -> list[str]:
    g = site.g
    a, x, y = site.bottoms
    if len(site.bottom_shapes[0]) == 2:
        a = g.unsqueeze(a, [2, 3])
    return [g.op("Add", [g.op("Mul", [a, x]), y])]


@register("ReLU6")
def relu6(site: Site) -> list[str]:
    g = site.g
    (x,) = site.bottoms
    slope = relu6_slope(site.layer)
    if not slope:
        return [g.op("Clip", [x, g.f32(0.0), g.f32(6.0)])]
    positive = g.op("Greater", [x, g.f32(0.0)])
    return [g.where(positive, g.op("Min", [x, g.f32(6.0)]), g.op("Mul", [x, g.f32(slope)]))]


@register("Mish")
def mish(site: Site) -> list[str]:
    g = site.g
    (x,) = site.bottoms
    big = g.op("Greater", [x, g.f32(20.0)])
    small = g.op("Less", [x, g.f32(-20.0)])
    middle = g.where(g.op("Or", [big, small]), g.f32(0.0), x)
    soft = g.op("Log", [g.op("Add", [g.op("Exp", [middle]), g.f32(1.0)])])
    tail = g.op("Exp", [g.op("Min", [x, g.f32(0.0)])])
    softplus = g.where(big, x, g.where(small, tail, soft))
    return [g.op("Mul", [x, g.op("Tanh", [softplus])])]
