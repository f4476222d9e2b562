"""Host-side data sources, one per Caffe data layer type, built from the LayerParameter.

A source knows its tops' shapes before reading a batch (Caffe's ``DataLayerSetUp`` reads one
record for that), then yields float32 batches in Caffe's layout: data (N, C, H, W) and labels
(N,). Relative paths are tried against the working directory first, as Caffe does, then
against ``base_dir`` (the prototxt's folder, passed by the caller).

* ``Data`` (LMDB/LevelDB of Datums): :mod:`.data_layer`;
* ``ImageData`` (a list of image files): :mod:`.image_data`;
* ``WindowData`` (R-CNN's windows of images): :mod:`.window_data`;
* the forks' ``DenseImageData`` (SegNet/ENet), ``ImageSegData`` (DeepLab) and ``VideoData``
  (C3D): :mod:`.dense_image_data`, :mod:`.image_seg_data`, :mod:`.video_data`;
* ``HDF5Data`` and the ``HDF5Output`` sink: :mod:`.hdf5`.

Which class reads which type is lowering's one table of data layers (``DATA_LAYERS``): a new
layer type (a fork's DenseImageData, say) is a row there naming its class, an
:class:`~.base.ItemSource` whose ``_records`` walks its records and whose ``_item`` decodes
one, and the pipeline's worker threads, slots and exact resume come with it.

Every item of a batch must have the first record's shape: the graph is compiled for it (Caffe
re-shapes per batch, but also requires one shape within a batch).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.lowering.data import DATA_LAYERS, data_layers
from caffe2jax.runtime.data.base import (
    DataSource,
    ItemSource,
    check_phase,
    make_rngs,
    plain,
    positive_batch_size,
)
from caffe2jax.runtime.data.data_layer import DataLayerSource
from caffe2jax.runtime.data.image_data import ImageDataSource

# The pipeline's data layer types that have a reader (lowering.data.DATA_LAYERS).
SUPPORTED = tuple(t for t in data_layers("pipeline") if DATA_LAYERS[t].reader)

__all__ = ["SUPPORTED", "DataLayerSource", "DataSource", "ImageDataSource", "ItemSource",
           "check_phase", "make_rngs", "make_source", "plain", "positive_batch_size",
           "reader_class"]  # fmt: skip


def reader_class(layer: caffe_pb2.LayerParameter, feed: str) -> type:
    """The runtime class lowering's data-layer table (``DATA_LAYERS``) names for ``layer``,
    which must be fed as ``feed`` (``"pipeline"``, ``"memory"`` or ``"sink"``)."""
    kind = DATA_LAYERS.get(layer.type)
    readable = ", ".join(t for t in data_layers(feed) if DATA_LAYERS[t].reader)
    if kind is None or kind.feed != feed:
        what = "a data layer" if kind is None else f"a {feed} data layer"
        raise DataError(f"layer {layer.name!r}: {layer.type!r} is not {what} ({readable})")
    if kind.reader is None:
        raise DataError(
            f"layer {layer.name!r}: {layer.type} is not supported (supported data layers: "
            f"{readable}; HDF5Output and MatWrite as sinks)"
        )
    module, name = kind.reader.split(":")
    return getattr(importlib.import_module(module), name)


def make_source(
    layer: caffe_pb2.LayerParameter,
    phase: str,
    *,
    base_dir: Path | None = None,
    seed: int | None = None,
    form: str = "",
) -> DataSource:
    """The host-side source of a data layer the pipeline reads (Data, ImageData, HDF5Data…).
    ``form``: the layer's form (``ir.Layer.form``: C3D v1.0's VideoData, DeepLab v1's
    ImageSegData), given to the readers of the types that have several."""
    if layer.type in data_layers("sink"):
        raise DataError(f"layer {layer.name!r}: {layer.type} is a sink (use make_sink)")
    extra = {"form": form} if form else {}
    return reader_class(layer, "pipeline")(layer, phase, base_dir=base_dir, seed=seed, **extra)
