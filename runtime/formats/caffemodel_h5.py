"""Caffe's HDF5 weights (``.caffemodel.h5``): Net::ToHDF5 and Net::CopyTrainedLayersFromHDF5.

Layout (BVLC src/caffe/net.cpp, util/hdf5.cpp): a group ``data`` holding one group per layer of
the initialized net (Split layers and layers without blobs included, so possibly empty), and in
it one float32 dataset per blob named by its index, ``"0"``, ``"1"``, ... Only blobs that own
their storage are written: a blob shared from another layer (``param { name }``) is left out.
No ``diff`` group is written (``write_diff`` false, as in snapshots and ``net.save_hdf5``).

Loading visits the source layers in HDF5's name order (``H5Gget_objinfo_by_idx`` over the name
index) and copies each into the *last* net layer of that name (``layer_names_index_``). A layer
group may have fewer datasets than the target has blobs only where the missing ones are shared
ones; shapes must match exactly (``hdf5_load_nd_dataset`` with ``reshape`` false), float or
integer data is accepted and cast.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from caffe2jax.frontend.errors import WeightsError
from caffe2jax.runtime.formats import hdf5_read
from caffe2jax.runtime.formats.atomic import atomic_path
from caffe2jax.runtime.formats.blobproto import RawBlob, aligned_empty

if TYPE_CHECKING:
    from caffe2jax.runtime.formats.weights import Target

MAGIC = b"\x89HDF\r\n\x1a\n"

BlobSource = tuple[int, Callable[[], Any]]  # (dataset index, get the blob's values in shape)


def is_hdf5(path: str | os.PathLike) -> bool:
    """HDF5 by its signature: at byte 0, or after a user block (512, 1024, 2048, ... bytes)."""
    with open(path, "rb") as handle:
        if handle.read(len(MAGIC)) == MAGIC:
            return True
    return bool(h5py.is_hdf5(os.fspath(path)))


@contextmanager
def _open(path: Path) -> Iterator[h5py.Group]:
    with hdf5_read.open_hdf5(path, WeightsError, "weights") as handle:
        data = hdf5_read.child(handle, "data", path, WeightsError)
        if not isinstance(data, h5py.Group):
            raise WeightsError(f"{path}: HDF5 file without a 'data' group: not Caffe weights")
        yield data


def _layers(path: Path, data: h5py.Group) -> list[tuple[str, Any]]:
    return hdf5_read.members(data, path, WeightsError)


def _datasets(path: Path, group: Any, name: str) -> dict[int, h5py.Dataset]:
    if not isinstance(group, h5py.Group):
        raise WeightsError(f"{path}: data/{name} is not a group: not Caffe weights")
    out = {}
    for key, item in hdf5_read.members(group, path, WeightsError):
        if not (key.isdigit() and len(key) < 10 and isinstance(item, h5py.Dataset)):
            raise WeightsError(
                f"{path}: data/{name}/{key[:40]} is not a blob dataset named by index"
            )
        out[int(key)] = item
    return out


def _raw(path: Path, layer: str, index: int, dataset: h5py.Dataset, max_bytes: int) -> RawBlob:
    where = f"layer '{layer}' blob {index}"
    shape = hdf5_read.check_dataset(dataset, path, WeightsError, where, max_bytes=max_bytes)
    values = aligned_empty(math.prod(shape), dataset.dtype.newbyteorder("="))
    hdf5_read.read_dataset(dataset, path, WeightsError, where, max_bytes=max_bytes, out=values)
    return RawBlob(shape, False, values)


def copy_from_hdf5(path: Path, target: Target) -> None:
    """Net::CopyTrainedLayersFromHDF5 into ``target``."""
    with _open(path) as data:
        for name, group in _layers(path, data):
            key = target.find(name, last=True)
            if key is None:
                target.ignored(name)
                continue
            blobs = _datasets(path, group, name)
            count = target.blob_count(key)
            if len(blobs) > count:
                target.count_mismatch(key, len(blobs), "")
            for j in range(count):
                if j not in blobs:
                    if target.is_shared(key, j):
                        continue
                    target.count_mismatch(key, len(blobs), "")
                limit = math.prod(target.graph.decls[key][j].shape) * 8  # float64 at most
                target.put(key, j, _raw(path, name, j, blobs[j], limit), exact=True)


@contextmanager
def open_raw(path: Path) -> Iterator[list[tuple[str, list[tuple[tuple[int, ...], Callable]]]]]:
    """Every layer group with its blobs as ``(shape, get values)``, read when asked (for
    converting without a net). Valid inside the ``with`` block."""
    limit = hdf5_read.host_limit()
    with _open(path) as data:
        layers = []
        for name, group in _layers(path, data):
            blobs = _datasets(path, group, name)
            if sorted(blobs) != list(range(len(blobs))):
                raise WeightsError(f"{path}: layer '{name}' has blob datasets {sorted(blobs)}")
            layers.append(
                (name, [_lazy(path, name, j, blobs[j], limit) for j in range(len(blobs))])
            )
        yield layers


def _lazy(
    path: Path, name: str, j: int, dataset: h5py.Dataset, limit: int
) -> tuple[tuple[int, ...], Callable]:
    where = f"layer '{name}' blob {j}"
    shape = hdf5_read.check_dataset(dataset, path, WeightsError, where, max_bytes=limit)
    return shape, lambda: _raw(path, name, j, dataset, limit).values.reshape(shape)


def write_hdf5(path: Path, layers: Iterable[tuple[str, Sequence[BlobSource]]]) -> None:
    """Net::ToHDF5(filename, write_diff=false), written to a temporary file and renamed."""
    with atomic_path(path) as tmp, h5py.File(tmp, "w-", libver="earliest", track_order=False) as f:
        data = f.create_group("data")
        for name, blobs in layers:
            if "/" in name or name in (".", ""):
                raise WeightsError(
                    f"layer name '{name}' cannot be an HDF5 group name (Caffe's ToHDF5 "
                    "fails on it too); save these weights in the binary format"
                )
            if name in data:
                raise WeightsError(
                    f"two layers are named '{name}': Caffe's HDF5 weights cannot hold both"
                )
            group = data.create_group(name)
            for index, get in blobs:
                group.create_dataset(str(index), data=np.asarray(get(), dtype="<f4"))
