"""Vision layers: Convolution, Deconvolution, Im2col, LRN and Crop (Pooling and SPP live in
``pooling.py``).

Reproduced from Caffe (base_conv_layer.cpp, conv_layer.cpp, deconv_layer.cpp,
im2col_layer.cpp, lrn_layer.cpp, crop_layer.cpp):

* Geometry per spatial axis from ``kernel_size``/``stride``/``pad``/``dilation`` (once, or
  once per axis) or the 2-D ``kernel_h``/``kernel_w``, ``stride_h``… forms; channels on
  ``axis`` (default 1), every axis after it spatial, every axis before it batch.
* Convolution: weights ``(num_output, C/group, *kernel)``, output
  ``(in + 2p − (d(k−1)+1))/s + 1`` (floor). Deconvolution: weights
  ``(C, num_output/group, *kernel)``, output ``s(in − 1) + d(k−1) + 1 − 2p``. Bias
  ``(num_output,)``. Several bottoms are convolved with the same weights into as many tops.
* Im2col: Caffe's column layout ``(N, C·∏kernel, *out)``, channel-major.
* LRN: ACROSS_CHANNELS ``x·(k + α/n·Σ_window x²)^−β``; WITHIN_CHANNEL
  ``x·(1 + α/n²·Σ_{n×n, zero padded} x²)^−β`` (Caffe builds it from AVE pooling, so ``k`` is
  ignored).
* Crop: axes from ``axis`` on take bottom[1]'s size, at one offset for all of them or one per
  axis; the gradient is the top diff zero-padded back (autodiff of the slice).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.engines import conv_forms, folding, onednn, packing
from caffe2jax.lowering.engines.policy import ConvShape
from caffe2jax.lowering.registry import Context, ParamDecl, Planning, register
from caffe2jax.lowering.util import canonical_axis, fail, nchw

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ConvGeometry:
    """BaseConvolutionLayer's static geometry: channel axis and per-spatial-axis sizes."""

    axis: int
    kernel: Shape
    stride: Shape
    pad: Shape
    dilation: Shape

    @property
    def extent(self) -> Shape:
        """The dilated kernel extent ``d(k − 1) + 1`` per spatial axis."""
        return tuple(d * (k - 1) + 1 for d, k in zip(self.dilation, self.kernel))

    def conv_out(self, spatial: Shape) -> Shape:
        """Convolution / im2col output size per spatial axis (C++ integer division)."""
        return tuple(
            (n + 2 * p - e) // s + 1
            for n, p, e, s in zip(spatial, self.pad, self.extent, self.stride)
        )


def _per_axis(layer, p, name: str, n: int, default: int | None) -> Shape:
    """``name`` (repeated: once or once per spatial axis) or the 2-D ``name_h``/``name_w``."""
    field = "kernel_size" if name == "kernel" else name
    values = list(getattr(p, field))
    if name != "dilation" and (p.HasField(f"{name}_h") or p.HasField(f"{name}_w")):
        if n != 2:
            raise fail(layer, f"{name}_h & {name}_w can only be used for 2D convolution")
        if values:
            raise fail(layer, f"either {field} or {name}_h/w should be specified; not both")
        return getattr(p, f"{name}_h"), getattr(p, f"{name}_w")
    allowed = (1, n) if default is None else (0, 1, n)
    if len(values) not in allowed:
        raise fail(
            layer,
            f"{field} must be specified once, or once per spatial dimension ({field} specified "
            f"{len(values)} times; {n} spatial dims)",
        )
    if not values:
        return (default,) * n
    return tuple(values[0 if len(values) == 1 else i] for i in range(n))


def conv_geometry(layer: ir.Layer, shape: Shape) -> ConvGeometry:
    """Parse ``convolution_param`` against a bottom of ``shape`` as Caffe's LayerSetUp does."""
    p = layer.param.convolution_param
    axis = canonical_axis(layer, p.axis, len(shape))
    n = len(shape) - axis - 1
    geometry = ConvGeometry(
        axis,
        _per_axis(layer, p, "kernel", n, None),
        _per_axis(layer, p, "stride", n, 1),
        _per_axis(layer, p, "pad", n, 0),
        _per_axis(layer, p, "dilation", n, 1),
    )
    for name in ("kernel", "stride", "dilation"):
        if min(getattr(geometry, name), default=1) <= 0:
            raise fail(layer, f"{name} {list(getattr(geometry, name))} must be positive")
    return geometry


