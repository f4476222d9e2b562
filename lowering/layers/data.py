"""Caffe's data layers. Their tops are graph inputs (fed by the caller or the data pipeline),
except DummyData, which Caffe fills in the net itself.

Reproduces the top shapes of Caffe's InputLayer, MemoryDataLayer and DummyDataLayer; Data,
ImageData, HDF5Data and WindowData learn theirs from their source (the runtime's data pipeline
reads one record, as Caffe's DataLayerSetUp does). Each registers how it is fed (``feed=``:
lowering/registry.py ``DATA_LAYERS``, the one table the runtime's feeder dispatches on; the
runtime registers the class that reads a type under the same type string); the forks' data
layers register theirs in their own modules (lowering/forks/).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.fillers import fill
from caffe2jax.lowering.registry import register


@register("Input", counts=(0, 0, 1, None), source=True, feed="caller")
def input_layer(layer):
    """InputLayer: one ``shape`` for every top, or one per top."""
    shapes = [tuple(s.dim) for s in layer.param.input_param.shape]
    n = len(layer.tops)
    if len(shapes) not in (0, 1, n):
        raise NetError(
            f"layer '{layer.name}' (type Input): give one input_param shape, or one per top "
            f"({n}); got {len(shapes)}"
        )
    if len(shapes) == 1:
        return shapes * n
    return shapes or [None] * n


@register(
    "MemoryData",
    counts=(0, 0, 2, 2),
    source=True,
    feed="memory",
)
def memory_data(layer):
    """MemoryDataLayer: data (batch_size, channels, height, width) and label (batch_size,)."""
    p = layer.param.memory_data_param
    return [(p.batch_size, p.channels, p.height, p.width), (p.batch_size,)]


def from_source(layer):
    """A pipeline data layer's tops: shapes only its source can tell (the runtime reads one
    record when the net opens, as Caffe's DataLayerSetUp does)."""
    return [None] * len(layer.tops)


#: BVLC's pipeline data layers: type -> counts
_PIPELINE = {
    "Data": (0, 0, 1, 2),
    "ImageData": (0, 0, 2, 2),
    "HDF5Data": (0, 0, 1, None),
    "WindowData": (0, 0, 2, 2),
}
for _type, _counts in _PIPELINE.items():
    register(_type, counts=_counts, source=True, feed="pipeline")(from_source)


def _dummy_shapes(layer) -> list[tuple[int, ...]]:
    p = layer.param.dummy_data_param
    n = len(layer.tops)
    if p.shape:
        if len(p.shape) not in (1, n):
            raise NetError(f"layer '{layer.name}' (type DummyData): give 1 or {n} shapes")
        shapes = [tuple(s.dim) for s in p.shape]
        return shapes * n if len(shapes) == 1 else shapes
    legacy = [p.num, p.channels, p.height, p.width]
    if any(len(v) not in (1, n) for v in legacy):
        raise NetError(
            f"layer '{layer.name}' (type DummyData): num/channels/height/width need 1 or {n} "
            "values each"
        )
    return [tuple(int(v[i if len(v) > 1 else 0]) for v in legacy) for i in range(n)]


@register("DummyData", counts=(0, 0, 1, None))
def dummy_data(layer, params, bottoms, ctx):
    """DummyDataLayer: each top from its filler (constant 0 by default).

    Caffe fills constant tops once and refills the others on every forward; here a random
    filler draws from this layer's key on every forward.
    """
    p = layer.param.dummy_data_param
    shapes = _dummy_shapes(layer)
    fillers = list(p.data_filler)
    if len(fillers) not in (0, 1, len(shapes)):
        raise NetError(f"layer '{layer.name}' (type DummyData): give 0, 1 or one filler per top")
    tops = []
    for i, shape in enumerate(shapes):
        filler = fillers[i if len(fillers) > 1 else 0] if fillers else None
        if filler is None or filler.type == "constant":
            value = filler.value if filler is not None else 0.0
            tops.append(jnp.full(shape, value, ctx.dtype))
        else:
            tops.append(fill(filler, shape, jax.random.fold_in(ctx.key(), i), ctx.dtype))
    return tops


@register("HDF5Output", counts=(2, 2, 0, 0), feed="sink")
def hdf5_output(layer, params, bottoms, ctx):
    """HDF5OutputLayer: no tops and nothing computed in the graph; the runtime writes the two
    bottoms to the layer's file after each forward (caffe2jax.runtime.data.feeding.Sinks)."""
    return []
