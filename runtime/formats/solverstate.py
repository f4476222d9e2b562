"""Caffe's .solverstate files (binary SolverState or HDF5), written atomically.

Reproduces SGDSolver::SnapshotSolverStateToBinaryProto / ToHDF5 and RestoreSolverStateFrom*:
``iter``, ``learned_net`` (the weights file name as written), ``current_step`` and the history
blobs in the learnable-param order (two sets for AdaDelta and Adam).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import WeightsError
from caffe2jax.runtime.formats import hdf5_read
from caffe2jax.runtime.formats.atomic import atomic_path, atomic_write
from caffe2jax.runtime.formats.paths import (
    PSEUDO_FILESYSTEMS,
    existing_ancestor,
    filesystem_of,
    name_problem,
    short,
)

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
INT_MAX = 2**31 - 1


@dataclass
class SolverStateFile:
    iter: int
    learned_net: str
    current_step: int
    history: list[np.ndarray]


def snapshot_name(prefix: str, iteration: int, hdf5: bool, kind: str) -> str:
    """Caffe's SnapshotFilename: ``<prefix>_iter_<N>.<caffemodel|solverstate>[.h5]``."""
    return f"{prefix}_iter_{iteration}.{kind}" + (".h5" if hdf5 else "")


def _blob(array: np.ndarray) -> caffe_pb2.BlobProto:
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend(int(d) for d in array.shape)
    blob.data.extend(np.asarray(array, np.float32).ravel().tolist())
    return blob


def _array(blob: caffe_pb2.BlobProto, path: Path, index: int) -> np.ndarray:
    """Blob::FromProto for a history blob: its count must equal its shape's count."""
    if blob.HasField("shape"):
        shape = tuple(blob.shape.dim)
    else:
        shape = tuple(d for d in (blob.num, blob.channels, blob.height, blob.width))
    values = blob.double_data if len(blob.double_data) else blob.data
    if any(d < 0 for d in shape) or math.prod(shape) != len(values):
        dims = list(shape)[:8]
        raise WeightsError(
            f"{path}: history blob {index}: {len(values)} value(s) stored for shape {dims}"
        )
    return np.asarray(values, np.float32).reshape(shape)


def write_solverstate(path: str | os.PathLike, state: SolverStateFile, hdf5: bool) -> Path:
    """Write ``state`` to ``path`` atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    if not hdf5:
        msg = caffe_pb2.SolverState(
            iter=state.iter, learned_net=state.learned_net, current_step=state.current_step
        )
        msg.history.extend(_blob(h) for h in state.history)
        return atomic_write(path, msg.SerializeToString())
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("iter", data=np.array([state.iter], np.int32))
        f.create_dataset("learned_net", data=np.bytes_(state.learned_net.encode()))
        f.create_dataset("current_step", data=np.array([state.current_step], np.int32))
        group = f.create_group("history")
        for i, h in enumerate(state.history):
            group.create_dataset(str(i), data=np.asarray(h, np.float32))
    return path


def read_solverstate(path: str | os.PathLike, max_bytes: int | None = None) -> SolverStateFile:
    """Read a binary or HDF5 solverstate (Caffe's or ours); the format is told by magic bytes.
    ``max_bytes`` bounds each HDF5 history blob (default: what memory can hold)."""
    path = Path(path)
    try:
        head = path.open("rb").read(8)
    except OSError as err:
        raise WeightsError(f"{path}: cannot read solver state ({err.strerror})") from None
    if head == HDF5_MAGIC:
        return _read_hdf5(path, hdf5_read.host_limit() if max_bytes is None else max_bytes)
    msg = caffe_pb2.SolverState()
    try:
        msg.ParseFromString(path.read_bytes())
    except Exception as err:
        raise WeightsError(f"{path}: not a SolverState ({hdf5_read.short(err)})") from None
    if not msg.HasField("iter"):
        raise WeightsError(f"{path}: not a SolverState (no iteration recorded)")
    history = [_array(b, path, i) for i, b in enumerate(msg.history)]
    return _checked(SolverStateFile(msg.iter, _learned_net(msg, path), msg.current_step, history),
                    path)  # fmt: skip


def _checked(state: SolverStateFile, path: Path) -> SolverStateFile:
    """Caffe's counters are ints: an ``iter`` or ``current_step`` outside 0..INT_MAX is not one
    a solver wrote (Caffe would wrap around or train toward 2^31 iterations)."""
    for name in ("iter", "current_step"):
        value = getattr(state, name)
        if not 0 <= value <= INT_MAX:
            raise WeightsError(f"{path}: {name} {value} is outside 0..{INT_MAX}; not a snapshot")
    problem = name_problem(state.learned_net)
    if not problem and state.learned_net:
        kind = filesystem_of(existing_ancestor(Path(state.learned_net).parent))
        problem = f"is on a {kind} file system" if kind in PSEUDO_FILESYSTEMS else ""
    if problem:
        raise WeightsError(f"{path}: learned_net {short(state.learned_net)!r}: {problem}")
    return state


def _learned_net(msg: caffe_pb2.SolverState, path: Path) -> str:
    """``learned_net`` as text; protobuf may hand back bytes for a field that is not UTF-8."""
    try:
        value = msg.learned_net
    except (TypeError, ValueError, UnicodeDecodeError):
        raise WeightsError(f"{path}: learned_net is not UTF-8 text") from None
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise WeightsError(f"{path}: learned_net is not UTF-8 text") from None
    return value


def _read_hdf5(path: Path, max_bytes: int) -> SolverStateFile:
    """SGDSolver::RestoreSolverStateFromHDF5, through the checked HDF5 reader."""
    err = WeightsError
    with hdf5_read.open_hdf5(path, err, "solver state") as f:
        history = hdf5_read.child(f, "history", path, err)
        if not isinstance(history, h5py.Group):
            raise err(f"{path}: HDF5 solver state lacks the 'history' group")
        blobs = []
        for i in range(len(history)):
            item = hdf5_read.child(history, str(i), path, err)
            if item is None:
                raise err(f"{path}: HDF5 solver state lacks history/{i}")
            where = f"history blob {i}"
            blobs.append(
                hdf5_read.read_dataset(item, path, err, where, max_bytes=max_bytes, dtype="f4")
            )
        state = SolverStateFile(
            _scalar(f, "iter", path, required=True),
            _learned_hdf5(f, path),
            _scalar(f, "current_step", path, required=False),
            blobs,
        )
    return _checked(state, path)


def _scalar(f: h5py.File, name: str, path: Path, *, required: bool) -> int:
    item = hdf5_read.child(f, name, path, WeightsError)
    if item is None:
        if required:
            raise WeightsError(f"{path}: HDF5 solver state lacks '{name}'")
        return 0
    values = hdf5_read.read_dataset(item, path, WeightsError, name, max_bytes=64, kinds="iu")
    if values.size != 1:
        raise WeightsError(f"{path}: '{name}' holds {values.size} values, not 1")
    return int(values.ravel()[0])


def _learned_hdf5(f: h5py.File, path: Path) -> str:
    item = hdf5_read.child(f, "learned_net", path, WeightsError)
    if item is None:
        return ""
    with hdf5_read.hdf5_errors(path, WeightsError, "learned_net"):
        if not isinstance(item, h5py.Dataset) or item.dtype.kind not in "SO" or item.shape != ():
            raise WeightsError(f"{path}: learned_net is not a string")
        value = item[()]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise WeightsError(f"{path}: learned_net is not UTF-8 text") from None
    if not isinstance(value, str):
        raise WeightsError(f"{path}: learned_net is not a string")
    return value
