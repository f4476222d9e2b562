"""Data-type layers. Their tops are graph inputs (fed by the caller or the data pipeline),
except DummyData, which Caffe fills in the net itself.

Reproduces the top shapes of Caffe's InputLayer, MemoryDataLayer and DummyDataLayer; Data,
ImageData, HDF5Data, WindowData and the forks' DenseImageData, ImageSegData, VideoData and
AnnotatedData learn theirs from their source (the runtime's data pipeline reads one record, as
Caffe's DataLayerSetUp does).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.fillers import fill
from caffe2jax.lowering.registry import register
from caffe2jax.lowering.util import fail


@dataclass(frozen=True)
class DataLayer:
    """One of Caffe's data layer types as the whole pipeline sees it: the blob counts Caffe
    checks, who fills its tops, and the runtime class that reads (or writes) its data.

    ``feed``: ``"caller"`` (Input: the user's arrays), ``"memory"`` (MemoryData's arrays given
    to ``set_input_arrays``), ``"pipeline"`` (read from files by ``caffe2jax.runtime.data``) or
    ``"sink"`` (HDF5Output: written after each forward). ``reader`` names the runtime class as
    ``"module:Class"`` (resolved by the runtime, as Caffe's layer_factory names a creator);
    ``None`` where caffe2jax has no reader for the type yet.
    """

    counts: tuple[int, int | None, int, int | None]
    feed: str
    reader: str | None = None


_DATA = "caffe2jax.runtime.data."

# The one table of data layers: lowering registers them from it, the feeder and the source
# and sink factories (caffe2jax.runtime.data) dispatch on it.
DATA_LAYERS: dict[str, DataLayer] = {
    "Input": DataLayer((0, 0, 1, None), "caller"),
    "MemoryData": DataLayer((0, 0, 2, 2), "memory", _DATA + "feeding:MemoryData"),
    "Data": DataLayer((0, 0, 1, 2), "pipeline", _DATA + "data_layer:DataLayerSource"),
    "ImageData": DataLayer((0, 0, 2, 2), "pipeline", _DATA + "image_data:ImageDataSource"),
    "HDF5Data": DataLayer((0, 0, 1, None), "pipeline", _DATA + "hdf5:HDF5DataSource"),
    "WindowData": DataLayer((0, 0, 2, 2), "pipeline", _DATA + "window_data:WindowDataSource"),
    "HDF5Output": DataLayer((2, 2, 0, 0), "sink", _DATA + "hdf5:HDF5OutputSink"),
    # DeepLab's test-time writer of .mat files (runtime/data/mat_write.py)
    "MatWrite": DataLayer((1, None, 0, 0), "sink", _DATA + "mat_write:MatWriteSink"),
    # the forks' data layers: SegNet/ENet, DeepLab (v2's third top data_dim), C3D
    "DenseImageData": DataLayer(
        (0, 0, 2, 2), "pipeline", _DATA + "dense_image_data:DenseImageDataSource"
    ),
    "ImageSegData": DataLayer(
        (0, 0, 2, 3), "pipeline", _DATA + "image_seg_data:ImageSegDataSource"
    ),
    # VideoData: C3D needs both tops (its reader checks), SSD's (refused) has one or two
    "VideoData": DataLayer((0, 0, 1, 2), "pipeline", _DATA + "video_data:VideoDataSource"),
    # SSD's images with boxes: label (1, 1, G, 8), G fixed when the layer opens
    "AnnotatedData": DataLayer(
        (0, 0, 1, 2), "pipeline", _DATA + "annotated_data:AnnotatedDataSource"
    ),
    # caffe2jax's built-in py-faster-rcnn roi_data_layer.layer.RoIDataLayer (a Python layer
    # in the prototxt; lowering/python_layer.py gives it this type when the user's module is
    # not importable)
    "RoIData": DataLayer((0, 0, 3, 3), "pipeline", _DATA + "roi_data:RoIDataSource"),
}


def data_layers(feed: str) -> tuple[str, ...]:
    """The data layer types fed as ``feed`` says (see :class:`DataLayer`)."""
    return tuple(name for name, kind in DATA_LAYERS.items() if kind.feed == feed)


@register("Input", counts=DATA_LAYERS["Input"].counts, source=True)
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


@register("MemoryData", counts=DATA_LAYERS["MemoryData"].counts, source=True)
def memory_data(layer):
    """MemoryDataLayer: data (batch_size, channels, height, width) and label (batch_size,)."""
    p = layer.param.memory_data_param
    return [(p.batch_size, p.channels, p.height, p.width), (p.batch_size,)]


def _from_source(layer):
    return [None] * len(layer.tops)


def _video_data(layer):
    """C3D's VideoData (clips from frame folders, read by the pipeline); SSD's VideoData
    (form ``ssd``: a webcam or a video file) is refused when the net is compiled."""
    if layer.form == "ssd":
        raise fail(
            layer,
            "SSD's VideoData reads a webcam or a video file (video_type, device_id, video_file), "
            "which caffe2jax does not support; C3D's VideoData (clips listed in "
            "video_data_param.source) is",
        )
    if len(layer.tops) != 2:
        raise fail(layer, f"C3D's VideoData produces 2 tops (data, label), got {len(layer.tops)}")
    return _from_source(layer)


def _image_seg_data(layer):
    """DeepLab's ImageSegData: v2 has an optional third top (data_dim), DeepLab v1 two tops."""
    if layer.form == "deeplab-v1" and len(layer.tops) != 2:
        raise fail(layer, f"DeepLab v1's IMAGE_SEG_DATA produces 2 tops, got {len(layer.tops)}")
    return _from_source(layer)


PIPELINE_TYPES = data_layers("pipeline")
_SOURCES = {"VideoData": _video_data, "ImageSegData": _image_seg_data}

for _type in PIPELINE_TYPES:
    _fn = _SOURCES.get(_type, _from_source)
    register(_type, counts=DATA_LAYERS[_type].counts, source=True)(_fn)


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


@register("HDF5Output", counts=DATA_LAYERS["HDF5Output"].counts)
def hdf5_output(layer, params, bottoms, ctx):
    """HDF5OutputLayer: no tops and nothing computed in the graph; the runtime writes the two
    bottoms to the layer's file after each forward (caffe2jax.runtime.data.feeding.Sinks)."""
    return []


@register("MatWrite", counts=DATA_LAYERS["MatWrite"].counts)
def mat_write(layer, params, bottoms, ctx):
    """DeepLab's MatWriteLayer: no tops and nothing computed in the graph; the runtime writes
    each bottom to a .mat file after each forward (caffe2jax.runtime.data.mat_write)."""
    if not layer.param.mat_write_param.prefix:
        raise fail(layer, "mat_write_param.prefix is required")
    return []
