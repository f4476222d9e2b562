"""One snapshot and resume record for every trainer: the solver loop (Caffe's
Solver::Snapshot / Restore) and MyCaffe's policy-gradient trainer.

A snapshot is Caffe's pair — ``<prefix>_iter_<N>.caffemodel`` (or ``.caffemodel.h5``) and
``<prefix>_iter_<N>.solverstate`` (``iter``, ``learned_net``, ``current_step``, the solver's
history), both readable by Caffe — and beside the solverstate the resume record
``….solverstate.resume.json``: what an exact resume needs and Caffe's solverstate leaves out.
JSON beside the solverstate rather than an extension field inside it, so the solverstate stays
byte for byte what Caffe writes and reads, and the record can be read by eye.

The record (:class:`ResumeRecord`, version 2) is one schema for every trainer::

    {"caffe2jax_resume": 2, "kind": "solver" | "rl", "iter": N, "seed": S,
     "keys": {name: array}, "arrays": {name: array}, "values": {name: JSON value}}

PRNG keys are stored as their key data and every array one way (``{"dtype", "shape",
"data": base64}``). The records written before the two trainers shared this one (version 1:
``caffe2jax_resume`` 1 from the solver loop, ``caffe2jax_rl_resume`` 1 from the RL trainer)
are read as the same :class:`ResumeRecord`, so their snapshots still resume exactly.

Writing is atomic file by file, in Caffe's order: the record is made first (a database that
changed under the run refuses it before anything is written), then the weights, the record,
the solver state.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from caffe2jax.frontend.errors import SolverError
from caffe2jax.runtime.formats.atomic import atomic_write
from caffe2jax.runtime.formats.solverstate import (
    SolverStateFile,
    read_solverstate,
    snapshot_name,
    write_solverstate,
)

VERSION = 2
KINDS = ("solver", "rl")


@dataclass
class ResumeRecord:
    """What a trainer needs beyond Caffe's files to go on exactly: its kind, the iteration
    and seed, PRNG keys (typed keys), arrays and plain JSON values, each by name."""

    kind: str
    iteration: int
    seed: int
    keys: dict[str, jax.Array] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """One snapshot read back: the solver state, its weights file (None when the state
    names none) and its resume record (None when it has none, e.g. one from BVLC Caffe)."""

    state: SolverStateFile
    weights: Path | None
    record: ResumeRecord | None


def resume_path(solverstate: str | Path) -> Path:
    """The record beside a snapshot: ``X.solverstate`` → ``X.solverstate.resume.json``."""
    solverstate = Path(solverstate)
    return solverstate.with_name(solverstate.name + ".resume.json")


def encode_array(array: Any) -> dict[str, Any]:
    """An array as JSON: dtype, shape and its C-order bytes in base64."""
    a = np.array(array, order="C")  # ascontiguousarray would make a 0-d array 1-d
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": base64.b64encode(a).decode()}


def decode_array(record: dict[str, Any]) -> np.ndarray:
    """The array :func:`encode_array` wrote."""
    data = base64.b64decode(record["data"])
    return np.frombuffer(data, np.dtype(record["dtype"])).reshape(record["shape"]).copy()


def _wrap_key(data: np.ndarray) -> jax.Array:
    return jax.random.wrap_key_data(np.asarray(data, np.uint32))


def record_text(record: ResumeRecord) -> str:
    """The JSON of ``record`` (version 2)."""
    keys = {k: encode_array(jax.random.key_data(v)) for k, v in record.keys.items()}
    return json.dumps({
        "caffe2jax_resume": VERSION, "kind": record.kind, "iter": record.iteration,
        "seed": record.seed, "keys": keys,
        "arrays": {k: encode_array(v) for k, v in record.arrays.items()},
        "values": record.values,
    })  # fmt: skip


def _from_solver_v1(saved: dict) -> ResumeRecord:
    """The solver loop's version-1 record: test keys as lists of their key data."""
    keys = {f"test_{i}": _wrap_key(k) for i, k in enumerate(saved["test_keys"])}
    values = {"train": saved["train"], "tests": saved["tests"]}
    return ResumeRecord("solver", int(saved["iter"]), int(saved["seed"]), keys, {}, values)