def _macs(geometry: ConvGeometry, num: int, spatial: Shape, weights: Shape) -> int:
    """Forward multiply-adds of one convolution: each top value sums C/group · kernel terms."""
    g = geometry
    out = [(s + 2 * p - e) // st + 1 for s, p, e, st in zip(spatial, g.pad, g.extent, g.stride)]
    return num * weights[0] * math.prod(out) * math.prod(weights[1:])


def _check_bottoms(layer: ir.Layer, shapes: list[Shape]) -> None:
    """Caffe's conv layers pair bottom i with top i (the registry checks the counts); all
    bottoms share one shape."""
    for shape in shapes[1:]:
        if shape != shapes[0]:
            raise fail(layer, f"bottom shapes differ: {list(shapes[0])} vs {list(shape)}")


def _check_extent(layer: ir.Layer, geometry: ConvGeometry, shape: Shape) -> None:
    """Refuse a dilated kernel larger than the padded input (an empty or garbage output)."""
    spatial = shape[geometry.axis + 1 :]
    for i, (n, p, e) in enumerate(zip(spatial, geometry.pad, geometry.extent)):
        if e > n + 2 * p:
            raise fail(
                layer,
                f"kernel extent {e} is larger than the padded input {n} + 2·{p} along spatial "
                f"axis {i}",
            )


def _conv_decls(layer: ir.Layer, bottom_shapes, transposed: bool) -> list[ParamDecl]:
    """Weight (and bias) blobs of Convolution / Deconvolution, with Caffe's group checks."""
    _check_bottoms(layer, [tuple(s) for s in bottom_shapes])
    p = layer.param.convolution_param
    shape = tuple(bottom_shapes[0])
    geometry = conv_geometry(layer, shape)
    channels, num_output, group = shape[geometry.axis], p.num_output, p.group
    if num_output <= 0:
        raise fail(layer, "convolution_param.num_output must be positive")
    if group <= 0 or channels % group:
        raise fail(layer, f"input channels {channels} are not divisible by group {group}")
    if num_output % group:
        raise fail(layer, f"num_output {num_output} is not divisible by group {group}")
    if transposed:
        weight = (channels, num_output // group) + geometry.kernel
    else:
        weight = (num_output, channels // group) + geometry.kernel
    decls = [ParamDecl(weight, p.weight_filler)]
    if p.bias_term:
        decls.append(ParamDecl((num_output,), p.bias_filler))
    return decls


def _batched(x: jax.Array, axis: int, fn) -> jax.Array:
    """Apply ``fn`` to ``x`` viewed as (batch, C, *spatial): axes before ``axis`` are batch."""
    if axis == 1:
        return fn(x)
    y = fn(x.reshape((math.prod(x.shape[:axis]),) + x.shape[axis:]))
    return y.reshape(x.shape[:axis] + y.shape[1:])


def _add_bias(layer: ir.Layer, y: jax.Array, params, axis: int) -> jax.Array:
    """``y`` plus the bias blob along its channel ``axis``."""
    if not layer.param.convolution_param.bias_term or folding.skipped(params[1]):
        return y  # no bias, or a forward-only program's folded bias (engines/folding.py)
    return y + params[1].reshape((-1,) + (1,) * (y.ndim - axis - 1))


def _convolve(layer: ir.Layer, params, bottoms, ctx: Context, channels_last: bool):
    """ConvolutionLayer in either layout: Caffe's (N, C, *spatial), leading axes before
    ``axis`` batched, or a channels-last 2-D (N, H, W, C) (lowering/layout.py); the weights
    are Caffe's (num_output, C/group, *kernel) either way. The form (lax.conv, oneDNN, a 1×1
    matrix product, im2col patches: lowering/engines/conv_forms.py) is the one the engine
    policy chose when the net was planned (``ctx.engine``; the plain lax.conv if none)."""
    shape = nchw(bottoms[0].shape) if channels_last else tuple(bottoms[0].shape)
    geometry = conv_geometry(layer, shape)
    _check_extent(layer, geometry, shape)
    group = layer.param.convolution_param.group
    args = geometry.stride, geometry.pad, geometry.dilation, group, channels_last

    def conv(x):
        return conv_forms.convolve(ctx.engine or "xla", x, params[0], *args)

    if channels_last:
        return [_add_bias(layer, conv(x), params, x.ndim - 1) for x in bottoms]
    axis = geometry.axis
    return [_add_bias(layer, _batched(x, axis, conv), params, axis) for x in bottoms]


@register("Convolution", counts=(1, None, 1, None), equal_bottom_top=True, bf16=True)
def convolution(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """ConvolutionLayer: grouped, strided, padded, dilated N-D convolution plus bias."""
    return _convolve(layer, params, bottoms, ctx, channels_last=False)


@convolution.param_shapes
def _(layer: ir.Layer, bottom_shapes) -> list[ParamDecl]:
    return _conv_decls(layer, bottom_shapes, transposed=False)


def _spatial_2d(layer: ir.Layer, shapes) -> bool:
    return conv_geometry(layer, tuple(shapes[0])).axis == 1


@convolution.nhwc(when=_spatial_2d, starts=True)
def _(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    return _convolve(layer, params, bottoms, ctx, channels_last=True)


@convolution.engine
def _(layer: ir.Layer, bottom_shapes, planning: Planning) -> str:
    """The form of this convolution under the net's engine policy, from its shapes."""
    shape = tuple(bottom_shapes[0])
    geometry = conv_geometry(layer, shape)
    x = (math.prod(shape[: geometry.axis]),) + shape[geometry.axis :]
    (weights, *_) = _conv_decls(layer, bottom_shapes, transposed=False)
    macs = _macs(geometry, x[0], x[2:], weights.shape)
    group = layer.param.convolution_param.group
    conv = ConvShape(x, weights.shape, geometry.pad, group, macs, planning.dtype,
                     planning.channels_last)  # fmt: skip
    return planning.policy.conv_form(conv)


def onednn_key(layer: ir.Layer, shape: Shape, weights: Shape, channels_last: bool) -> bytes:
    """The geometry key of the oneDNN primitive this 2-D Convolution runs on a bottom of
    Caffe ``shape``, axes before its channel axis folded into N as :func:`_batched` folds
    them (lowering/engines/packing.py packs its weights for that primitive)."""
    g = conv_geometry(layer, tuple(shape))
    x = (math.prod(shape[: g.axis]),) + tuple(shape[g.axis :])
    group = layer.param.convolution_param.group
    return onednn.Geometry(x, tuple(weights), g.stride, g.pad, g.dilation, group,
                           channels_last).key()  # fmt: skip


def onednn_keys(graph) -> dict[tuple[str, int], bytes]:
    """Each weight slot a oneDNN Convolution of ``graph`` (a planned Graph) reads, under its
    owner, with the geometry key of its primitive (lowering/engines/packing.py; a slot read at
    several geometries left out)."""
    net, found = graph.net, []
    for name, form in graph.engines.items():
        layer = net.layer(name)
        if form in ("onednn", "onednn-blocked", "onednn-dwpatches") and layer.type == "Convolution":
            slot = graph.shared.get((name, 0), (name, 0))
            shape, weights = net.shapes[layer.bottoms[0]], graph.decls[name][0].shape
            found.append((slot, onednn_key(layer, shape, weights, name in graph.nhwc_layers)))
    return packing.single(found)


def _transposed_kernel(weight: jax.Array, group: int) -> jax.Array:
    """Deconvolution weights (C, num_output/g, *k) as the OIHW kernel of the equivalent
    lhs-dilated convolution: (num_output, C/g, *k), spatially flipped."""
    c, out_g = weight.shape[:2]
    kernel = weight.shape[2:]
    w = weight.reshape((group, c // group, out_g) + kernel).swapaxes(1, 2)
    w = w.reshape((group * out_g, c // group) + kernel)
    return jnp.flip(w, axis=tuple(range(2, w.ndim)))


@register("Deconvolution", counts=(1, None, 1, None), equal_bottom_top=True, bf16=True)
def deconvolution(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """DeconvolutionLayer: the transpose of convolution (Caffe runs conv's backward-data)."""
    geometry = conv_geometry(layer, tuple(bottoms[0].shape))
    spatial = bottoms[0].shape[geometry.axis + 1 :]
    for i, (n, s, e, p) in enumerate(zip(spatial, geometry.stride, geometry.extent, geometry.pad)):
        if s * (n - 1) + e - 2 * p < 1:
            raise fail(layer, f"pad {p} leaves an empty output along spatial axis {i}")
    group = layer.param.convolution_param.group
    kernel = _transposed_kernel(params[0], group)

    def deconv(x):
        return lax.conv_general_dilated(
            x,
            kernel,
            (1,) * len(spatial),
            [(e - 1 - p, e - 1 - p) for e, p in zip(geometry.extent, geometry.pad)],
            lhs_dilation=geometry.stride,
            rhs_dilation=geometry.dilation,
            feature_group_count=group,
        )

    return [
        _add_bias(layer, _batched(x, geometry.axis, deconv), params, geometry.axis) for x in bottoms
    ]


@deconvolution.param_shapes
def _(layer: ir.Layer, bottom_shapes) -> list[ParamDecl]:
    return _conv_decls(layer, bottom_shapes, transposed=True)


def im2col(x: jax.Array, geometry: ConvGeometry) -> jax.Array:
    """Caffe's im2col of ``x`` (batch, C, *spatial): (batch, C·∏kernel, *out), channel-major.

    One strided slice of the zero-padded input per kernel offset (a static loop), so values and
    gradients are exact copies and sums.
    """
    spatial = x.shape[2:]
    out = geometry.conv_out(spatial)
    padded = jnp.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in geometry.pad])
    columns = []
    for offset in itertools.product(*map(range, geometry.kernel)):
        start = [0, 0] + [o * d for o, d in zip(offset, geometry.dilation)]
        limit = [x.shape[0], x.shape[1]] + [
            b + (n - 1) * s + 1 for b, n, s in zip(start[2:], out, geometry.stride)
        ]
        columns.append(lax.slice(padded, start, limit, [1, 1] + list(geometry.stride)))
    stacked = jnp.stack(columns, axis=2)
    return stacked.reshape((x.shape[0], -1) + out)


@register("Im2col", counts=(1, 1, 1, 1))
def im2col_layer(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """Im2colLayer: the column buffer Caffe's convolution multiplies its weights with."""
    (x,) = bottoms
    geometry = conv_geometry(layer, tuple(x.shape))
    _check_extent(layer, geometry, x.shape)
    return [_batched(x, geometry.axis, lambda v: im2col(v, geometry))]


@register("LRN", counts=(1, 1, 1, 1))
def lrn(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """LRNLayer: local response normalisation across or within channels."""
    p = layer.param.lrn_param
    (x,) = bottoms
    if x.ndim != 4:
        raise fail(layer, f"input must have 4 axes (num, channels, height, width), got {x.shape}")
    n = p.local_size
    if n % 2 != 1:
        raise fail(layer, f"LRN only supports odd values for local_size, got {n}")
    return [lrn_values(p, x)]


@lrn.nhwc
def _(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    return [lrn_values(layer.param.lrn_param, bottoms[0], nhwc=True)]


def lrn_values(p, x: jax.Array, nhwc: bool = False) -> jax.Array:
    """LRN of an NCHW ``x``, or of a channels-last one with ``nhwc`` (``lowering/layout.py``)."""
    n = p.local_size
    half = (n - 1) // 2
    zero = np.zeros((), x.dtype)  # concrete under jit: a differentiable monoid reduction
    c = 3 if nhwc else 1
    spatial = (1, 2) if nhwc else (2, 3)
    if p.norm_region == caffe_pb2.LRNParameter.ACROSS_CHANNELS:
        dims, pad = [1] * 4, [(0, 0)] * 4
        dims[c], pad[c] = n, (half, half)
        window = lax.reduce_window(x * x, zero, lax.add, dims, (1,) * 4, pad)
        scale = p.k + (p.alpha / n) * window
    else:
        dims, pad = [1] * 4, [(0, 0)] * 4
        for a in spatial:
            dims[a], pad[a] = n, (half, half)
        window = lax.reduce_window(x * x, zero, lax.add, dims, (1,) * 4, pad)
        scale = 1.0 + (p.alpha / (n * n)) * window
    # scale^−β as exp(−β·log scale): XLA:CPU's pow runs per element through libm, 4× slower
    # than its vectorised exp and log (GoogLeNet's norm2 fwd+bwd 7.6 → 1.7 ms). On the golden
    # LRN cases both forms are within 2.4e-7 of Caffe's (std::pow) top and bottom diff.
    return x * jnp.exp(jnp.log(scale) * jnp.asarray(-p.beta, x.dtype))


@register("Crop", counts=(2, 2, 1, 1), bf16=True)
def crop(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """CropLayer: bottom[0] cut to bottom[1]'s shape from ``axis`` on, at ``offset``."""
    x, ref = bottoms
    if x.ndim != ref.ndim:
        raise fail(layer, f"the bottoms have {x.ndim} and {ref.ndim} axes; they must be equal")
    p = layer.param.crop_param
    start_axis = canonical_axis(layer, p.axis, x.ndim)
    offsets = list(p.offset)
    if len(offsets) > 1 and start_axis + len(offsets) != x.ndim:
        raise fail(
            layer,
            f"{len(offsets)} offsets given for {x.ndim - start_axis} cropped axes; give one, or "
            "one per axis from crop axis on",
        )
    starts, sizes = [0] * x.ndim, list(x.shape)
    for i in range(start_axis, x.ndim):
        off = offsets[0] if len(offsets) == 1 else offsets[i - start_axis] if offsets else 0
        if x.shape[i] - off < ref.shape[i]:
            raise fail(
                layer,
                f"invalid crop in axis {i}: offset {off} + size {ref.shape[i]} exceeds "
                f"{x.shape[i]}",
            )
        starts[i], sizes[i] = off, ref.shape[i]
    return [lax.slice(x, starts, [s + n for s, n in zip(starts, sizes)])]
