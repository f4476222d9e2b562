"""The one way caffe2jax reads HDF5 files: validate before allocating, one-line errors.

Caffe reads HDF5 through ``hdf5_load_nd_dataset`` (util/hdf5.cpp), which checks rank and
dtype class and then allocates whatever the file declares. Here every dataset is checked
*before* anything is allocated:

* its declared size (shape × itemsize) against a caller's limit (derived from the net's
  declared shapes where there is a net, else from the memory available);
* the ratio of declared to stored bytes (a few KB of gzip must not become gigabytes) and, for
  contiguous storage, that the file really holds the declared bytes;
* its dtype class and rank.

Soft links, external links, external raw storage and virtual datasets are refused (Caffe's
files never use them; following them reads files the user did not name). Every h5py/HDF5
failure becomes the caller's :class:`~caffe2jax.frontend.errors.CaffeError` subclass with one line
naming the file and the object (layer/blob) being read.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np

from caffe2jax.frontend.errors import CaffeError
from caffe2jax.runtime.host.memory import available_memory

# Declared bytes per stored byte. Trained float weights hardly compress (~1.1:1); a blob of
# over 1 MiB expanding 256-fold is a compression bomb or space the file never wrote (chunks
# left to the fill value), not weights.
MAX_RATIO = 256
# Small datasets are never refused for their ratio (an all-zero bias compresses to nothing).
RATIO_FLOOR = 1 << 20
MAX_RANK = 32
_H5_ERRORS = (OSError, RuntimeError, KeyError, TypeError, ValueError, AttributeError)


def short(err: BaseException, limit: int = 120) -> str:
    """An exception's text on one line, cut to ``limit`` characters."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def hdf5_errors(path: Path, error: type[CaffeError], where: str = "") -> Iterator[None]:
    """Turn any h5py/HDF5 failure inside the block into ``error`` naming file and object."""
    try:
        yield
    except CaffeError:
        raise
    except _H5_ERRORS as err:
        at = f" {where}" if where else ""
        raise error(f"{path}:{at} unreadable HDF5 ({short(err)})") from None


@contextlib.contextmanager
def open_hdf5(path: str | os.PathLike, error: type[CaffeError], what: str) -> Iterator[h5py.File]:
    """Open ``path`` read-only; any failure (also while the block runs) is one ``error`` line."""
    path = Path(path)
    with hdf5_errors(path, error):
        try:
            handle = h5py.File(path, "r")
        except FileNotFoundError:
            raise error(f"{path}: no such file") from None
        except _H5_ERRORS as err:
            raise error(f"{path}: cannot read {what} as HDF5 ({short(err)})") from None
        with handle:
            yield handle


def child(group: h5py.Group, name: str, path: Path, error: type[CaffeError]):
    """``group[name]`` through a hard link only (soft and external links are refused);
    ``None`` when there is no such member."""
    where = f"{group.name.rstrip('/')}/{name}"
    with hdf5_errors(path, error, where):
        link = group.get(name, getlink=True)
        if link is None:
            return None
        if not isinstance(link, h5py.HardLink):
            kind = "an external" if isinstance(link, h5py.ExternalLink) else "a soft"
            raise error(f"{path}: {where} is {kind} link; links are not followed")
        return group[name]


def members(group: h5py.Group, path: Path, error: type[CaffeError]) -> list[tuple[str, object]]:
    """``(name, object)`` for every member, in byte order of the names (HDF5's name index)."""
    with hdf5_errors(path, error, group.name):
        names = sorted(group.keys(), key=lambda s: s.encode("utf-8", "surrogateescape"))
    return [(name, child(group, name, path, error)) for name in names]


def check_dataset(
    dataset: h5py.Dataset,
    path: Path,
    error: type[CaffeError],
    where: str,
    *,
    max_bytes: int,
    kinds: str = "fiu",
    min_rank: int = 0,
) -> tuple[int, ...]:
    """The dataset's shape, after checking dtype, rank, storage and declared size."""
    with hdf5_errors(path, error, where):
        if not isinstance(dataset, h5py.Dataset):
            raise error(f"{path}: {where} is not a dataset")
        dtype, shape = dataset.dtype, tuple(int(d) for d in dataset.shape or ())
        if dtype.kind not in kinds or dtype.subdtype is not None or dtype.names:
            raise error(f"{path}: {where} holds {str(dtype)[:40]}, not numbers")
        if not min_rank <= len(shape) <= MAX_RANK:
            raise error(f"{path}: {where} has {len(shape)} axes ({min_rank} to {MAX_RANK} read)")
        if dataset.external or dataset.is_virtual:
            raise error(f"{path}: {where} keeps its data in other files; not read")
        declared = math.prod(shape) * dtype.itemsize
        if declared > max_bytes:
            raise error(
                f"{path}: {where} declares shape {list(shape)} ({declared} bytes), more than "
                f"the {max_bytes} bytes allowed"
            )
        _check_storage(dataset, declared, path, error, where)
    return shape


def _check_storage(dataset, declared: int, path: Path, error, where: str) -> None:
    stored = dataset.id.get_storage_size()
    if declared > RATIO_FLOOR and declared > MAX_RATIO * stored:
        raise error(
            f"{path}: {where} declares {declared} bytes but stores {stored}: refusing to expand it"
        )
    if dataset.chunks is None and declared:
        offset = dataset.id.get_offset()
        if offset is not None and offset + declared > os.path.getsize(path):
            raise error(f"{path}: {where} declares {declared} bytes past the end of the file")


def read_dataset(
    dataset: h5py.Dataset,
    path: Path,
    error: type[CaffeError],
    where: str,
    *,
    max_bytes: int,
    kinds: str = "fiu",
    min_rank: int = 0,
    dtype: np.dtype | str | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The dataset's values in its shape (native byte order, then cast to ``dtype`` if given),
    checked first; read into ``out`` (1-D, native dtype, right size) when given."""
    shape = check_dataset(
        dataset, path, error, where, max_bytes=max_bytes, kinds=kinds, min_rank=min_rank
    )
    with hdf5_errors(path, error, where):
        native = dataset.dtype.newbyteorder("=")
        values = out if out is not None else np.empty(math.prod(shape), native)
        if values.size:
            dataset.read_direct(values.reshape(shape))
        values = values.reshape(shape)
        return values if dtype is None else values.astype(dtype, copy=False)


def host_limit(itemsize: int = 8) -> int:
    """A per-dataset limit where no net tells the size: what memory can hold now."""
    return max(available_memory() // 2, itemsize)
