"""Caffe's HDF5Data source and HDF5Output sink (layers/hdf5_data_layer.cpp,
layers/hdf5_output_layer.cpp).

HDF5Data: ``source`` is a text file naming HDF5 files (whitespace-separated). Each top reads the
dataset of the same name, converted to float32; a top's shape is ``(batch_size,) +
dataset.shape[1:]`` (so a label dataset of shape (N, 1) gives (batch, 1) and one of shape (N,)
gives (batch,)). Files are loaded whole, one at a time. Batches run across file boundaries:
after the last row of a file the next file is loaded, and after the last file the first again.
With ``shuffle``: the file order is shuffled at the start and at every pass over the list, and
the rows of each file whenever it is loaded and whenever its last row has been read. Caffe
refuses a ``transform_param`` on this layer.

HDF5Output writes its two bottoms to datasets "data" and "label" (whatever the bottoms are
called) in Caffe's legacy 4-D layout (N, C, H, W), missing trailing axes set to 1. Caffe
truncates the file when the layer is set up; this sink writes a temporary file beside it and
renames it over ``file_name`` when closed (atomic: an earlier file survives a crash). Caffe
can write only once (its second forward fails because the datasets exist); this sink appends
the rows of every later write instead.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import h5py
import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import CaffeError, DataError
from caffe2jax.runtime.data.base import (
    DataSource,
    check_phase,
    checked_batch,
    make_rngs,
    positive_batch_size,
)
from caffe2jax.runtime.data.files import parse_hdf5_list, resolve_input
from caffe2jax.runtime.data.memo import Memo
from caffe2jax.runtime.data.readers import reader
from caffe2jax.runtime.formats import hdf5_read
from caffe2jax.runtime.formats.atomic import atomic_path


def load_hdf5_tops(path: Path, names: Sequence[str]) -> list[np.ndarray]:
    """The datasets ``names`` of one file as float32 arrays with equal row counts (Caffe's
    hdf5_load_nd_dataset, checked before anything is allocated)."""
    arrays = []
    limit = hdf5_read.host_limit()
    with hdf5_read.open_hdf5(path, DataError, "HDF5Data file") as handle:
        for name in names:
            dataset = hdf5_read.child(handle, name, path, DataError)
            if not isinstance(dataset, h5py.Dataset):
                raise DataError(f"{path}: no dataset {name!r} (named by a top)")
            where = f"dataset {name!r}"
            kw = {"max_bytes": limit, "kinds": "fiub", "min_rank": 1}
            shape = hdf5_read.check_dataset(dataset, path, DataError, where, **kw)
            if math.prod(shape) * 4 > limit:  # read as float32
                raise DataError(f"{path}: {where} of shape {list(shape)} does not fit in memory")
            arrays.append(hdf5_read.read_dataset(dataset, path, DataError, where, **kw, dtype="f4"))
    rows = {a.shape[0] for a in arrays}
    if len(rows) != 1 or 0 in rows:
        raise DataError(f"{path}: datasets {list(names)} need the same, non-zero number of rows")
    return arrays


@reader("HDF5Data")
class HDF5DataSource(DataSource):
    """Caffe's ``HDF5Data`` layer."""

    STATE = ("file_order", "current_file", "rows", "current_row")
    RNGS = ("rng",)

    def __init__(
        self,
        layer: caffe_pb2.LayerParameter,
        phase: str,
        *,
        base_dir: Path | None = None,
        seed: int | None = None,
    ) -> None:
        check_phase(phase)
        if layer.HasField("transform_param"):
            raise DataError(f"layer {layer.name!r}: HDF5Data does not transform data")
        if not layer.top:
            raise DataError(f"layer {layer.name!r} (HDF5Data) needs at least 1 top")
        param = layer.hdf5_data_param
        self.name, self.tops = layer.name, list(layer.top)
        self.batch_size = positive_batch_size(param.batch_size, layer)
        self.shuffle = param.shuffle
        where = f"layer {layer.name!r}: hdf5_data_param.source"
        list_path = resolve_input(param.source, base_dir, where)
        self.files = [
            resolve_input(name, base_dir, f"{list_path}: HDF5 file", also=list_path.parent)
            for name in parse_hdf5_list(list_path)
        ]
        self.rng = make_rngs(seed, 1)[0]
        self.file_order = np.arange(len(self.files))
        if self.shuffle:
            self.file_order = self.rng.permutation(self.file_order)
        self.current_file = 0
        self.row_shapes: list[tuple[int, ...]] | None = None
        self._memo = Memo()
        self._load()

    def _load_file(self, path: Path) -> list[np.ndarray]:
        """A file's tops; small files are kept once read (:mod:`.memo`)."""
        return self._memo.get(path, lambda: load_hdf5_tops(path, self.tops))

    def _load(self) -> None:
        path = self.files[self.file_order[self.current_file]]
        self.blobs = self._load_file(path)
        shapes = [a.shape[1:] for a in self.blobs]
        if self.row_shapes is None:
            self.row_shapes = shapes
        elif shapes != self.row_shapes:
            raise DataError(f"{path}: rows of shapes {shapes}, the first file's {self.row_shapes}")
        self.rows = np.arange(self.blobs[0].shape[0])
        if self.shuffle:
            self.rows = self.rng.permutation(self.rows)
        self.current_row = 0

    def _end_of_file(self) -> None:
        """Caffe's ``Next()`` past a file's last row."""
        if len(self.files) > 1:
            self.current_file += 1
            if self.current_file == len(self.files):
                self.current_file = 0
                if self.shuffle:
                    self.file_order = self.rng.permutation(self.file_order)
            self._load()
        self.current_row = 0
        if self.shuffle:
            self.rows = self.rng.permutation(self.rows)

    def _restored(self) -> None:
        rows, current = self.rows, self.current_row
        path = self.files[self.file_order[self.current_file]]
        self.blobs = self._load_file(path)
        self.rows, self.current_row = rows, current

    def top_shapes(self) -> list[tuple[int, ...]]:
        return [(self.batch_size, *shape) for shape in self.row_shapes]

    def next_batch(self) -> list[np.ndarray]:
        out = [np.empty(shape, np.float32) for shape in checked_batch(self.name, self.top_shapes())]
        for filled, picks in self._spans():
            for top, blob in zip(out, self.blobs, strict=True):
                top[filled : filled + len(picks)] = blob[picks]
        return out

    def skip(self, batches: int = 1) -> None:
        """Move past the rows of ``batches`` batches without copying them (files are still
        loaded, and rows reshuffled, where the batches cross into them, as in Caffe)."""
        for _ in range(batches):
            for _ in self._spans():
                pass

    def _spans(self) -> Iterator[tuple[int, np.ndarray]]:
        """The (offset in the batch, row indices) runs of one batch, within one file each;
        the reader moves past each run once the caller has taken it."""
        filled = 0
        while filled < self.batch_size:
            take = min(self.batch_size - filled, len(self.rows) - self.current_row)
            yield filled, self.rows[self.current_row : self.current_row + take]
            filled += take
            self.current_row += take
            if self.current_row == len(self.rows):
                self._end_of_file()

    def close(self) -> None:
        """Files are read whole and closed at once; nothing to release."""


