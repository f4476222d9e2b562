"""RCF's AutoCrop offsets, from the net as RCF's Caffe finds them (yun-liu/rcf@ce460ff,
src/caffe/layers/auto_crop_layer.cpp and include/caffe/util/coords.hpp), and those of HED's
``Crop`` (s9xie/hed, src/caffe/layers/crop_layer.cpp: the same walk, under BVLC's type name).

AutoCropLayer::LayerSetUp walks back from each bottom along each layer's first bottom (the
first layer that wrote a blob: in-place layers are passed over) to the first blob on bottom 0's
path, composes the layers' coordinate maps (per axis ``x ↦ a·x + b``) from there to each bottom,
and takes ``crop = coord_map[1] ∘ coord_map[0]⁻¹``; its scale must be 1 and its shift ``−o`` a
whole number ≤ 0; ``o`` (height, width) is where bottom 0 is cut to bottom 1's size.

Coordinate maps of RCF's Caffe: Convolution and Pooling ``FilterMap(k, s, p)⁻¹``, Deconvolution
``FilterMap(k, s, p)`` with ``FilterMap = (s, (k − 1)/2 − p)`` (k the dilated kernel extent),
Crop and AutoCrop a shift by their offsets, the neuron layers, Concat, Eltwise, LRN, MVN, Slice,
Softmax and Split the identity; any other layer is NOT_IMPLEMENTED there (refused here). The
arithmetic is float32, as ``DiagonalAffineMap<float>``'s.

The offsets are written into a copy of the AutoCrop layer's LayerParameter as BVLC's
``crop_param`` (axis 2, offset [h, w]): AutoCrop is a Crop whose offsets come from the net.

HED's Caffe has no ``crop_param`` (its caffe.proto stops at tile_param): its two-bottom
``Crop`` always cuts where the walk above aligns the bottoms, so HED's nets (deploy.prototxt,
train_val.prototxt) carry a bare ``Crop``. BVLC's Crop without ``crop_param`` cuts at offset
0. A bare two-bottom Crop whose bottoms the walk aligns at a nonzero offset is therefore read as
HED's (only HED's Caffe ran such a net to the alignment its author meant), unless the dialect
``bvlc`` is given; where the walk cannot align the bottoms (HED's Caffe would refuse the net)
or aligns them at 0, BVLC's offset 0 stands.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import numpy as np

from caffe2jax.frontend import caffe_pb2

log = logging.getLogger("caffe2jax")

Param = caffe_pb2.LayerParameter
Map = tuple[tuple[np.float32, np.float32], ...]  # per axis (scale, shift)
Fail = Callable[[Param, str], Exception]

IDENTITY_TYPES = frozenset({
    "ReLU", "Sigmoid", "TanH", "Dropout", "Power", "Exp", "Log", "AbsVal", "BNLL", "Threshold",
    "ELU", "PReLU", "Concat", "Eltwise", "LRN", "MVN", "Slice", "Softmax", "Split",
})  # fmt: skip
_IDENTITY: Map = ((np.float32(1), np.float32(0)),) * 2


def _compose(left: Map, right: Map) -> Map:
    return tuple((la * ra, la * rb + lb) for (la, lb), (ra, rb) in zip(left, right))


def _inv(m: Map) -> Map:
    return tuple((np.float32(1) / a, -b / a) for a, b in m)


def _pair(repeated, single_h: int, single_w: int, has_hw: bool, default: int) -> tuple[int, int]:
    if has_hw:
        return single_h, single_w
    values = list(repeated) or [default]
    return (values[0], values[-1]) if len(values) <= 2 else (values[0], values[1])


def _filter_map(kernel, stride, pad) -> Map:
    return tuple(
        (np.float32(s), np.float32(np.float32(k - 1) / np.float32(2) - np.float32(p)))
        for k, s, p in zip(kernel, stride, pad)
    )


def _conv_map(p: caffe_pb2.ConvolutionParameter) -> Map:
    kernel = _pair(p.kernel_size, p.kernel_h, p.kernel_w, p.HasField("kernel_h"), 0)
    stride = _pair(p.stride, p.stride_h, p.stride_w, p.HasField("stride_h"), 1)
    pad = _pair(p.pad, p.pad_h, p.pad_w, p.HasField("pad_h"), 0)
    dilation = _pair(p.dilation, 0, 0, False, 1)
    extent = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation))
    return _filter_map(extent, stride, pad)


def _pool_map(p: caffe_pb2.PoolingParameter) -> Map:
    kernel = (p.kernel_h, p.kernel_w) if p.HasField("kernel_h") else (p.kernel_size,) * 2
    stride = (p.stride_h, p.stride_w) if p.HasField("stride_h") else (p.stride,) * 2
    pad = (p.pad_h, p.pad_w) if p.HasField("pad_h") else (p.pad,) * 2
    return _inv(_filter_map(kernel, stride, pad))


def layer_map(param: Param, offsets: dict[str, tuple[int, int]], fail: Fail) -> Map:
    """The coordinate map of one layer (its top's coordinates in its bottom's)."""
    kind = param.type
    if kind in IDENTITY_TYPES:
        return _IDENTITY
    if kind == "Convolution":
        return _inv(_conv_map(param.convolution_param))
    if kind == "Deconvolution":
        return _conv_map(param.convolution_param)
    if kind == "Pooling" and not param.pooling_param.global_pooling:
        return _pool_map(param.pooling_param)
    if kind in ("Crop", "AutoCrop") and param.name in offsets:
        return tuple((np.float32(1), -np.float32(o)) for o in offsets[param.name])
    raise fail(param, "AutoCrop cannot align through it: RCF's Caffe has no coordinate map for "
                      f"a {kind} layer (it has them for Convolution, Deconvolution, Pooling, "
                      "Crop and the element-wise layers)")  # fmt: skip


def _crop_offsets(param: Param) -> tuple[int, int] | None:
    """A BVLC Crop's (h, w) offsets when it crops the spatial axes (for the walk)."""
    p = param.crop_param
    if p.axis != 2 or len(p.offset) not in (1, 2):
        return None
    return (p.offset[0], p.offset[-1])


