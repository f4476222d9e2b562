"""Caffe's Solver::Snapshot and Solver::Restore for a :class:`~caffe2jax.runtime.train.loop.
SolverLoop`, through the one snapshot record of :mod:`caffe2jax.runtime.formats.snapshot`:
beyond Caffe's files it keeps the run's seed (every step's PRNG key derives from it and the
iteration), each test net's key and where every data layer of the train and test nets
stands.

A train net running a fork's built-in Python layer that registered a snapshot step writes its
weights as that fork's trainer does (py-faster-rcnn's lib/fast_rcnn/train.py: ``bbox_pred``
un-normalised; py-R-FCN's: ``rpn_bbox_pred`` and ``rfcn_bbox``;
:func:`~caffe2jax.lowering.python_layer.snapshot_weights`), so the
.caffemodel tests as the fork's does; the blobs as trained go into the resume record
(``params/<layer>/<i>``), from which a restore takes them back exactly."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import SolverError
from caffe2jax.lowering.python_layer import snapshot_weights
from caffe2jax.runtime.formats.snapshot import (
    ResumeRecord,
    read_snapshot,
    resume_path,
    write_snapshot,
)
from caffe2jax.runtime.formats.solverstate import SolverStateFile
from caffe2jax.runtime.parallel.devices import is_primary
from caffe2jax.runtime.train import solvers
from caffe2jax.runtime.train.step import learnable_order, merge

if TYPE_CHECKING:
    from caffe2jax.runtime.train.loop import SolverLoop


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
    record = resume_record(loop)
    model, ts = loop.train.model, loop.ts
    params = snapshot_weights(model.net, ts.params)
    record.arrays.update(_trained(ts.params, params))
    history = solvers.history_blobs(ts.opt_state, learnable_order(model))
    step = int(solvers.solver_state(ts.opt_state).current_step)
    return write_snapshot(
        p.snapshot_prefix,
        SolverStateFile(loop.iter, "", step, history),
        p.snapshot_format == caffe_pb2.SolverParameter.HDF5,
        lambda path, fmt: save_weights(path, model, params, ts.state, format=fmt),
        record,
        loop.log.info,
    )


PARAMS = "params/"  # the resume record's arrays of blobs as trained


def _trained(params: dict, written: dict) -> dict:
    """The blobs as trained of each layer whose snapshot weights differ (record arrays)."""
    return {f"{PARAMS}{name}/{i}": np.asarray(blob)
            for name in params if written[name] is not params[name]
            for i, blob in enumerate(params[name]) if blob is not None}  # fmt: skip


def _as_trained(params: dict, record: ResumeRecord | None, path) -> dict:
    """``params`` with the blobs as trained that ``record`` keeps (none: ``params``)."""
    out = dict(params)
    for key, array in (record.arrays if record is not None else {}).items():
        if not key.startswith(PARAMS):
            continue
        name, i = key[len(PARAMS) :].rsplit("/", 1)
        blobs = list(out.get(name, ()))
        if int(i) >= len(blobs) or blobs[int(i)] is None or blobs[int(i)].shape != array.shape:
            raise SolverError(f"{resume_path(path)}: its blob {name}/{i} {list(array.shape)} "
                              "is not one of this net's")  # fmt: skip
        blobs[int(i)] = jnp.asarray(array, blobs[int(i)].dtype)
        out[name] = blobs
    return out


def resume_record(loop: SolverLoop) -> ResumeRecord:
    """What Caffe's solverstate leaves out and an exact resume needs: the run's seed, each
    test net's key and where each data layer of the train and test nets stands."""
    keys = {f"test_{i}": net.key for i, net in enumerate(loop.tests)}
    values = {"train": loop.train.feeder.get_state(),
              "tests": [net.feeder.get_state() for net in loop.tests]}  # fmt: skip
    return ResumeRecord("solver", loop.iter, loop.seed, keys, {}, values)


def restore(loop: SolverLoop, path: str | os.PathLike) -> None:
    """Caffe's Restore: iter, current_step and history; the weights from ``learned_net``;
    then the resume record when there is one (a snapshot from BVLC Caffe has none: its data
    layers start over, as in Caffe)."""
    from caffe2jax.runtime.formats.weights import load_weights

    saved = read_snapshot(path, "solver")
    params, state = loop.ts.params, loop.ts.state
    model = loop.train.model
    if saved.weights is not None:
        params, state = load_weights(saved.weights, model, params, state)
        params = _as_trained(params, saved.record, path)
    s = saved.state
    try:
        opt_state = loop.trainer.own_buffers(solvers.state_from_history(
            loop.param, merge(params, state), s.history, learnable_order(model), s.iter,
            s.current_step,
        ))  # fmt: skip
    except ValueError as err:
        raise SolverError(f"{path}: {err}") from None
    loop.ts = loop.ts.replace(params=params, state=state, opt_state=opt_state,
                              iteration=s.iter)  # fmt: skip
    if saved.record is None:
        loop.log.info(f"{path}: no {resume_path(path).name}; data layers start from the top")
        return
    _resume_from(loop, saved.record, path)


def _resume_from(loop: SolverLoop, record: ResumeRecord, path: str | os.PathLike) -> None:
    """Put the seed, the test keys and every data layer where the record says."""
    try:
        loop.seed = record.seed
        loop.ts = loop.ts.replace(key=jax.random.key(loop.seed))
        loop.train.feeder.set_state(record.values["train"])
        for i, (net, state) in enumerate(zip(loop.tests, record.values["tests"])):
            net.feeder.set_state(state)
            net.key = record.keys[f"test_{i}"]
    except (ValueError, KeyError, TypeError) as err:
        raise SolverError(f"{path}: not a usable resume record ({err})") from None