def legacy_shape(shape: tuple[int, ...], where: str) -> tuple[int, int, int, int]:
    """Caffe's ``Blob::LegacyShape``: (num, channels, height, width), missing axes 1."""
    if not 1 <= len(shape) <= 4:
        raise DataError(f"{where}: cannot write a {len(shape)}-D blob in the legacy 4-D form")
    return tuple(shape) + (1,) * (4 - len(shape))  # type: ignore[return-value]


@reader("HDF5Output")
class HDF5OutputSink:
    """Caffe's ``HDF5Output`` layer: writes (data, label) batches to an HDF5 file."""

    DATASETS = ("data", "label")

    def __init__(self, layer: caffe_pb2.LayerParameter, *, out_dir: Path | None = None) -> None:
        if len(layer.bottom) != 2:
            raise DataError(f"layer {layer.name!r} (HDF5Output) needs exactly 2 bottoms")
        name = layer.hdf5_output_param.file_name
        if not name:
            raise DataError(f"layer {layer.name!r}: hdf5_output_param.file_name is empty")
        path = Path(name)
        self.path = path if path.is_absolute() or out_dir is None else Path(out_dir) / path
        # Written beside the target and renamed over it on close: a reader never sees a
        # half-written file and an interrupted run leaves any earlier file intact.
        self._stack = contextlib.ExitStack()
        try:
            tmp = self._stack.enter_context(atomic_path(self.path))
            self._file = h5py.File(tmp, "w-")
        except (OSError, CaffeError) as err:
            self._stack.close()
            raise DataError(f"{self.path}: cannot create HDF5 file ({err})") from None

    def write(self, batch: Sequence[np.ndarray]) -> None:
        """Append one (data, label) batch."""
        if len(batch) != 2:
            raise DataError(f"{self.path}: HDF5Output writes 2 blobs (data, label)")
        arrays = [np.asarray(b, dtype=np.float32) for b in batch]
        if arrays[0].shape[0] != arrays[1].shape[0]:
            raise DataError(f"{self.path}: data blob and label blob must have the same batch size")
        for name, array in zip(self.DATASETS, arrays, strict=True):
            array = array.reshape(legacy_shape(array.shape, str(self.path)))
            if name not in self._file:
                self._file.create_dataset(
                    name, data=array, maxshape=(None, *array.shape[1:]), chunks=True
                )
                continue
            dataset = self._file[name]
            if dataset.shape[1:] != array.shape[1:]:
                raise DataError(
                    f"{self.path}: {name} rows {array.shape[1:]}, file has {dataset.shape[1:]}"
                )
            start = dataset.shape[0]
            dataset.resize(start + array.shape[0], axis=0)
            dataset[start:] = array
        self._file.flush()

    def close(self) -> None:
        """Close the file and move it into place (idempotent)."""
        if self._file.id.valid:
            self._file.close()
        self._stack.close()

    def __enter__(self) -> HDF5OutputSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_sink(layer: caffe_pb2.LayerParameter, *, out_dir: Path | None = None) -> HDF5OutputSink:
    """The sink of an HDF5Output layer; a relative ``file_name`` is written under ``out_dir``
    (default: the working directory, as Caffe)."""
    from caffe2jax.runtime.data.sources import reader_class

    return reader_class(layer, "sink")(layer, out_dir=out_dir)
