"""The training state and the pure pieces of Caffe's Solver::Step that act on it.

``TrainState`` is one pytree-friendly record: params, state (BatchNorm statistics, carried
recurrent values), the optimizer state, the run's PRNG key and the iteration. The step is
:class:`caffe2jax.runtime.train.step.Trainer`'s single jitted program; what a pycaffe view needs
to show afterwards (the last forward's blobs, the last backward's diffs, the update held in
the param diffs) is kept as a :class:`Pass`, cheap to keep and computed only when read.
Nothing here assumes one device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from caffe2jax.frontend.errors import SolverError
from caffe2jax.lowering.graph import Params
from caffe2jax.runtime.train.step import Trainer

INT_MAX = 2**31 - 1


@dataclass(frozen=True)
class TrainState:
    """Everything a training run carries from one iteration to the next."""

    params: Params
    state: Params
    opt_state: Any
    key: jax.Array
    iteration: int = 0

    def replace(self, **changes: Any) -> TrainState:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Pass:
    """The last forward/backward of an iteration, as pycaffe shows it after ``step``.

    ``params``/``state`` are what that pass ran with, ``inputs`` its input blobs (by name),
    ``iteration`` and ``index`` locate its PRNG key; ``diffs`` the update each param blob
    holds after ApplyUpdate (Caffe's ``data -= diff``), in the merged params+state layout.
    """

    params: Params
    state: Params
    inputs: Mapping[str, Any]
    key: jax.Array
    iteration: int
    index: int
    diffs: Params

    @property
    def rng(self) -> jax.Array:
        """The key the step's pass used (same folding as the jitted step)."""
        return jax.random.fold_in(jax.random.fold_in(self.key, self.iteration), self.index)


def train_step(
    trainer: Trainer, ts: TrainState, passes: Sequence[Mapping[str, Any]]
) -> tuple[TrainState, Any, Mapping[str, Any], Pass]:
    """One Caffe iteration (iter_size passes and an update): the new state, the loss (mean over
    the passes, still on the device), the last pass's outputs and its :class:`Pass`."""
    if ts.iteration >= INT_MAX:
        raise SolverError(
            f"iteration {ts.iteration}: Caffe's iteration counter is an int and ends at {INT_MAX}"
        )
    params, state, opt_state, loss, outputs, extra = trainer.step(
        ts.params, ts.state, ts.opt_state, passes, ts.key, ts.iteration
    )
    last_state = extra[1] if len(extra) > 1 else ts.state
    shown = trainer.shown_inputs(passes[-1])
    record = Pass(ts.params, last_state, shown, ts.key, ts.iteration, len(passes) - 1,
                  extra[0])  # fmt: skip
    return ts.replace(params=params, state=state, opt_state=opt_state,
                      iteration=ts.iteration + 1), loss, outputs, record  # fmt: skip


class LossWindow:
    """Caffe's UpdateSmoothedLoss: the mean of the last ``average_loss`` iteration losses."""

    def __init__(self, average: int, start_iter: int = 0):
        self.average = max(1, average)
        self.start_iter = start_iter
        self.losses: list[float] = []
        self.smoothed = 0.0

    def add(self, loss: float, iteration: int) -> float:
        if len(self.losses) < self.average:
            self.losses.append(loss)
            size = len(self.losses)
            self.smoothed = (self.smoothed * (size - 1) + loss) / size
        else:
            idx = (iteration - self.start_iter) % self.average
            self.smoothed += (loss - self.losses[idx]) / self.average
            self.losses[idx] = loss
        return self.smoothed
