"""Small helpers shared by the layer families (Caffe's axis and count conventions)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import NetError


def fail(layer: ir.Layer, problem: str) -> NetError:
    """A NetError naming the layer and its type: raise it for a configuration Caffe refuses."""
    return NetError(f"{layer.where}layer '{layer.name}' (type {layer.type}): {problem}")


def canonical_axis(layer: ir.Layer, axis: int, ndim: int) -> int:
    """Caffe's Blob::CanonicalAxisIndex: negative axes count from the end; range-checked."""
    if not -ndim <= axis < ndim:
        raise fail(layer, f"axis {axis} is out of range for a {ndim}-D blob")
    return axis % ndim if ndim else 0


def count(shape: Sequence[int], start: int = 0, end: int | None = None) -> int:
    """Caffe's Blob::count(start, end): the product of dims in [start, end)."""
    return math.prod(shape[start:end])


def nchw(shape: Sequence[int]) -> tuple[int, ...]:
    """The Caffe (N, C, H, W) shape of a channels-last (N, H, W, C) blob's shape."""
    return (shape[0], shape[3], shape[1], shape[2])


# the (N, H, W) axes and the per-channel shape of a 4-D blob: NCHW, or channels-last (NHWC)
CHANNEL_AXES = {False: ((0, 2, 3), (1, -1, 1, 1)), True: ((0, 1, 2), (1, 1, 1, -1))}
