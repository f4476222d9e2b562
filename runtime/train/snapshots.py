"""Caffe's Solver::Snapshot and Solver::Restore for a :class:`~caffe2jax.runtime.train.loop.
SolverLoop`, and the resume record written beside each snapshot (what an exact resume needs
and Caffe's solverstate leaves out)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import SolverError
from caffe2jax.runtime.formats.atomic import atomic_write
from caffe2jax.runtime.formats.solverstate import (
    SolverStateFile,
    read_solverstate,
    snapshot_name,
    write_solverstate,
)
from caffe2jax.runtime.parallel.devices import is_primary
from caffe2jax.runtime.train import solvers
from caffe2jax.runtime.train.step import learnable_order, merge

if TYPE_CHECKING:
    from caffe2jax.runtime.train.loop import SolverLoop


def resume_path(solverstate: Path) -> Path:
    """The sidecar of a snapshot (``X.solverstate`` → ``X.solverstate.resume.json``): JSON
    beside the solverstate rather than an extension field inside it, so the solverstate stays
    byte-for-byte what Caffe writes and reads, and the record can be read by eye."""
    return solverstate.with_name(solverstate.name + ".resume.json")


def snapshot(loop: SolverLoop) -> tuple[Path, Path] | None:
    """Caffe's Snapshot: weights then solver state, each written atomically (one process
    writes: its params equal every other's). Where the data layers stand is taken first: a
    database that changed under the run refuses it before anything is written."""
    from caffe2jax.runtime.formats.weights import save_weights

    p = loop.param
    if not is_primary():
        return None
    if not p.snapshot_prefix:
        raise SolverError("snapshot_prefix is not set; cannot write a snapshot")
    hdf5 = p.snapshot_format == caffe_pb2.SolverParameter.HDF5
    weights = Path(snapshot_name(p.snapshot_prefix, loop.iter, hdf5, "caffemodel"))
    weights.parent.mkdir(parents=True, exist_ok=True)
    record = json.dumps(resume_record(loop))
    kind = "HDF5 file" if hdf5 else "binary proto file"
    loop.log.info(f"Snapshotting to {kind} {weights}")
    model, ts = loop.train.model, loop.ts
    save_weights(weights, model, ts.params, ts.state, format="hdf5" if hdf5 else "binary")
    history = solvers.history_blobs(ts.opt_state, learnable_order(model))
    inner = solvers.solver_state(ts.opt_state)
    state_path = Path(snapshot_name(p.snapshot_prefix, loop.iter, hdf5, "solverstate"))
    atomic_write(resume_path(state_path), record)
    loop.log.info(f"Snapshotting solver state to {kind} {state_path}")
    write_solverstate(
        state_path,
        SolverStateFile(loop.iter, str(weights), int(inner.current_step), history),
        hdf5,
    )
    return weights, state_path


def _learned_net(path: Path, learned_net: str) -> Path:
    """Caffe writes the weights beside the state (same prefix) and records the path it used,
    relative to its working directory then: look beside the state first."""
    beside = path.parent / Path(learned_net).name
    weights = beside if beside.exists() else Path(learned_net)
    if not weights.exists():
        raise SolverError(
            f"{path}: its weights file '{learned_net}' was found neither beside "
            "it nor relative to the working directory"
        )
    return weights


def restore(loop: SolverLoop, path: str | os.PathLike) -> None:
    """Caffe's Restore: iter, current_step and history; the weights from ``learned_net``."""
    from caffe2jax.runtime.formats.weights import load_weights

    path = Path(path)
    saved = read_solverstate(path)
    params, state = loop.ts.params, loop.ts.state
    model = loop.train.model
    if saved.learned_net:
        params, state = load_weights(_learned_net(path, saved.learned_net), model, params, state)
    try:
        opt_state = loop.trainer.own_buffers(solvers.state_from_history(
            loop.param, merge(params, state), saved.history, learnable_order(model),
            saved.iter, saved.current_step,
        ))  # fmt: skip
    except ValueError as err:
        raise SolverError(f"{path}: {err}") from None
    loop.ts = loop.ts.replace(params=params, state=state, opt_state=opt_state,
                              iteration=saved.iter)  # fmt: skip
    resume_from(loop, path, saved.iter)


def resume_record(loop: SolverLoop) -> dict:
    """What Caffe's solverstate leaves out and an exact resume needs: the run's seed (the
    PRNG key of every step derives from it and the iteration) and where each data layer
    of the train and test nets stands."""
    return {
        "caffe2jax_resume": 1,
        "iter": loop.iter,
        "seed": loop.seed,
        "train": loop.train.feeder.get_state(),
        "tests": [net.feeder.get_state() for net in loop.tests],
        "test_keys": [np.asarray(jax.random.key_data(n.key)).tolist() for n in loop.tests],
    }


def resume_from(loop: SolverLoop, solverstate: Path, iteration: int) -> None:
    """Apply the sidecar beside ``solverstate`` when there is one for this iteration (a
    snapshot from BVLC Caffe has none: its data layers start over, as in Caffe)."""
    sidecar = resume_path(solverstate)
    if not sidecar.exists():
        loop.log.info(f"{solverstate}: no {sidecar.name}; data layers start from the top")
        return
    try:
        saved = json.loads(sidecar.read_text())
        if saved.get("iter") != iteration:
            raise ValueError(f"it is for iteration {saved.get('iter')}, not {iteration}")
        loop.seed = int(saved["seed"])
        loop.ts = loop.ts.replace(key=jax.random.key(loop.seed))
        loop.train.feeder.set_state(saved["train"])
        for net, state, key in zip(loop.tests, saved["tests"], saved["test_keys"]):
            net.feeder.set_state(state)
            net.key = jax.random.wrap_key_data(np.asarray(key, np.uint32))
    except (ValueError, KeyError, TypeError) as err:
        raise SolverError(f"{sidecar}: not a usable resume record ({err})") from None
