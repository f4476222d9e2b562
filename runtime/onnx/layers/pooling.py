"""Pooling and SPP in ONNX, with Caffe's sizes and windows (lowering/layers/pooling.py).

Caffe's output size is ``ceil((H + 2p − k)/s) + 1``, less one where the last window would
start in the padding; ONNX's ``ceil_mode`` has no such rule. So no ONNX rounding is used: the
size is Caffe's, written as an explicit end padding ``e = (out − 1)·s + k − H − p`` on a floor
pooling (0 when the windows already fit):

* MAX → MaxPool with pads ``(p, e)``: padded cells never win, a window wholly in the padding
  gives −FLT_MAX, as Caffe's. The mask top (a second top) is MaxPool's Indices modulo H·W (the
  first maximum in the window's row-major scan, as Caffe's mask).
* AVE divides by the window clipped to ``[−p, H + p)``: the input is zero-padded by ``p`` (those
  cells count), then AveragePool with ``count_include_pad=0`` pads what the last windows need
  past that (those cells do not count).
* STOCHASTIC in TEST: ``Σx² / (FLT_MIN + Σx)`` over each (clipped) window; TRAIN draws random
  numbers and is refused.
* Where ONNX refuses a padding as large as the kernel (kernel < stride), the padding is an
  explicit Pad and, for AVE, the sum is divided by Caffe's divisor as a constant.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from caffe2jax.lowering.layers import pooling as caffe_pooling
from caffe2jax.lowering.layers.pooling import AVE, MAX, PoolSpec, pooling_spec
from caffe2jax.runtime.onnx.builder import FLT_MAX, FLT_MIN, Builder
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site


def end_pads(spec: PoolSpec, hw) -> list[int]:
    """The padding after each spatial axis that makes floor pooling give Caffe's size."""
    return [max(0, (o - 1) * s + k - n - p)
            for o, s, k, n, p in zip(spec.out, spec.stride, spec.kernel, hw, spec.pad)]  # fmt: skip


def _cut(g: Builder, y: str, spec: PoolSpec, got) -> str:
    """``y`` cut to Caffe's output size where the pooling made more rows or columns."""
    if tuple(got) == tuple(spec.out):
        return y
    return g.slice(y, [0, 0], list(spec.out), [2, 3])


def _floor_out(hw, spec: PoolSpec, before, after) -> list[int]:
    return [(n + b + a - k) // s + 1
            for n, b, a, k, s in zip(hw, before, after, spec.kernel, spec.stride)]  # fmt: skip


def max_pool(g: Builder, x: str, spec: PoolSpec, hw, mask: bool = False):
    """Caffe's MAX pooling of NCHW ``x`` (and its mask with ``mask``)."""
    ends = end_pads(spec, hw)
    attrs = dict(kernel_shape=list(spec.kernel), strides=list(spec.stride))
    if all(p < k and e < k for p, e, k in zip(spec.pad, ends, spec.kernel)):
        if spec.kernel == tuple(hw) and not any(spec.pad) and not mask:
            return g.op("GlobalMaxPool", [x])
        outs = g.op("MaxPool", [x], outputs=2 if mask else 1, pads=[*spec.pad, *ends], **attrs)
        if not mask:
            return _cut(g, outs, spec, _floor_out(hw, spec, spec.pad, ends))
        y, index = outs
        plane = g.op("Mod", [index, g.i64(hw[0] * hw[1])])
        return y, g.cast(plane, TensorProto.FLOAT)
    if mask:
        raise ValueError("a MAX pooling mask with a padding as large as the kernel")
    padded = g.op("Pad", [x, g.i64([0, 0, *spec.pad, 0, 0, *ends]), g.f32(-FLT_MAX)])
    y = g.op("MaxPool", [padded], **attrs)
    return _cut(g, y, spec, _floor_out(hw, spec, spec.pad, ends))


def caffe_divisor(spec: PoolSpec, hw) -> np.ndarray:
    """AVE's divisor per output cell: the window clipped to ``[−p, H + p)``."""
    sizes = []
    for n, k, s, p, o in zip(hw, spec.kernel, spec.stride, spec.pad, spec.out):
        start = np.arange(o) * s - p
        sizes.append(np.minimum(start + k, n + p) - start)
    return np.outer(*sizes).astype(np.float32)[None, None]


