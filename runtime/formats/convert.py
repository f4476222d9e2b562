"""Converting weights files between the binary and HDF5 formats.

With a net (``model``), conversion is load_weights + save_weights: the output is what Caffe
writes for that net (every layer, its parameters, shared blobs as Caffe stores them). Without
one, the file's own structure is copied: its layers in order (HDF5: name order), names, blobs
with their stored shapes and values. A binary output then holds only ``name``, ``type`` (when
the source has one) and ``blobs`` per layer, every blob copied byte for byte from a binary
source (legacy dims and ``double_data`` kept; V1/V0 containers become ``layer``); an HDF5
output gets each blob as a float32 dataset whose shape is the stored one (legacy blobs keep
their 4-D ``num, channels, height, width``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import WeightsError
from caffe2jax.frontend.forks.dialect import get
from caffe2jax.runtime.formats import caffemodel_h5 as weights_hdf5
from caffe2jax.runtime.formats.atomic import atomic_stream
from caffe2jax.runtime.formats.blobproto import (
    BVLC_LAYOUT,
    Scanner,
    WireError,
    blob_layout,
    read_blob,
)
from caffe2jax.runtime.formats.caffemodel import BlobBody, write_net
from caffe2jax.runtime.formats.weights import (
    HDF5,
    format_for,
    load_weights,
    open_caffemodel,
    save_weights,
    weights_format,
)

if TYPE_CHECKING:
    from caffe2jax.lowering.model import Model


def convert_weights(
    source: str | os.PathLike,
    dest: str | os.PathLike,
    model: Model | None = None,
    *,
    format: str | None = None,  # noqa: A002 - same option as save_weights
    dialect: str | None = None,
) -> Path:
    """Write ``source``'s weights to ``dest`` (format from ``format`` or ``dest``'s suffix).
    ``dialect``: the fork numbering of a binary ``source`` (default: the model's, else the one
    its own bytes point to)."""
    source, dest = Path(source), Path(dest)
    if model is not None:
        params, state = load_weights(source, model, dialect=dialect)
        return save_weights(dest, model, params, state, format=format)
    out_format = format_for(dest, format)
    if weights_format(source) == HDF5:
        _from_hdf5(source, dest, out_format)
    else:
        _from_binary(source, dest, out_format, get(dialect) if dialect else None)
    return dest


def _from_hdf5(source: Path, dest: Path, out_format: str) -> None:
    with weights_hdf5.open_raw(source) as layers:
        if out_format == HDF5:
            weights_hdf5.write_hdf5(
                dest, ((name, list(enumerate(g for _, g in blobs))) for name, blobs in layers)
            )
            return
        with atomic_stream(dest) as handle:
            write_net(
                handle,
                "",
                (
                    (caffe_pb2.LayerParameter(name=name), [BlobBody.floats(s, g) for s, g in blobs])
                    for name, blobs in layers
                ),
            )


def _from_binary(source: Path, dest: Path, out_format: str, dialect=None) -> None:
    with open_caffemodel(source, dialect) as (scan, name, layers):
        if out_format == HDF5:
            weights_hdf5.write_hdf5(
                dest,
                (
                    (
                        layer.name,
                        [
                            (j, _stored_values(scan, source, layer.name, j, r))
                            for j, r in enumerate(layer.blobs)
                        ],
                    )
                    for layer in layers
                ),
            )
            return
        with atomic_stream(dest) as out:
            write_net(
                out,
                name,
                (
                    (
                        caffe_pb2.LayerParameter(name=layer.name, type=layer.type),
                        [_body(scan, source, layer.name, j, r) for j, r in enumerate(layer.blobs)],
                    )
                    for layer in layers
                ),
            )


def _body(scan: Scanner, source: Path, layer: str, j: int, where: tuple[int, int]) -> BlobBody:
    """A BVLC BlobProto copied byte for byte; a C3D v1.0 (5-D legacy) one rewritten in BVLC's
    numbers (a 5-axis ``shape``), since its own numbers mean other fields in BVLC's."""
    try:
        layout = blob_layout(scan, *where)
    except WireError as err:
        raise WeightsError(f"{source}: layer '{layer}' blob {j} is corrupt: {err}") from None
    if layout == BVLC_LAYOUT:
        return BlobBody.stored(scan, *where)
    get = _stored_values(scan, source, layer, j, where)
    return BlobBody.floats(get().shape, get)


def _stored_values(scan: Scanner, source: Path, layer: str, j: int, where: tuple[int, int]):
    def get():
        try:
            raw = read_blob(scan, *where)
        except WireError as err:
            raise WeightsError(f"{source}: layer '{layer}' blob {j} is corrupt: {err}") from None
        if raw.values.size != raw.count:
            raise WeightsError(
                f"{source}: layer '{layer}' blob {j}: {raw.values.size} value(s) stored for "
                f"shape {list(raw.dims)}"
            )
        return raw.values.reshape(raw.dims)

    return get