def _walk(blob: str, writer: dict[str, Param]) -> list[str]:
    path = [blob]
    while blob in writer and writer[blob].bottom:
        blob = writer[blob].bottom[0]
        path.append(blob)
    return path


def _offset(param: Param, layers: Sequence[Param], offsets, fail: Fail) -> tuple[int, int]:
    writer: dict[str, Param] = {}
    for layer in layers:
        for top in layer.top:
            writer.setdefault(top, layer)
    on_path = set(_walk(param.bottom[0], writer))
    inter = param.bottom[1]
    while inter not in on_path:
        if inter not in writer or not writer[inter].bottom:
            raise fail(param, "cannot align apparently disconnected blobs "
                              f"'{param.bottom[0]}' and '{param.bottom[1]}'")  # fmt: skip
        inter = writer[inter].bottom[0]
    maps = []
    for blob in param.bottom[:2]:
        m = _IDENTITY
        while blob != inter:
            m = _compose(m, layer_map(writer[blob], offsets, fail))
            blob = writer[blob].bottom[0]
        maps.append(m)
    return _whole_shift(param, _compose(maps[1], _inv(maps[0])), fail)


def _whole_shift(param: Param, crop: Map, fail: Fail) -> tuple[int, int]:
    out = []
    for axis, (scale, shift) in zip(("height", "width"), crop):
        if not math.isclose(float(scale), 1.0, rel_tol=1e-12):
            raise fail(param, f"its bottoms' {axis}s differ in scale ({float(scale):g})")
        if shift > 0:
            raise fail(param, f"negative crop width along {axis} ({-float(shift):g})")
        if not math.isclose(float(shift), round(float(shift)), rel_tol=1e-12, abs_tol=1e-12):
            raise fail(param, f"the crop along {axis} is not whole ({-float(shift):g})")
        out.append(-round(float(shift)))
    return out[0], out[1]


class _Unaligned(Exception):
    """HED's walk found no alignment (its Caffe would stop there): BVLC's Crop stands."""


def is_bare_crop(param: Param) -> bool:
    """A two-bottom Crop without ``crop_param``: BVLC's offset 0, or HED's Crop."""
    return param.type == "Crop" and len(param.bottom) == 2 and not param.HasField("crop_param")


def _hed_offset(param: Param, layers: Sequence[Param], offsets) -> tuple[int, int] | None:
    """Where HED's CropLayer::LayerSetUp cuts a bare Crop; None where it cannot align."""
    try:
        return _offset(param, layers, offsets, lambda p, why: _Unaligned(why))
    except _Unaligned:
        return None


def _say_hed(param: Param, offset: tuple[int, int]) -> None:
    """One log line: the offsets differ from BVLC Caffe's 0, so the user is told once."""
    log.warning(
        "layer '%s' (type Crop) has no crop_param: cut at offset %s where its bottoms align, as "
        "HED's Crop does (BVLC Caffe cuts at 0: give the dialect bvlc for that)",
        param.name, list(offset),
    )  # fmt: skip


def _with_offset(param: Param, offset: tuple[int, int]) -> Param:
    param = Param.FromString(param.SerializeToString())
    param.crop_param.Clear()
    param.crop_param.axis = 2
    param.crop_param.offset.extend(offset)
    return param


def with_auto_crop_offsets(layers: Sequence[Param], fail: Fail, hed: bool = True) -> list[Param]:
    """``layers`` with each AutoCrop layer's offsets in a copy of its ``crop_param``, and
    with HED's where a bare Crop aligns elsewhere than 0 (``hed``: False when the dialect
    ``bvlc`` is given)."""
    hed = hed and any(is_bare_crop(p) for p in layers)
    if not hed and not any(p.type == "AutoCrop" for p in layers):
        return list(layers)
    out: list[Param] = []
    offsets: dict[str, tuple[int, int]] = {}
    for param in layers:
        if param.type == "Crop" and _crop_offsets(param) is not None:
            offsets[param.name] = _crop_offsets(param)  # type: ignore[assignment]
        if param.type == "AutoCrop" and len(param.bottom) == 2:
            offsets[param.name] = _offset(param, out, offsets, fail)
            param = _with_offset(param, offsets[param.name])
        elif hed and is_bare_crop(param):
            offset = _hed_offset(param, out, offsets)
            offsets[param.name] = offset or (0, 0)
            if offset and offset != (0, 0):
                _say_hed(param, offset)
                param = _with_offset(param, offset)
        out.append(param)
    return out
