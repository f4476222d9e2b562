"""Shape layers: Concat, Slice, Split, Flatten, Reshape, Tile, Silence, Parameter, Filter and
BatchReindex.

They move data without arithmetic, so autodiff of the forward is Caffe's backward (Split
sums its top diffs, Slice/Concat route diffs back to their pieces, BatchReindex scatter-adds).
Every configuration Caffe's ``LayerSetUp``/``Reshape`` refuses fails at compile time, naming
the blobs and shapes involved.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.lowering.registry import Context, ParamDecl, Shape, register
from caffe2jax.lowering.util import canonical_axis, count, fail

Arrays = Sequence[jax.Array]


def _describe(names: Sequence[str], arrays: Arrays) -> str:
    """``'a' [2, 3], 'b' [2, 4]``: blob names with their shapes, for error messages."""
    return ", ".join(f"'{n}' {list(a.shape)}" for n, a in zip(names, arrays))


def _refuse_in_place(layer: ir.Layer) -> None:
    """Flatten, Reshape and Split CHECK that no top is their bottom."""
    if layer.bottom_names[0] in layer.top_names:
        raise fail(layer, f"does not allow in-place computation (top '{layer.bottom_names[0]}')")


def _legacy_axis(layer: ir.Layer, p, legacy: str, ndim: int) -> int:
    """Concat/Slice axis: the legacy uint32 ``concat_dim``/``slice_dim`` (never negative), or
    ``axis`` canonicalised; giving both is refused."""
    if p.HasField(legacy):
        if p.HasField("axis"):
            raise fail(layer, f"give either axis or {legacy}, not both")
        if getattr(p, legacy) >= ndim:
            raise fail(layer, f"{legacy} {getattr(p, legacy)} is out of range for {ndim}-D input")
        return getattr(p, legacy)
    return canonical_axis(layer, p.axis, ndim)


@register("Concat", counts=(1, None, 1, 1), bf16=True)
def concat(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """ConcatLayer: join the bottoms along ``axis`` (default 1; legacy ``concat_dim``).

    All bottoms need the same number of axes and equal dims off the concat axis.
    """
    first = bottoms[0]
    axis = _legacy_axis(layer, layer.param.concat_param, "concat_dim", first.ndim)
    for b in bottoms[1:]:
        if b.ndim != first.ndim:
            raise fail(
                layer,
                "all inputs must have the same number of axes; got "
                + _describe(layer.bottom_names, bottoms),
            )
        if any(d != e for j, (d, e) in enumerate(zip(b.shape, first.shape)) if j != axis):
            raise fail(
                layer,
                f"all inputs must have the same shape except at concat axis {axis}; got "
                + _describe(layer.bottom_names, bottoms),
            )
    if len(bottoms) == 1:
        return [first]
    return [jnp.concatenate(bottoms, axis=axis)]


def _concat_on_channels(layer: ir.Layer, shapes: Sequence[Shape]) -> bool:
    p = layer.param.concat_param
    return (p.concat_dim if p.HasField("concat_dim") else p.axis) in (1, -3)


@concat.nhwc(when=_concat_on_channels)
def _(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """Concat along channels of channels-last bottoms (lowering/layout.py)."""
    return [jnp.concatenate(bottoms, axis=3)]


def _slice_sizes(layer: ir.Layer, x: jax.Array, axis: int) -> list[int]:
    """Sizes of the tops along ``axis``: between the slice_points, or an even split."""
    points = list(layer.param.slice_param.slice_point)
    n_tops, dim = len(layer.tops), x.shape[axis]
    where = f"bottom '{layer.bottom_names[0]}' {list(x.shape)} axis {axis} ({dim})"
    if not points:
        if dim % n_tops:
            raise fail(layer, f"{n_tops} tops do not evenly divide {where}")
        return [dim // n_tops] * n_tops
    if len(points) != n_tops - 1:
        raise fail(layer, f"{len(points)} slice_point(s) need {len(points) + 1} tops, got {n_tops}")
    if n_tops > dim:
        raise fail(layer, f"{n_tops} tops are more than the {dim} items of {where}")
    bounds = [0, *points, dim]
    sizes = [hi - lo for lo, hi in zip(bounds, bounds[1:])]
    if any(s <= 0 for s in sizes[:-1]) or sizes[-1] < 0:
        raise fail(layer, f"slice_point {points} must increase strictly within {where}")
    return sizes


@register("Slice", counts=(1, 1, 1, None), bf16=True)
def slice_layer(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """SliceLayer: cut the bottom along ``axis`` (default 1; legacy ``slice_dim``) at the
    ``slice_point`` list (one fewer than the tops), or into equal parts when none is given."""
    (x,) = bottoms
    axis = _legacy_axis(layer, layer.param.slice_param, "slice_dim", x.ndim)
    sizes = _slice_sizes(layer, x, axis)
    tops, start = [], 0
    for size in sizes:
        tops.append(lax.slice_in_dim(x, start, start + size, axis=axis))
        start += size
    return tops


@register("Split", counts=(1, 1, 1, None))
def split(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """SplitLayer: every top is the bottom; the bottom's diff is the sum of the top diffs."""
    _refuse_in_place(layer)
    return [bottoms[0]] * len(layer.tops)