def ave_pool(g: Builder, x: str, spec: PoolSpec, hw) -> str:
    """Caffe's AVE pooling of NCHW ``x`` (module docstring)."""
    if spec.kernel == tuple(hw) and not any(spec.pad):
        return g.op("GlobalAveragePool", [x])
    attrs = dict(kernel_shape=list(spec.kernel), strides=list(spec.stride))
    padded = x
    if any(spec.pad):
        padded = g.op("Pad", [x, g.i64([0, 0, *spec.pad, 0, 0, *spec.pad])])
    grown = [n + 2 * p for n, p in zip(hw, spec.pad)]
    tails = [max(0, e - p) for e, p in zip(end_pads(spec, hw), spec.pad)]
    if all(t < k for t, k in zip(tails, spec.kernel)):
        y = g.op("AveragePool", [padded], pads=[0, 0, *tails], count_include_pad=0, **attrs)
        return _cut(g, y, spec, _floor_out(grown, spec, (0, 0), tails))
    padded = g.op("Pad", [padded, g.i64([0, 0, 0, 0, 0, 0, *tails])])
    mean = g.op("AveragePool", [padded], **attrs)
    mean = _cut(g, mean, spec, _floor_out(grown, spec, (0, 0), tails))
    total = g.op("Mul", [mean, g.f32(float(spec.kernel[0] * spec.kernel[1]))])
    return g.op("Div", [total, g.const(caffe_divisor(spec, hw), hint="divisor")])


def window_sum(g: Builder, x: str, spec: PoolSpec, hw, channels: int) -> str:
    """Σ over each (clipped, unpadded) window: a depthwise Conv with a kernel of ones."""
    ends = end_pads(spec, hw)
    padded = g.op("Pad", [x, g.i64([0, 0, 0, 0, 0, 0, *ends])]) if any(ends) else x
    ones = g.const(np.ones((channels, 1, *spec.kernel), np.float32), hint="ones")
    y = g.op("Conv", [padded, ones], group=channels, kernel_shape=list(spec.kernel),
             strides=list(spec.stride))  # fmt: skip
    return _cut(g, y, spec, _floor_out(hw, spec, (0, 0), ends))


def pool(site: Site, x: str, spec: PoolSpec, shape, train: bool) -> str:
    """One Caffe pooling of ``x`` (N, C, H, W) in ONNX."""
    g, hw = site.g, tuple(shape[2:])
    if spec.method == MAX:
        return max_pool(g, x, spec, hw)
    if spec.method == AVE:
        return ave_pool(g, x, spec, hw)
    if train:
        site.refuse("STOCHASTIC pooling draws random numbers here (TRAIN, or inside SPP); only "
                    "its TEST form (Σx²/Σx) has an ONNX form")  # fmt: skip
    squares = window_sum(g, g.op("Mul", [x, x]), spec, hw, shape[1])
    sums = window_sum(g, x, spec, hw, shape[1])
    return g.op("Div", [squares, g.op("Add", [sums, g.f32(FLT_MIN)])])


def pooling_with(site: Site, spec_fn) -> list[str]:
    """A PoolingLayer in ONNX with the geometry ``spec_fn(layer, shape)`` gives (BVLC's
    ``pooling_spec``; a fork's form passes its own)."""
    shape = site.bottom_shapes[0]
    spec = spec_fn(site.layer, shape)
    (x,) = site.bottoms
    if len(site.tops) == 2:
        try:
            return list(max_pool(site.g, x, spec, shape[2:], mask=True))
        except ValueError as err:
            site.refuse(str(err))
    return [pool(site, x, spec, shape, train=False)]


@register("Pooling")
def pooling(site: Site) -> list[str]:
    """PoolingLayer (darknet2caffe's form: runtime/onnx/forks/yolo.py)."""
    return pooling_with(site, pooling_spec)


@register("SPP")
def spp(site: Site) -> list[str]:
    """SPPLayer: each pyramid level pooled (STOCHASTIC samples in every phase, as Caffe's
    levels run in TRAIN), flattened, concatenated along axis 1."""
    shape = site.bottom_shapes[0]
    p = site.param.spp_param
    method = caffe_pooling.P.PoolMethod.Value(
        caffe_pooling.caffe_pb2.SPPParameter.PoolMethod.Name(p.pool)
    )
    levels = []
    for level in range(p.pyramid_height):
        spec = caffe_pooling.spp_spec(site.layer, method, shape[2:], level)
        levels.append(pool(site, site.bottoms[0], spec, shape, train=True))
    if len(levels) == 1:
        return levels
    flat = [site.g.op("Flatten", [y], axis=1) for y in levels]
    return [site.g.op("Concat", flat, axis=1)]
