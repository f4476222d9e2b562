"""Snapshots of a policy-gradient run, and their exact resume, in the one snapshot record of
:mod:`caffe2jax.runtime.formats.snapshot` (kind ``"rl"``).

A snapshot is Caffe's pair — ``<prefix>_iter_<N>.caffemodel`` (the policy's weights) and
``<prefix>_iter_<N>.solverstate`` (``iter``, ``current_step``, the solver's history: RMSProp's
squared-gradient average, Adam's moments…), both readable by Caffe — and beside the solverstate
the resume record with what an exact resume needs beyond Caffe's files: the PRNG key (key
``"run"``), the episode counter and each lane's difference memory (MyCaffe's ``m_sdLast``;
arrays ``last``, ``has_last``, ``episodes``), every episode's return so far, the running
reward, the env steps, the elapsed seconds and the environment (values), and the seed.
Snapshots are taken between batches; every environment here starts a batch from state that the
seed and the episode counter determine (the JAX Cart-Poles' lanes, the Atari emulators' resets
and sticky-action generators), so a resumed run plays the same episodes as an uninterrupted
one with the same seed (tested after ``kill -9``). Gymnasium (``gym:``) environments continue
their own random streams: resuming one is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import jax.numpy as jnp
import numpy as np

from caffe2jax.runtime.formats import snapshot as record_file
from caffe2jax.runtime.formats.snapshot import ResumeRecord
from caffe2jax.runtime.formats.solverstate import SolverStateFile
from caffe2jax.runtime.rl.policy import RLError
from caffe2jax.runtime.rl.rollout import Lanes
from caffe2jax.runtime.rl.state import PolicyState
from caffe2jax.runtime.train import solvers
from caffe2jax.runtime.train.step import learnable_order, merge

if TYPE_CHECKING:
    from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer, RunResult


def resume_record(trainer: PolicyGradientTrainer, result: RunResult) -> ResumeRecord:
    """The record of ``result`` (module docstring)."""
    ts = result.state
    arrays = {name: np.asarray(value) for name, value in ts.lanes.as_dict().items()}
    values = {"env": trainer.config.env, "returns": result.returns, "running": result.running,
              "steps": result.steps, "seconds": result.seconds}  # fmt: skip
    iteration = trainer.iterations(ts)
    return ResumeRecord("rl", iteration, trainer.config.seed, {"run": ts.key}, arrays, values)


def write_snapshot(
    trainer: PolicyGradientTrainer, result: RunResult, prefix: str, hdf5: bool = False
) -> tuple[Path, Path]:
    """Weights, solver state and resume record of ``result`` at its iteration (atomically)."""
    ts = result.state
    history = solvers.history_blobs(ts.opt_state, learnable_order(trainer.model))
    step = int(solvers.solver_state(ts.opt_state).current_step)
    record = resume_record(trainer, result)
    return record_file.write_snapshot(
        prefix, SolverStateFile(record.iteration, "", step, history), hdf5,
        lambda path, fmt: trainer.save(path, ts, fmt), record,
    )  # fmt: skip


def _check(trainer: PolicyGradientTrainer, path: Path, record: ResumeRecord) -> None:
    """The run must be the snapshot's: same environment, same seed."""
    for name, saved in (("env", record.values["env"]), ("seed", record.seed)):
        if saved != getattr(trainer.config, name):
            raise RLError(
                f"{path}: the snapshot's {name} is {saved!r}, this run's is "
                f"{getattr(trainer.config, name)!r}"
            )


def read_snapshot(trainer: PolicyGradientTrainer, path: str | Path) -> RunResult:
    """The run a snapshot holds, ready for :meth:`PolicyGradientTrainer.run` to continue."""
    from caffe2jax.runtime.formats.weights import load_weights
    from caffe2jax.runtime.rl.trainer import RunResult

    path = Path(path)
    if trainer.config.is_gym:
        raise RLError(f"{path}: gym: environments cannot resume exactly (their RNG is not saved)")
    sidecar = record_file.resume_path(path)
    if not path.exists() or not sidecar.exists():
        raise RLError(f"{path}: a snapshot needs the solverstate and its {sidecar.name}")
    saved = record_file.read_snapshot(path, "rl", RLError)
    record, s = saved.record, saved.state
    if record is None or saved.weights is None:
        raise RLError(f"{path}: a snapshot needs its weights and its {sidecar.name}")
    _check(trainer, path, record)
    params, state = load_weights(saved.weights, trainer.model)
    opt_state = solvers.state_from_history(
        trainer.solver_param, merge(params, state), s.history, learnable_order(trainer.model),
        s.iter, s.current_step,
    )  # fmt: skip
    lanes = Lanes(**{k: jnp.asarray(v) for k, v in record.arrays.items()})
    if lanes.last.shape != (trainer.config.batch_size, trainer.policy.obs_size):
        raise RLError(f"{sidecar}: lanes {list(lanes.last.shape)} do not fit batch_size")
    ts = trainer.place(PolicyState(params, state, opt_state, record.keys["run"], lanes))
    result = RunResult(ts, [float(r) for r in record.values["returns"]],
                       int(record.values["steps"]))  # fmt: skip
    result.seconds, result.running = float(record.values["seconds"]), record.values["running"]
    return result
