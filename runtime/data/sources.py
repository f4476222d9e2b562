"""Host-side data sources, one per Caffe data layer type, built from the LayerParameter.

A source knows its tops' shapes before reading a batch (Caffe's ``DataLayerSetUp`` reads one
record for that), then yields float32 batches in Caffe's layout: data (N, C, H, W) and labels
(N,). Relative paths are tried against the working directory first, as Caffe does, then
against ``base_dir`` (the prototxt's folder, passed by the caller).

* ``Data`` (LMDB/LevelDB of Datums): :mod:`.readers.data_layer`;
* ``ImageData`` (a list of image files): :mod:`.readers.image_data`;
* ``WindowData`` (R-CNN's windows of images): :mod:`.readers.window_data`;
* the forks' ``DenseImageData`` (SegNet/ENet), ``ImageSegData`` (DeepLab), ``VideoData``
  (C3D), ``AnnotatedData`` (SSD) and the built-in ``RoIData`` (py-faster-rcnn): their modules
  in :mod:`.readers`;
* ``HDF5Data`` and the ``HDF5Output`` sink: :mod:`.readers.hdf5_data`.

How a type is fed is lowering's one table of data layers (``DATA_LAYERS``); which class reads
it is the registry of :mod:`.readers` (by Caffe type string): a new layer type (a fork's
DenseImageData, say) is a row there and a registered :class:`~.base.ItemSource` whose
``_records`` walks its records and whose ``_item`` decodes one, and the pipeline's worker
threads, slots and exact resume come with it.

Every item of a batch must have the first record's shape: the graph is compiled for it (Caffe
re-shapes per batch, but also requires one shape within a batch).
"""

from __future__ import annotations

from pathlib import Path

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.lowering.registry import DATA_LAYERS, data_layers
from caffe2jax.runtime.data.base import (
    DataSource,
    ItemSource,
    check_phase,
    make_rngs,
    plain,
    positive_batch_size,
)
from caffe2jax.runtime.data.readers import reader_for
from caffe2jax.runtime.data.readers.data_layer import DataLayerSource
from caffe2jax.runtime.data.readers.image_data import ImageDataSource

# The pipeline's data layer types (lowering.registry.DATA_LAYERS) that have a reader.
SUPPORTED = tuple(t for t in data_layers("pipeline") if reader_for(t) is not None)

__all__ = ["SUPPORTED", "DataLayerSource", "DataSource", "ImageDataSource", "ItemSource",
           "check_phase", "make_rngs", "make_source", "plain", "positive_batch_size",
           "reader_class"]  # fmt: skip


def reader_class(layer: caffe_pb2.LayerParameter, feed: str) -> type:
    """The reader registered for ``layer``'s type (:mod:`.readers`), which lowering's table of
    data layers (``DATA_LAYERS``) must say is fed as ``feed`` (``"pipeline"``, ``"memory"``
    or ``"sink"``)."""
    kind = DATA_LAYERS.get(layer.type)
    readable = ", ".join(t for t in data_layers(feed) if reader_for(t) is not None)
    if kind is None or kind.feed != feed:
        what = "a data layer" if kind is None else f"a {feed} data layer"
        raise DataError(f"layer {layer.name!r}: {layer.type!r} is not {what} ({readable})")
    found = reader_for(layer.type)
    if found is None:
        raise DataError(
            f"layer {layer.name!r}: {layer.type} is not supported (supported data layers: "
            f"{readable}; HDF5Output and MatWrite as sinks)"
        )
    return found


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
