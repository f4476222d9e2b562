"""Feeding a net's data layers on the host: MemoryData arrays and the data pipeline's sources.

Input layers are fed by the caller. MemoryData takes ``batch_size`` rows per forward from the
arrays given to ``set_input_arrays``, wrapping, as Caffe's MemoryDataLayer::Reset/Forward do.
Data, ImageData, HDF5Data and WindowData read through ``caffe2jax.runtime.data``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import DataError
from caffe2jax.lowering.registry import DATA_LAYERS, data_layers
from caffe2jax.runtime.data.readers import reader_for
from caffe2jax.runtime.data.readers.memory_data import MemoryData


def open_source(
    layer: ir.Layer, phase: str, base_dir: Path | None = None, seed: int | None = None
) -> object | None:
    """The host-side source of ``layer`` if the host feeds it (lowering's ``DATA_LAYERS``:
    MemoryData, or a type the pipeline reads), else None (Input and non-data layers)."""
    kind = DATA_LAYERS.get(layer.type)
    if kind is None or kind.feed not in ("memory", "pipeline"):
        return None
    if kind.feed == "memory":
        return reader_for(layer.type)(layer)
    from caffe2jax.runtime.data.sources import make_source

    return make_source(layer.param, phase, base_dir=base_dir, seed=seed, form=layer.form)


def source_shapes(net: ir.Net, base_dir: Path) -> tuple[dict, str]:
    """Shapes the net's data layers declare by reading their sources, as Caffe does at setup;
    ``({}, reason)`` when a source cannot be opened here. No prefetching starts (a huge
    declared batch is reported by the size check, never read)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in net.layers:
        try:
            source = open_source(layer, net.phase, base_dir)
        except DataError as err:
            return {}, str(err)
        if source is None:
            continue
        try:
            shapes.update(zip(layer.top_names, source.top_shapes()))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
    return shapes, ""


class Feeder:
    """All host-fed data layers of one net: shapes for compiling, batches for each forward.

    ``workers``: the worker threads decoding and transforming each data layer's items
    (default: :func:`~caffe2jax.runtime.data.workers.default_workers`, the cores this
    process may use; 0: in the prefetch thread)."""

    def __init__(self, net: ir.Net, base_dir: Path | None = None, seed: int | None = None,
                 workers: int | None = None):  # fmt: skip
        from caffe2jax.runtime.data.workers import default_workers

        self.workers = default_workers() if workers is None else workers
        self.sources: dict[str, object] = {}
        self.layers: dict[str, ir.Layer] = {}
        for layer in net.layers:
            source = open_source(layer, net.phase, base_dir, seed)
            if source is None:
                continue
            if not isinstance(source, MemoryData):
                from caffe2jax.runtime.data.prefetch import Prefetcher, prefetch_depth
                from caffe2jax.runtime.host.memory import check_batches_fit

                depth = prefetch_depth(layer.param)
                try:
                    check_batches_fit(layer.name, layer.top_names, source.top_shapes(), depth + 2)
                except DataError:
                    source.close()
                    raise
                # Caffe's prefetch thread: batches are read, decoded, transformed and copied
                # to the device while the previous step computes.
                source = Prefetcher(source, depth, to_device=True, workers=self.workers)
            self.sources[layer.name] = source
            self.layers[layer.name] = layer

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {}
        for name, source in self.sources.items():
            shapes.update(zip(self.layers[name].top_names, source.top_shapes()))
        return shapes

    def next_batches(self) -> dict[str, np.ndarray]:
        batches = {}
        for name, source in self.sources.items():
            batches.update(zip(self.layers[name].top_names, source.next_batch()))
        return batches

    def padded_alike(self, passes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The iter_size passes' inputs with each data layer's tops at one shape, the largest
        of the passes' (:meth:`~caffe2jax.runtime.data.base.DataSource.pad_to`: AnnotatedData
        sizes its label per batch), so that the passes share one compiled step."""
        if len(passes) < 2:
            return passes
        passes = [dict(p) for p in passes]
        for name, source in self.sources.items():
            tops = [t for t in self.layers[name].top_names if t in passes[0]]
            pad = getattr(source, "pad_to", None)
            if pad is None or len(tops) != len(self.layers[name].top_names):
                continue
            shapes = [tuple(np.max([np.shape(p[t]) for p in passes], axis=0)) for t in tops]
            for p in passes:
                p.update(zip(tops, pad([p[t] for t in tops], shapes), strict=True))
        return passes

    def stats(self) -> dict[str, float]:
        """The pipeline's seconds per stage (plan, decode, transform, put on the device) and
        ``waited_s``, how long the net waited for its batches (input-bound time), summed
        over the data layers, with the batches and items read."""
        total: dict[str, float] = {}
        for source in self.sources.values():
            stats = getattr(source, "stats", None)
            for name, value in stats.as_dict().items() if stats is not None else ():
                total[name] = total.get(name, 0) + value
        return total

    def get_state(self) -> dict[str, dict]:
        """Where every data layer stands (for exact resume), by layer name."""
        from caffe2jax.runtime.data.sources import plain

        return {name: plain(source.get_state()) for name, source in self.sources.items()}

    def set_state(self, states: dict[str, dict]) -> None:
        for name, state in states.items():
            if name in self.sources:
                self.sources[name].set_state(state)

    def memory_layers(self) -> list[MemoryData]:
        return [s for s in self.sources.values() if isinstance(s, MemoryData)]

    def set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        layers = self.memory_layers()
        if not layers:
            raise DataError("set_input_arrays needs a MemoryData layer; this net has none")
        layers[0].reset(data, labels)

    def close(self) -> None:
        for source in self.sources.values():
            close = getattr(source, "close", None)
            if close is not None:
                close()


class Sinks:
    """HDF5Output and MatWrite layers: after each forward, their bottoms are written to their
    files."""

    def __init__(self, net: ir.Net, out_dir: Path | None = None):
        sinks = data_layers("sink")
        self.layers = [layer for layer in net.layers if layer.type in sinks]
        self._sinks: dict[str, object] = {}
        self._out_dir = out_dir

    def write(self, blobs: dict[str, object]) -> None:
        if not self.layers:
            return
        from caffe2jax.runtime.data.readers.hdf5_data import make_sink

        for layer in self.layers:
            if layer.name not in self._sinks:
                self._sinks[layer.name] = make_sink(layer.param, out_dir=self._out_dir)
            self._sinks[layer.name].write([np.asarray(blobs[b]) for b in layer.bottoms])

    def close(self) -> None:
        for sink in self._sinks.values():
            sink.close()
        self._sinks.clear()