@register("Flatten", counts=(1, 1, 1, 1), bf16=True)
def flatten(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """FlattenLayer: merge axes ``axis`` … ``end_axis`` (defaults 1 and −1) into one."""
    _refuse_in_place(layer)
    (x,) = bottoms
    p = layer.param.flatten_param
    start = canonical_axis(layer, p.axis, x.ndim)
    end = canonical_axis(layer, p.end_axis, x.ndim)
    if end + 1 < start:
        raise fail(layer, f"end_axis {p.end_axis} comes before axis {p.axis}")
    shape = x.shape[:start] + (count(x.shape, start, end + 1),) + x.shape[end + 1 :]
    return [jnp.reshape(x, shape)]


def reshape_shape(layer: ir.Layer, shape: Shape) -> Shape:
    """ReshapeLayer's top shape for a bottom of ``shape``.

    Axes ``[axis, axis + num_axes)`` of the bottom (``num_axes = −1``: through the last axis;
    a negative ``axis`` counts from the end, −1 meaning after the last axis) are replaced by
    ``reshape_param.shape``, where ``0`` copies the bottom dim at the same position and one
    ``−1`` is inferred from the total count.
    """
    p = layer.param.reshape_param
    dims = list(p.shape.dim)
    where = f"bottom '{layer.bottom_names[0]}' {list(shape)}"
    if sum(d == -1 for d in dims) > 1:
        raise fail(layer, f"shape {dims} has more than one -1 dim")
    if any(d < -1 for d in dims):
        raise fail(layer, f"shape {dims} has a dim below -1")
    ndim = len(shape)
    start = p.axis if p.axis >= 0 else ndim + p.axis + 1
    if not 0 <= start <= ndim:
        raise fail(layer, f"axis {p.axis} is out of range for {where}")
    if p.num_axes < -1:
        raise fail(layer, f"num_axes must be >= 0, or -1 for all; got {p.num_axes}")
    end = ndim if p.num_axes == -1 else start + p.num_axes
    if end > ndim:
        raise fail(layer, f"axis + num_axes = {end} is out of range for {where}")
    for i, d in enumerate(dims):
        if d == 0:
            if start + i >= ndim:
                raise fail(layer, f"shape {dims} has a 0 at {i} with no bottom axis to copy")
            dims[i] = shape[start + i]
    top = [*shape[:start], *dims, *shape[end:]]
    if -1 in dims:
        known = count([d for d in top if d != -1])
        if known == 0 or count(shape) % known:
            raise fail(
                layer, f"{where} count {count(shape)} is not divisible by the given dims {dims}"
            )
        top[start + dims.index(-1)] = count(shape) // known
    if count(top) != count(shape):
        raise fail(layer, f"top shape {top} does not hold the {count(shape)} items of {where}")
    return tuple(top)


@register("Reshape", counts=(1, 1, 1, 1), bf16=True)
def reshape(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """ReshapeLayer: the same data under a new shape (see :func:`reshape_shape`)."""
    _refuse_in_place(layer)
    (x,) = bottoms
    return [jnp.reshape(x, reshape_shape(layer, x.shape))]


@register("Tile", counts=(1, 1, 1, 1))
def tile(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """TileLayer: repeat the block of axes ``axis…`` ``tiles`` times along ``axis``
    (``[c0, c1, c0, c1]``, not ``[c0, c0, c1, c1]``); the backward sums the copies."""
    (x,) = bottoms
    p = layer.param.tile_param
    if p.tiles <= 0:
        raise fail(layer, f"tiles must be positive, got {p.tiles}")
    axis = canonical_axis(layer, p.axis, x.ndim)
    reps = [1] * x.ndim
    reps[axis] = p.tiles
    return [jnp.tile(x, reps)]


@register("Silence", counts=(1, None, 0, 0))
def silence(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """SilenceLayer: no tops; its bottoms get zero diff (they reach no loss through it)."""
    return []


@register("Parameter", counts=(0, 0, 1, 1))
def parameter(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """ParameterLayer: the top is the layer's one blob; its diff is the top's diff."""
    return [params[0]]


@parameter.param_shapes
def _(layer: ir.Layer, bottom_shapes: Sequence[Shape]) -> list[ParamDecl]:
    """One blob of ``parameter_param.shape``; Caffe fills nothing, so it starts at zero."""
    shape = tuple(int(d) for d in layer.param.parameter_param.shape.dim)
    if any(d < 0 for d in shape):
        raise fail(layer, f"parameter_param shape {list(shape)} has a negative dim")
    return [ParamDecl(shape, None)]


@register("Filter", counts=(2, None, 1, None))
def filter_layer(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """FilterLayer: keep the items (axis 0) of each data bottom whose selector (the last
    bottom) is non-zero, in order.

    Caffe reshapes the tops at run time to the number of selected items; a static-shape
    compiler cannot. Here each top keeps the bottom's full item count N (the size Caffe's own
    first Reshape gives them at net setup): the k selected items come first, in order, and
    the remaining N − k rows are zero. ``k = count(selector != 0)`` is the valid count, so
    Caffe's top is ``top[:k]``. Layers after a Filter therefore see N rows, the padding
    included; the diffs of the selected items equal Caffe's and the others get zero diff.
    The selector gets no gradient (Caffe refuses to back-propagate to it).
    """
    *data, selector = bottoms
    _check_filter(layer, data, selector)
    n = selector.shape[0]
    keep = jnp.reshape(lax.stop_gradient(selector), (n,)) != 0
    (order,) = jnp.nonzero(keep, size=n, fill_value=n)  # selected indices first, then n
    return [jnp.take(x, order, axis=0, mode="fill", fill_value=0) for x in data]


def _check_filter(layer: ir.Layer, data: Arrays, selector: jax.Array) -> None:
    """FilterLayer's Reshape checks: one top per data bottom, an (N, 1, 1…) selector and the
    same N on every data bottom."""
    if len(layer.tops) != len(data):
        raise fail(layer, f"needs one top per filtered bottom ({len(data)}), got {len(layer.tops)}")
    names = layer.bottom_names
    if selector.ndim == 0 or any(d != 1 for d in selector.shape[1:]):
        raise fail(
            layer,
            f"selector '{names[-1]}' {list(selector.shape)} must have singleton dims after "
            "the first",
        )
    for name, x in zip(names, data):
        if x.ndim == 0 or x.shape[0] != selector.shape[0]:
            raise fail(
                layer,
                f"bottom '{name}' {list(x.shape)} must have the selector's first dim "
                f"({selector.shape[0]}, from '{names[-1]}')",
            )


@register("BatchReindex", counts=(2, 2, 1, 1), no_force_backward=(1,))
def batch_reindex(
    layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context
) -> list[jax.Array]:
    """BatchReindexLayer: ``y[i] = x[int(idx[i])]`` for float indices (truncated, as Caffe's
    ``static_cast<int>``); the backward scatter-adds, so repeated indices accumulate.

    Caffe aborts on an index outside ``[0, N)``; since indices are data, here such a row is
    NaN (and sends no gradient). The indices get no gradient.
    """
    x, idx = bottoms
    if idx.ndim != 1:
        raise fail(
            layer, f"the index bottom must be 1-D; got {_describe(layer.bottom_names, bottoms)}"
        )
    idx = lax.stop_gradient(idx)
    valid = (idx >= 0) & (idx < x.shape[0])
    rows = jnp.take(x, jnp.where(valid, idx, 0).astype(jnp.int32), axis=0)
    valid = jnp.reshape(valid, valid.shape + (1,) * (x.ndim - 1))
    return [jnp.where(valid, rows, jnp.asarray(jnp.nan, x.dtype))]
