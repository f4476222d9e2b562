"""Small helpers shared by the layer families (Caffe's axis and count conventions)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import CaffeError, NetError


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


def locate(layer: ir.Layer, err: NetError) -> NetError:
    """``err`` naming the layer and, when known, its file:line (same error class)."""
    text = str(err)
    if f"layer '{layer.name}'" not in text:
        text = f"layer '{layer.name}' (type {layer.type}): {text}"
    if layer.where and not text.startswith(layer.where):
        text = layer.where + text
    located = type(err)(text)
    located.layer_name = layer.name  # which layer refused (Model's provisional builds read it)
    return located


@contextlib.contextmanager
def at_layer(layer: ir.Layer):
    """NetErrors raised while handling ``layer`` carry its name and file:line."""
    try:
        yield
    except NetError as err:
        raise locate(layer, err) from None


@contextlib.contextmanager
def applying(layer: ir.Layer, shapes: Sequence[Sequence[int]]):
    """A lowering failing on its bottoms' shapes: a NetError with file:line, layer, shapes."""
    try:
        yield
    except CaffeError as err:  # a NetError gets the layer's place; data or weights errors pass
        raise (locate(layer, err) if isinstance(err, NetError) else err) from None
    except Exception as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        given = shape_list(layer.bottom_names, shapes)
        raise fail(layer, f"cannot apply to bottom(s) {given}: {first}") from None


def shape_list(names: Sequence[str], shapes: Sequence[Sequence[int]]) -> str:
    """``'name' [dims], …`` for error messages."""
    return ", ".join(f"'{n}' {list(s)}" for n, s in zip(names, shapes))