def _from_rl_v1(saved: dict) -> ResumeRecord:
    """The RL trainer's version-1 record: the run's key and lanes as encoded arrays."""
    keys = {"run": _wrap_key(decode_array(saved["key"]))}
    arrays = {k: decode_array(v) for k, v in saved["lanes"].items()}
    values = {k: saved[k] for k in ("env", "returns", "running", "steps", "seconds")}
    return ResumeRecord("rl", int(saved["iter"]), int(saved["seed"]), keys, arrays, values)


def parse_record(text: str) -> ResumeRecord:
    """A record from its JSON, any version; a ValueError (or KeyError, TypeError) for
    anything else."""
    saved = json.loads(text)
    if saved.get("caffe2jax_resume") == 1:
        return _from_solver_v1(saved)
    if saved.get("caffe2jax_rl_resume") == 1:
        return _from_rl_v1(saved)
    if saved.get("caffe2jax_resume") != VERSION or saved.get("kind") not in KINDS:
        raise ValueError("not a caffe2jax resume record")
    return ResumeRecord(
        saved["kind"], int(saved["iter"]), int(saved["seed"]),
        {k: _wrap_key(decode_array(v)) for k, v in saved["keys"].items()},
        {k: decode_array(v) for k, v in saved["arrays"].items()}, dict(saved["values"]),
    )  # fmt: skip


def write_snapshot(
    prefix: str,
    state: SolverStateFile,
    hdf5: bool,
    save_weights: Callable[[Path, str], Any],
    record: ResumeRecord,
    log: Callable[[str], None] | None = None,
) -> tuple[Path, Path]:
    """Caffe's Snapshot at ``state.iter``: the weights (``save_weights(path, format)``),
    the resume record and the solver state (``state.learned_net`` is set to the weights
    written), each atomically. ``log`` gets Caffe's two "Snapshotting …" lines."""
    weights = Path(snapshot_name(prefix, state.iter, hdf5, "caffemodel"))
    state_path = Path(snapshot_name(prefix, state.iter, hdf5, "solverstate"))
    weights.parent.mkdir(parents=True, exist_ok=True)
    text = record_text(record)
    kind = "HDF5 file" if hdf5 else "binary proto file"
    if log is not None:
        log(f"Snapshotting to {kind} {weights}")
    save_weights(weights, "hdf5" if hdf5 else "binary")
    atomic_write(resume_path(state_path), text)
    if log is not None:
        log(f"Snapshotting solver state to {kind} {state_path}")
    state = SolverStateFile(state.iter, str(weights), state.current_step, state.history)
    write_solverstate(state_path, state, hdf5)
    return weights, state_path


def _weights_of(path: Path, learned_net: str, error: type[Exception]) -> Path:
    """Caffe writes the weights beside the state (same prefix) and records the path it used,
    relative to its working directory then: look beside the state first."""
    beside = path.parent / Path(learned_net).name
    weights = beside if beside.exists() else Path(learned_net)
    if not weights.exists():
        raise error(
            f"{path}: its weights file '{learned_net}' was found neither beside "
            "it nor relative to the working directory"
        )
    return weights


def read_snapshot(path: str | Path, kind: str, error: type[Exception] = SolverError) -> Snapshot:
    """The snapshot whose solver state is ``path``, its record checked: of ``kind`` and for
    the state's iteration (``error`` raised, naming the file, otherwise)."""
    path = Path(path)
    state = read_solverstate(path)
    weights = _weights_of(path, state.learned_net, error) if state.learned_net else None
    sidecar = resume_path(path)
    if not sidecar.exists():
        return Snapshot(state, weights, None)
    try:
        record = parse_record(sidecar.read_text())
    except (ValueError, KeyError, TypeError) as err:
        raise error(f"{sidecar}: not a usable resume record ({err})") from None
    if record.kind != kind or record.iteration != state.iter:
        raise error(
            f"{sidecar}: not the {kind} resume record of iteration {state.iter} (it is the "
            f"{record.kind} record of iteration {record.iteration})"
        )
    return Snapshot(state, weights, record)
