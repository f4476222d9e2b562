"""pycaffe's ``caffe.coord_map``: how spatial coordinates of one NetSpec top map onto another,
and ``crop`` to align them (the FCN pattern of cropping upsampled scores to the input).

A map ``(axis, a, b)`` says: coordinate ``x`` in one blob is ``a * x + b`` in the other, on
the axes from ``axis`` on (``None``: any axis). Convolution, Pooling and Im2col scale by
``1/stride`` and shift by ``(pad - (kernel - 1) / 2) / stride``; Deconvolution is the
opposite; Crop shifts by its offset; element-wise layers pass coordinates through; any other
layer stops the walk (the same rules as pycaffe).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from caffe2jax.pycaffe.net_spec import Function, Top, layers

__all__ = ["AxisMismatchException", "UndefinedMapException", "coord_map_from_to", "crop"]

PASS_THROUGH_LAYERS = frozenset(
    ["AbsVal", "BatchNorm", "Bias", "BNLL", "Dropout", "Eltwise", "ELU", "Log", "LRN", "Exp"]
    + ["MVN", "Power", "ReLU", "PReLU", "Scale", "Sigmoid", "Split", "TanH", "Threshold"]
)

Map = tuple[Any, Any, Any]
IDENTITY: Map = (None, 1, 0)


class UndefinedMapException(Exception):
    """The layer's type has no coordinate map."""


class AxisMismatchException(Exception):
    """Two maps act on different axes and cannot be composed."""


def _conv_geometry(fn: Function) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(axis, stride, effective kernel extent, pad) from a conv-like layer's keywords."""
    p = fn.params.get("convolution_param", fn.params)
    legacy = {"pad_h", "pad_w", "kernel_h", "kernel_w", "stride_h", "stride_w"} & set(p)
    if legacy:
        raise AssertionError(
            f"cropping does not support the legacy _h/_w parameters {sorted(legacy)}"
        )
    kernel = np.array(p["kernel_size"], ndmin=1)
    dilation = np.array(p.get("dilation", 1), ndmin=1)
    stride = np.array(p.get("stride", 1), ndmin=1)
    return p.get("axis", 1), stride, (kernel - 1) * dilation + 1, np.array(p.get("pad", 0), ndmin=1)


def layer_map(fn: Function) -> Map:
    """The map from ``fn``'s top coordinates to its (first) bottom's coordinates."""
    if fn.type_name in ("Convolution", "Pooling", "Im2col"):
        axis, stride, extent, pad = _conv_geometry(fn)
        return axis, 1 / stride, (pad - (extent - 1) / 2) / stride
    if fn.type_name == "Deconvolution":
        axis, stride, extent, pad = _conv_geometry(fn)
        return axis, stride, (extent - 1) / 2 - pad
    if fn.type_name in PASS_THROUGH_LAYERS:
        return IDENTITY
    if fn.type_name == "Crop":
        p = fn.params.get("crop_param", fn.params)
        offset = np.array(p.get("offset", 0), ndmin=1)
        return p.get("axis", 2) - 1, 1, -offset
    raise UndefinedMapException(fn.type_name)


def compose(first: Map, then: Map) -> Map:
    """The map ``first`` followed by ``then``."""
    ax1, a1, b1 = first
    ax2, a2, b2 = then
    if ax1 is not None and ax2 is not None and ax1 != ax2:
        raise AxisMismatchException(f"axis {ax1} vs axis {ax2}")
    return (ax2 if ax1 is None else ax1), a1 * a2, a1 * b2 + b1


def inverse(m: Map) -> Map:
    axis, a, b = m
    return axis, 1 / a, -b / a


def _bottoms(top: Top) -> tuple[Top, ...]:
    """The bottoms coordinates flow through (a Crop's reference bottom is not one)."""
    return top.fn.inputs[:1] if top.fn.type_name == "Crop" else top.fn.inputs


def _ancestors(start: Top) -> dict[Top, Map]:
    """Every top reachable backwards from ``start`` with the map from ``start`` to it."""
    maps = {start: IDENTITY}
    frontier = [start]
    while frontier:
        top = frontier.pop()
        try:
            step = layer_map(top.fn)
        except UndefinedMapException:
            continue
        for bottom in _bottoms(top):
            maps[bottom] = compose(maps[top], step)
            frontier.append(bottom)
    return maps


def coord_map_from_to(top_from: Top, top_to: Top) -> Map:
    """``(axis, a, b)`` with coordinates in ``top_to`` = ``a * x + b`` for ``x`` in
    ``top_from``, through their nearest common ancestor top."""
    from_maps = _ancestors(top_from)
    to_map = {top_to: IDENTITY}
    frontier = [top_to]
    while frontier:
        top = frontier.pop()
        if top in from_maps:
            return compose(to_map[top], inverse(from_maps[top]))
        try:
            step = layer_map(top.fn)
        except UndefinedMapException:
            continue
        for bottom in _bottoms(top):
            to_map[bottom] = compose(to_map[top], step)
            frontier.append(bottom)
    raise RuntimeError("Could not compute map between tops; are they connected by spatial layers?")


def crop(top_from: Top, top_to: Top) -> Top:
    """A Crop layer cutting ``top_from`` to ``top_to``'s extent at the offset the map gives
    (the scale must be 1 and the offset a non-negative integer; AssertionError otherwise,
    as pycaffe asserts)."""
    axis, a, b = coord_map_from_to(top_from, top_to)
    a, b = np.asarray(a), np.asarray(b)
    # pycaffe asserts these: the same exception (raised, so ``python -O`` keeps the checks)
    if not (a == 1).all():
        raise AssertionError(f"scale mismatch on crop (a = {a})")
    if not (b <= 0).all():
        raise AssertionError(f"cannot crop negative offset (b = {b})")
    if not (np.round(b) == b).all():
        raise AssertionError(f"cannot crop noninteger offset (b = {b})")
    offset = [int(v) for v in -np.round(b).astype(int)]
    return layers.Crop(top_from, top_to, crop_param=dict(axis=axis + 1, offset=offset))
