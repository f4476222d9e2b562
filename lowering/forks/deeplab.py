"""DeepLab's and PSPNet's layers (PSPNet's Caffe is built on DeepLab v2's): Interp and
ImageSegData (DeepLab v2 / PSPNet, and DeepLab v1's in form ``deeplab-v1``), and PSPNet's BN
(form ``pspnet``).

* Interp: the top size by the fork's rules (:func:`interp_size`; DeepLab v1 takes exactly one
  of zoom_factor, shrink_factor, or height and width), then align-corners bilinear sampling of
  the window ``[−pad_beg, H + pad_end)`` with the fork's float32 source coordinates
  (util/interp.cpp): ``r = (H_eff − 1)/(H_out − 1)`` (0 when H_out is 1), source ``r·i``,
  ``i0 = trunc``, ``i1 = i0 + 1`` unless at the last row, ``λ = r·i − i0``; the same size
  copies the window. Its backward scatters with the same weights, the true gradient.
* ImageSegData (``image_data_param``): images and label maps listed in ``source``, read by the
  runtime's pipeline (caffe2jax.runtime.data.image_seg_data); DeepLab v2's optional third top
  is data_dim, DeepLab v1 has exactly two tops.
* BN in PSPNet's form (PSPNet bn_layer.cpp): blobs ``[slope, bias, mean, variance]``
  (1, C, 1, 1); mean and variance are state. TEST, or ``frozen``: ``y = slope·(x − mean)/
  √(variance + eps) + bias``. TRAIN: the batch mean and biased variance (of ``x − μ``)
  normalise, and the running blobs become ``momentum·blob + (1 − momentum)·batch statistic``.
  The gradient is JAX's derivative of this forward, the fork's backward (TRAIN through the
  batch statistics; TEST and frozen with the statistics held constant).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import ir
from caffe2jax.lowering.layers.data import from_source
from caffe2jax.lowering.registry import Context, ParamDecl, Shape, register
from caffe2jax.lowering.util import CHANNEL_AXES, fail

Arrays = Sequence[jax.Array]


# -- Interp -----------------------------------------------------------------------------------


def interp_size(layer: ir.Layer, hw: tuple[int, int], v1: bool = False) -> tuple[int, int]:
    """InterpLayer::Reshape: the top's (height, width) from the cropped input size (``v1``:
    DeepLab v1's rule, exactly one of zoom_factor, shrink_factor, or height and width)."""
    p = layer.param.interp_param
    if p.pad_beg > 0 or p.pad_end > 0:
        raise fail(layer, "Interp supports only pad_beg, pad_end <= 0 (cropping)")
    eff = tuple(n + p.pad_beg + p.pad_end for n in hw)
    if min(eff) <= 0:
        raise fail(layer, f"pad_beg/pad_end crop the whole input {list(hw)}")
    shrink, zoom = p.HasField("shrink_factor"), p.HasField("zoom_factor")
    sized = p.HasField("height") and p.HasField("width")
    if v1 and shrink + zoom + sized != 1:
        raise fail(layer, "DeepLab v1's Interp takes exactly one of zoom_factor, "
                          "shrink_factor, or height and width")  # fmt: skip
    if (shrink and p.shrink_factor < 1) or (zoom and p.zoom_factor < 1):
        raise fail(layer, "shrink_factor and zoom_factor must be positive")
    if shrink and not zoom:
        return tuple((n - 1) // p.shrink_factor + 1 for n in eff)  # type: ignore[return-value]
    if zoom and not shrink:
        return tuple(n + (n - 1) * (p.zoom_factor - 1) for n in eff)  # type: ignore[return-value]
    if sized:
        if p.height <= 0 or p.width <= 0:
            raise fail(layer, f"Interp height and width must be positive, got {p.height}x{p.width}")
        return p.height, p.width
    if shrink and zoom:
        out = ((n - 1) // p.shrink_factor + 1 for n in eff)
        return tuple(n + (n - 1) * (p.zoom_factor - 1) for n in out)  # type: ignore[return-value]
    raise fail(layer, "Interp needs shrink_factor, zoom_factor, or height and width")


def interp_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) weights of util/interp.cpp's align-corners sampling, float32 as the fork
    computes its source coordinates."""
    a = np.zeros((n_out, n_in), np.float32)
    if n_in == n_out:
        np.fill_diagonal(a, 1)
        return a
    ratio = np.float32(n_in - 1) / np.float32(n_out - 1) if n_out > 1 else np.float32(0)
    for i in range(n_out):
        src = np.float32(ratio * np.float32(i))
        i0 = int(src)
        i1 = i0 + 1 if i0 < n_in - 1 else i0
        lam = np.float32(src - np.float32(i0))
        a[i, i0] += np.float32(1) - lam
        a[i, i1] += lam
    return a


def _interp(layer: ir.Layer, x: jax.Array, nhwc: bool, v1: bool = False) -> jax.Array:
    h_axis = 1 if nhwc else 2
    return interp_to(layer, x, interp_size(layer, (x.shape[h_axis], x.shape[h_axis + 1]), v1), nhwc)


def interp_to(layer: ir.Layer, x: jax.Array, size: tuple[int, int], nhwc: bool) -> jax.Array:
    """InterpLayer::Forward_cpu: the window ``[−pad_beg, H + pad_end)`` of ``x`` resized to
    ``size`` (height, width) by util/interp.cpp's sampling (a copy at the same size)."""
    h_axis, (oh, ow) = (1 if nhwc else 2), size
    hw = (x.shape[h_axis], x.shape[h_axis + 1])
    p = layer.param.interp_param
    start = -p.pad_beg
    crop = tuple(slice(start, n + p.pad_end) for n in hw)
    x = x[:, crop[0], crop[1]] if nhwc else x[:, :, crop[0], crop[1]]
    eff = (x.shape[h_axis], x.shape[h_axis + 1])
    if eff == (oh, ow):
        return x
    ah = jnp.asarray(interp_matrix(eff[0], oh), x.dtype)
    aw = jnp.asarray(interp_matrix(eff[1], ow), x.dtype)
    spec = "ih,jw,nhwc->nijc" if nhwc else "ih,jw,nchw->ncij"
    return jnp.einsum(spec, ah, aw, x, precision=jax.lax.Precision.HIGHEST)


def _four_d(layer: ir.Layer, bottoms: Arrays) -> jax.Array:
    (x,) = bottoms
    if x.ndim != 4:
        raise fail(layer, f"Interp takes a 4-D bottom, got {tuple(x.shape)}")
    return x


@register("Interp", counts=(1, 1, 1, 1))
def interp(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """InterpLayer (PSPNet, DeepLab v2)."""
    return [_interp(layer, _four_d(layer, bottoms), nhwc=False)]


@interp.nhwc
def _(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    return [_interp(layer, bottoms[0], nhwc=True)]


@register("Interp", form="deeplab-v1", counts=(1, 1, 1, 1))
def interp_v1(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """DeepLab v1's INTERP: InterpLayer with exactly one size rule (:func:`interp_size`)."""
    return [_interp(layer, _four_d(layer, bottoms), nhwc=False, v1=True)]


@interp_v1.nhwc
def _(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    return [_interp(layer, bottoms[0], nhwc=True, v1=True)]


# -- ImageSegData -------------------------------------------------------------------------------


def _image_seg_data(layer: ir.Layer):
    """DeepLab v2's ImageSegData: two tops, or three with data_dim."""
    return from_source(layer)


def _image_seg_data_v1(layer: ir.Layer):
    """DeepLab v1's IMAGE_SEG_DATA: two tops."""
    if len(layer.tops) != 2:
        raise fail(layer, f"DeepLab v1's IMAGE_SEG_DATA produces 2 tops, got {len(layer.tops)}")
    return from_source(layer)


for _form, _fn in (("", _image_seg_data), ("deeplab-v1", _image_seg_data_v1)):
    register("ImageSegData", form=_form, counts=(0, 0, 2, 3), source=True, feed="pipeline")(_fn)


@register("MatWrite", counts=(1, None, 0, 0), feed="sink")
def mat_write(layer, params, bottoms, ctx):
    """DeepLab's MatWriteLayer: no tops and nothing computed in the graph; the runtime writes
    each bottom to a .mat file after each forward (runtime/data/readers/mat_write.py)."""
    if not layer.param.mat_write_param.prefix:
        raise fail(layer, "mat_write_param.prefix is required")
    return []


# -- BN (PSPNet) --------------------------------------------------------------------------------


def _bn_channels(layer: ir.Layer, shape: Shape) -> int:
    if len(shape) != 4:
        raise fail(layer, f"BN takes a 4-D bottom (num, channels, height, width), got {shape}")
    return shape[1]


@register("BN", form="pspnet", counts=(1, 1, 1, 3), stateful=True)
def pspnet_bn(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context):
    """PSPNet's BN layer (module docstring): one top, the new running mean and variance."""
    if len(layer.tops) != 1:
        raise fail(layer, f"PSPNet's BN has one top, got {len(layer.tops)}")
    return _pspnet(layer, params, bottoms[0], ctx, nhwc=False)


@pspnet_bn.nhwc(when=lambda layer, shapes: len(layer.tops) == 1)
def _(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context):
    """The same on a channels-last (N, H, W, C) bottom (lowering/layout.py)."""
    return _pspnet(layer, params, bottoms[0], ctx, nhwc=True)


def _pspnet(layer: ir.Layer, params: Arrays, x: jax.Array, ctx: Context, nhwc: bool):
    p = layer.param.bn_param
    axes, column = CHANNEL_AXES[nhwc]
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


@pspnet_bn.param_shapes
def _(layer: ir.Layer, bottom_shapes: Sequence[Shape]) -> list[ParamDecl]:
    """slope, bias (their fillers), then the running mean and variance (state, zeros)."""
    shape = (1, _bn_channels(layer, tuple(bottom_shapes[0])), 1, 1)
    p = layer.param.bn_param
    return [
        ParamDecl(shape, p.slope_filler),
        ParamDecl(shape, p.bias_filler),
        ParamDecl(shape, None, state=True),
        ParamDecl(shape, None, state=True),
    ]
