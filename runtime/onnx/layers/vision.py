"""Vision layers in ONNX: Convolution, Deconvolution, Im2col, LRN and Crop (Pooling and SPP:
``pooling.py``), from Caffe's semantics as lowering/layers/vision.py computes them.

* Convolution → Conv (weights ``(num_output, C/group, *kernel)`` as Caffe stores them, pads
  symmetric, floor output sizes); axes before ``axis`` are folded into the batch and back.
* Deconvolution → ConvTranspose: Caffe's weights ``(C, num_output/group, *kernel)`` are
  ConvTranspose's layout; output ``s(in − 1) + d(k − 1) + 1 − 2p``.
* Im2col → a grouped Conv with one-hot kernels (exact copies, Caffe's channel-major columns).
* LRN ACROSS_CHANNELS → LRN (the same formula, ``k`` as bias); WITHIN_CHANNEL →
  ``x·(1 + α/n²·Σ_{n×n, zero padded} x²)^−β`` from AveragePool (k ignored, as in Caffe).
* Crop → Slice of the axes from ``axis`` at the offsets, to bottom[1]'s sizes.
"""

from __future__ import annotations

import math

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.lowering.layers.vision import conv_geometry
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site


def _folded(site: Site, x: str, i: int, axis: int, fn) -> str:
    """``fn`` on ``x`` viewed as (batch, C, *spatial) when ``axis`` > 1, folded back after."""
    shape = site.bottom_shapes[i]
    if axis == 1:
        return fn(x)
    if not site.batch_at(i):
        site.refuse("a convolution over axis > 1 with the batch elsewhere than axis 0")
    folded = site.g.reshape(x, [-1 if site.bottom_batch[i] else math.prod(shape[:axis]),
                                *shape[axis:]])  # fmt: skip
    return site.reshape_top(fn(folded), i)


def conv_attrs(geometry) -> dict:
    g = geometry
    return dict(kernel_shape=list(g.kernel), strides=list(g.stride), pads=list(g.pad) * 2,
                dilations=list(g.dilation))  # fmt: skip


def convolution_group(site: Site, group: int) -> list[str]:
    """Convolution (one Conv per bottom, the weights shared) with ``group`` groups."""
    p = site.param.convolution_param
    geometry = conv_geometry(site.layer, site.bottom_shapes[0])
    weights = [site.blob(0)] + ([site.blob(1)] if p.bias_term else [])
    attrs = conv_attrs(geometry)
    tops = []
    for i, x in enumerate(site.bottoms):
        conv = lambda v: site.g.op("Conv", [v, *weights], group=group, **attrs)  # noqa: E731
        tops.append(_folded(site, x, i, geometry.axis, conv))
    return tops


@register("Convolution")
def convolution(site: Site) -> list[str]:
    """ConvolutionLayer → Conv."""
    return convolution_group(site, site.param.convolution_param.group)


@register("Deconvolution")
def deconvolution(site: Site) -> list[str]:
    """DeconvolutionLayer → ConvTranspose (Caffe's weight layout is ConvTranspose's)."""
    p = site.param.convolution_param
    geometry = conv_geometry(site.layer, site.bottom_shapes[0])
    weights = [site.blob(0)] + ([site.blob(1)] if p.bias_term else [])
    attrs = conv_attrs(geometry)
    tops = []
    for i, x in enumerate(site.bottoms):

        def deconv(v):
            return site.g.op("ConvTranspose", [v, *weights], group=p.group, **attrs)

        tops.append(_folded(site, x, i, geometry.axis, deconv))
    return tops


@register("Im2col")
def im2col(site: Site) -> list[str]:
    """Im2colLayer → a Conv with one-hot kernels, ``group`` = channels: output channel
    ``c·∏k + offset`` copies channel c at that kernel offset (Caffe's column order)."""
    shape = site.bottom_shapes[0]
    geometry = conv_geometry(site.layer, shape)
    channels, taps = shape[geometry.axis], math.prod(geometry.kernel)
    weights = np.zeros((channels * taps, 1, *geometry.kernel), np.float32)
    for c in range(channels):
        for t in range(taps):
            weights[(c * taps + t, 0, *np.unravel_index(t, geometry.kernel))] = 1.0
    kernel = site.g.const(weights, hint="im2col")
    attrs = conv_attrs(geometry)

    def conv(v):
        return site.g.op("Conv", [v, kernel], group=channels, **attrs)

    return [_folded(site, site.bottoms[0], 0, geometry.axis, conv)]


@register("LRN")
def lrn(site: Site) -> list[str]:
    """LRNLayer, ACROSS_CHANNELS or WITHIN_CHANNEL (module docstring)."""
    p = site.param.lrn_param
    (x,) = site.bottoms
    g = site.g
    if p.norm_region == caffe_pb2.LRNParameter.ACROSS_CHANNELS:
        return [g.op("LRN", [x], size=p.local_size, alpha=p.alpha, beta=p.beta, bias=p.k)]
    n, half = p.local_size, (p.local_size - 1) // 2
    square = g.op("Mul", [x, x])
    mean = g.op("AveragePool", [square], kernel_shape=[n, n], pads=[half] * 4,
                count_include_pad=1)  # fmt: skip
    scale = g.op("Add", [g.f32(1.0), g.op("Mul", [mean, g.f32(p.alpha)])])
    return [g.op("Mul", [x, g.op("Pow", [scale, g.f32(-p.beta)])])]


@register("Crop")
def crop(site: Site) -> list[str]:
    """CropLayer → Slice: axes from ``axis`` on cut to bottom[1]'s sizes at the offsets."""
    p = site.param.crop_param
    shape, ref = site.bottom_shapes
    ndim = len(shape)
    start_axis = p.axis % ndim
    offsets = list(p.offset)
    axes, starts, ends = [], [], []
    for i in range(start_axis, ndim):
        off = offsets[0] if len(offsets) == 1 else offsets[i - start_axis] if offsets else 0
        if off == 0 and shape[i] == ref[i]:
            continue
        if site.bottom_batch[0] is not None and site.bottom_batch[0].axis == i:
            site.refuse("cropping the batch axis of a dynamic batch")
        axes.append(i)
        starts.append(off)
        ends.append(off + ref[i])
    if not axes:
        return [site.bottoms[0]]
    return [site.g.slice(site.bottoms[0], starts, ends, axes)]
