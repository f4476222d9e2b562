"""Caffe's .solverstate files (binary SolverState or HDF5), written atomically.

Reproduces SGDSolver::SnapshotSolverStateToBinaryProto / ToHDF5 and RestoreSolverStateFrom*:
``iter``, ``learned_net`` (the weights file name as written), ``current_step`` and the history
blobs in the learnable-param order (two sets for AdaDelta and Adam).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from caffe2jax.errors import WeightsError
from caffe2jax.fileio import atomic_path, atomic_write
from caffe2jax.frontend import caffe_pb2

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


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


def _array(blob: caffe_pb2.BlobProto) -> np.ndarray:
    if blob.HasField("shape"):
        shape = tuple(blob.shape.dim)
    else:
        shape = tuple(d for d in (blob.num, blob.channels, blob.height, blob.width))
    values = blob.double_data if len(blob.double_data) else blob.data
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


def read_solverstate(path: str | os.PathLike) -> SolverStateFile:
    """Read a binary or HDF5 solverstate (Caffe's or ours); the format is told by magic bytes."""
    path = Path(path)
    try:
        head = path.open("rb").read(8)
    except OSError as err:
        raise WeightsError(f"{path}: cannot read solver state ({err.strerror})") from None
    if head == HDF5_MAGIC:
        return _read_hdf5(path)
    msg = caffe_pb2.SolverState()
    try:
        msg.ParseFromString(path.read_bytes())
    except Exception as err:
        raise WeightsError(f"{path}: not a SolverState ({err})") from None
    if not msg.HasField("iter"):
        raise WeightsError(f"{path}: not a SolverState (no iteration recorded)")
    return SolverStateFile(
        msg.iter, msg.learned_net, msg.current_step, [_array(b) for b in msg.history]
    )


def _read_hdf5(path: Path) -> SolverStateFile:
    try:
        with h5py.File(path, "r") as f:
            history = f["history"]
            blobs = [np.asarray(history[str(i)], np.float32) for i in range(len(history))]
            learned = f["learned_net"][()] if "learned_net" in f else b""
            return SolverStateFile(
                int(np.asarray(f["iter"]).ravel()[0]),
                learned.decode() if isinstance(learned, bytes) else str(learned),
                int(np.asarray(f["current_step"]).ravel()[0]) if "current_step" in f else 0,
                blobs,
            )
    except KeyError as err:
        raise WeightsError(f"{path}: HDF5 solver state lacks {err}") from None
