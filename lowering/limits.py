"""Caffe's limits on blob shapes, checked at compile time before anything is allocated.

Caffe's ``Blob::Reshape`` refuses a shape with more than ``kMaxBlobAxes`` (32) axes, a negative
dim, or a count past ``INT_MAX`` (its ``count_`` is an ``int``). Every top a layer declares or
produces, and every param blob it declares, passes the same checks here, so that no later
stage (``summary``'s text, ``time``'s memory estimate, XLA's static extents, ``init``'s
fillers) sees a shape Caffe itself would never have built.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import NetError

MAX_BLOB_AXES = 32  # Caffe's kMaxBlobAxes
INT_MAX = 2**31 - 1  # Caffe's Blob::count_ is an int
SHOWN_DIMS = 6


def show_shape(shape: Sequence[int]) -> str:
    """``[d0, d1, …]`` with long shapes and huge numbers cut to fit one line."""
    dims = [str(d) if abs(d) < 10**12 else f"{d:.3g}" for d in list(shape)[:SHOWN_DIMS]]
    text = ", ".join(dims)
    if len(shape) > SHOWN_DIMS:
        text += f", ... ({len(shape)} axes)"
    return f"[{text}]"


def shape_problem(shape: Sequence[int]) -> str:
    """What Caffe's ``Blob::Reshape`` would refuse in ``shape`` ("" when nothing)."""
    if len(shape) > MAX_BLOB_AXES:
        return f"has {len(shape)} axes, more than Caffe's {MAX_BLOB_AXES} (kMaxBlobAxes)"
    negative = [d for d in shape if d < 0]
    if negative:
        return f"has a negative dim ({negative[0]}); every dim must be >= 0"
    if 0 in shape or math.prod(shape) <= INT_MAX:
        return ""
    return f"holds {show_count(shape)} values, over Caffe's INT_MAX ({INT_MAX}); lower the dims"


def show_count(shape: Sequence[int]) -> str:
    """The count of a shape of non-negative dims, as ``1.23e+45`` whatever its size (a
    product of many dims can have thousands of digits: no float, no int-to-text of it)."""
    if 0 in shape:
        return "0"
    exponent = sum(math.log10(d) for d in shape)
    whole = math.floor(exponent)
    return f"{10 ** (exponent - whole):.3g}e+{whole:02d}"


def check_blobs(layer: ir.Layer, tops: Sequence[Sequence[int]], params: Sequence = ()) -> None:
    """Raise a NetError naming ``layer`` and the blob when one of its tops (in the order of
    ``layer.top_names``) or param declarations (``.shape``) has a shape Caffe refuses."""
    named = [(f"param blob {j}", tuple(decl.shape)) for j, decl in enumerate(params)]
    named += [(f"top '{name}'", shape) for name, shape in zip(layer.top_names, tops)]
    for what, shape in named:
        problem = shape_problem(tuple(int(d) for d in shape))
        if problem:
            raise NetError(
                f"{layer.where}layer '{layer.name}' (type {layer.type}): {what} "
                f"{show_shape(shape)} {problem}"
            )
