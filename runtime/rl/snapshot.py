"""Snapshots of a policy-gradient run, and their exact resume.

A snapshot is Caffe's pair — ``<prefix>_iter_<N>.caffemodel`` (the policy's weights) and
``<prefix>_iter_<N>.solverstate`` (``iter``, ``current_step``, the solver's history: RMSProp's
squared-gradient average, Adam's moments…), both readable by Caffe — and beside the solverstate
the resume record ``….solverstate.resume.json`` (the training loop's sidecar, see
:func:`caffe2jax.runtime.train.loop.resume_path`) with what an exact resume needs beyond
Caffe's files: the PRNG key, the episode counter and each lane's difference memory
(MyCaffe's ``m_sdLast``), every episode's return so far, the running reward, the env steps,
the elapsed seconds, the seed and the environment. Snapshots are taken between batches; every
environment here starts a batch from state that the seed and the episode counter determine
(the JAX Cart-Poles' lanes, the Atari emulators' resets and sticky-action generators), so a
resumed run plays the same episodes as an uninterrupted one with the same seed (tested after
``kill -9``). Gymnasium (``gym:``) environments continue their own random streams: resuming
one is refused.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.runtime.formats.atomic import atomic_write
from caffe2jax.runtime.formats.solverstate import (
    SolverStateFile,
    read_solverstate,
    snapshot_name,
    write_solverstate,
)
from caffe2jax.runtime.rl.policy import RLError
from caffe2jax.runtime.rl.rollout import Lanes
from caffe2jax.runtime.rl.state import PolicyState
from caffe2jax.runtime.train import solvers
from caffe2jax.runtime.train.loop import resume_path
from caffe2jax.runtime.train.step import learnable_order, merge

if TYPE_CHECKING:
    from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer, RunResult

VERSION = 1


def _encode(array: Any) -> dict[str, Any]:
    a = np.array(array, order="C")  # ascontiguousarray would make a 0-d array 1-d
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": base64.b64encode(a).decode()}


def _decode(record: dict[str, Any]) -> np.ndarray:
    data = base64.b64decode(record["data"])
    return np.frombuffer(data, np.dtype(record["dtype"])).reshape(record["shape"]).copy()


def _record(trainer: PolicyGradientTrainer, result: RunResult) -> dict[str, Any]:
    ts = result.state
    return {
        "caffe2jax_rl_resume": VERSION,
        "iter": trainer.iterations(ts),
        "env": trainer.config.env,
        "seed": trainer.config.seed,
        "key": _encode(jax.random.key_data(ts.key)),
        "lanes": {name: _encode(value) for name, value in ts.lanes._asdict().items()},
        "returns": result.returns,
        "running": result.running,
        "steps": result.steps,
        "seconds": result.seconds,
    }


def write_snapshot(
    trainer: PolicyGradientTrainer, result: RunResult, prefix: str, hdf5: bool = False
) -> tuple[Path, Path]:
    """Weights, solver state and resume record of ``result`` at its iteration (atomically)."""
    ts = result.state
    iteration = trainer.iterations(ts)
    weights = Path(snapshot_name(prefix, iteration, hdf5, "caffemodel"))
    state_path = Path(snapshot_name(prefix, iteration, hdf5, "solverstate"))
    weights.parent.mkdir(parents=True, exist_ok=True)
    trainer.save(weights, ts, "hdf5" if hdf5 else "binary")
    history = solvers.history_blobs(ts.opt_state, learnable_order(trainer.model))
    inner = solvers.solver_state(ts.opt_state)
    atomic_write(resume_path(state_path), json.dumps(_record(trainer, result)))
    write_solverstate(
        state_path,
        SolverStateFile(iteration, str(weights), int(inner.current_step), history),
        hdf5,
    )
    return weights, state_path


def _weights_of(path: Path, learned_net: str) -> Path:
    beside = path.parent / Path(learned_net).name
    weights = beside if beside.exists() else Path(learned_net)
    if not weights.exists():
        raise RLError(f"{path}: its weights file '{learned_net}' was not found")
    return weights


def read_snapshot(trainer: PolicyGradientTrainer, path: str | Path) -> RunResult:
    """The run a snapshot holds, ready for :meth:`PolicyGradientTrainer.run` to continue."""
    from caffe2jax.runtime.formats.weights import load_weights
    from caffe2jax.runtime.rl.trainer import RunResult

    path = Path(path)
    if trainer.config.is_gym:
        raise RLError(f"{path}: gym: environments cannot resume exactly (their RNG is not saved)")
    sidecar = resume_path(path)
    if not path.exists() or not sidecar.exists():
        raise RLError(f"{path}: a snapshot needs the solverstate and its {sidecar.name}")
    saved = read_solverstate(path)
    record = json.loads(sidecar.read_text())
    if record.get("caffe2jax_rl_resume") != VERSION or record["iter"] != saved.iter:
        raise RLError(f"{sidecar}: not the RL resume record of iteration {saved.iter}")
    for name in ("env", "seed"):
        if record[name] != getattr(trainer.config, name):
            raise RLError(
                f"{path}: the snapshot's {name} is {record[name]!r}, this run's is "
                f"{getattr(trainer.config, name)!r}"
            )
    fresh = trainer.init()
    params, state = load_weights(_weights_of(path, saved.learned_net), trainer.model)
    order = learnable_order(trainer.model)
    opt_state = solvers.state_from_history(
        trainer.solver_param, merge(params, state), saved.history, order, saved.iter,
        saved.current_step,
    )  # fmt: skip
    key = jax.random.wrap_key_data(jnp.asarray(_decode(record["key"])))
    lanes = Lanes(**{k: jnp.asarray(_decode(v)) for k, v in record["lanes"].items()})
    if lanes.last.shape != fresh.lanes.last.shape:
        raise RLError(f"{sidecar}: lanes {list(lanes.last.shape)} do not fit batch_size")
    ts = trainer._place(PolicyState(params, state, opt_state, key, lanes))
    result = RunResult(ts, [float(r) for r in record["returns"]], int(record["steps"]))
    result.seconds, result.running = float(record["seconds"]), record["running"]
    return result
