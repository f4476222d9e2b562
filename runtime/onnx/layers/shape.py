"""Shape layers in ONNX (lowering/layers/shape.py's semantics): Concat → Concat; Slice → Split at
the slice points (or evenly); Split → one Identity per top; Flatten and Reshape → Reshape to
the top shape caffe2jax inferred (Caffe's ``0`` copies and ``−1`` already resolved; a dynamic
batch axis written as −1); Tile → Tile; Parameter → its blob; Filter → the selected items
first, then zero rows up to the bottom's count (as caffe2jax's static top); BatchReindex →
Gather (NaN rows for an index outside the batch); Silence → nothing.
"""

from __future__ import annotations

from onnx import TensorProto

from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site


def _axis(p, legacy: str, ndim: int) -> int:
    return getattr(p, legacy) if p.HasField(legacy) else p.axis % ndim


@register("Concat")
def concat(site: Site) -> list[str]:
    if len(site.bottoms) == 1:
        return list(site.bottoms)
    axis = _axis(site.param.concat_param, "concat_dim", len(site.bottom_shapes[0]))
    return [site.g.op("Concat", site.bottoms, axis=axis)]


@register("Slice")
def slice_layer(site: Site) -> list[str]:
    shape = site.bottom_shapes[0]
    axis = _axis(site.param.slice_param, "slice_dim", len(shape))
    sizes = [s[axis] for s in site.top_shapes]
    if len(sizes) == 1:
        return list(site.bottoms)
    g = site.g
    outs = g.op("Split", [site.bottoms[0], g.i64(sizes)], outputs=len(sizes), axis=axis)
    return list(outs)


@register("Split")
def split(site: Site) -> list[str]:
    return [site.bottoms[0]] * len(site.tops)


@register("Flatten")
def flatten(site: Site) -> list[str]:
    p = site.param.flatten_param
    ndim = len(site.bottom_shapes[0])
    if p.axis % ndim == 1 and p.end_axis % ndim == ndim - 1 and site.batch_at(0):
        return [site.g.op("Flatten", site.bottoms, axis=1)]
    return [site.reshape_top(site.bottoms[0])]


@register("Reshape")
def reshape(site: Site) -> list[str]:
    if site.top_shapes[0] == site.bottom_shapes[0]:
        return list(site.bottoms)
    return [site.reshape_top(site.bottoms[0])]


@register("Tile")
def tile(site: Site) -> list[str]:
    p = site.param.tile_param
    shape = site.bottom_shapes[0]
    reps = [1] * len(shape)
    reps[p.axis % len(shape)] = p.tiles
    return [site.g.op("Tile", [site.bottoms[0], site.g.i64(reps)])]


@register("Silence")
def silence(site: Site) -> list[str]:
    return []


@register("Parameter")
def parameter(site: Site) -> list[str]:
    """ParameterLayer: its one blob."""
    return [site.blob(0)]


@register("Filter")
def filter_layer(site: Site) -> list[str]:
    """FilterLayer with caffe2jax's static tops: the items whose selector is non-zero first,
    in order, then zero rows (module docstring)."""
    site.static_batch("Filter keeps a data-dependent number of items")
    g = site.g
    *data, selector = site.bottoms
    n = site.bottom_shapes[-1][0]
    keep = g.op("Not", [g.op("Equal", [g.reshape(selector, [n]), g.f32(0.0)])])
    order = g.reshape(g.op("NonZero", [keep]), [-1])
    missing = g.op("Sub", [g.i64([n]), g.op("Shape", [order])])
    tops = []
    for x, shape in zip(data, site.bottom_shapes):
        rows = g.op("Gather", [x, order], axis=0)
        pads = g.op("Concat", [g.i64([0] * len(shape)), missing, g.i64([0] * (len(shape) - 1))],
                    axis=0)  # fmt: skip
        tops.append(g.op("Pad", [rows, pads]))
    return tops


@register("BatchReindex")
def batch_reindex(site: Site) -> list[str]:
    """BatchReindexLayer: ``y[i] = x[int(idx[i])]``; NaN rows where the index is outside."""
    g = site.g
    x, idx = site.bottoms
    n = site.bottom_shapes[0][0]
    valid = g.op("And", [g.op("GreaterOrEqual", [idx, g.f32(0.0)]),
                         g.op("Less", [idx, g.f32(float(n))])])  # fmt: skip
    safe = g.where(valid, g.cast(idx, TensorProto.INT64), g.i64(0))
    rows = g.op("Gather", [x, safe], axis=0)
    ndim = len(site.bottom_shapes[0])
    mask = g.unsqueeze(valid, list(range(1, ndim))) if ndim > 1 else valid
    return [g.where(mask, rows, g.f32(float("nan")))]
