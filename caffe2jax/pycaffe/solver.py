"""pycaffe's Solver: a view over the runtime's training loop with Caffe's memory semantics.

Training is :class:`caffe2jax.runtime.train.loop.SolverLoop`'s (the CLI drives the same
loop). This class gives it pycaffe's shape: ``solver.net`` and ``solver.test_nets`` are
:class:`~caffe2jax.pycaffe.net.Net` views that share their param blobs the way Caffe's
ShareTrainedLayersWith does, so a test net always shows the current weights; after
``step(n)`` the train net's blobs hold the last forward of the last iteration, their diffs the
last backward, and each param diff the update ApplyUpdate applied, as in Caffe. Those are
computed only when a script reads them. What a script writes into ``net.params[...].data``
(or a blob an Input layer feeds) is what the next step starts from.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from caffe2jax.lowering.python_layer import python_layers as choose_python_layers
from caffe2jax.lowering.registry import NetState, carry_of
from caffe2jax.pycaffe.net import Net
from caffe2jax.runtime.train import solvers
from caffe2jax.runtime.train.loop import SolverLoop
from caffe2jax.runtime.train.rules import SOLVER_RULES, check_solver_type


class Solver:
    """A Caffe solver over a train net and its test nets (pycaffe's ``caffe.SGDSolver`` …)."""

    def __init__(self, source: Any, *, logger: logging.Logger | None = None,
                 devices: str | int | list[int] | None = None,
                 python_layers: str | None = None, dialect: str | None = None):  # fmt: skip
        """``python_layers`` and ``dialect`` (a built-in fork's name or a fork's caffe.proto):
        as :class:`~caffe2jax.pycaffe.net.Net`'s, for the solver file and every net of it."""
        with choose_python_layers(python_layers):
            self._loop = loop = SolverLoop(source, logger=logger, devices=devices,
                                           dialect=dialect)  # fmt: skip
        self.param = loop.param
        self.log = loop.log
        self.net = Net.view(loop.train, loop.ts.params, loop.ts.state)
        self.test_nets = []
        for i, compiled in enumerate(loop.tests):
            params, state = loop.test_params(i)
            test = Net.view(compiled, params, state)
            test.share_with(self.net)
            self.test_nets.append(test)
        self._pushed = self.net.params_version

    # -- pycaffe surface ----------------------------------------------------------------------

    @property
    def iter(self) -> int:
        """Caffe's ``iter_``: updates applied so far (settable, as pycaffe's is)."""
        return self._loop.iter

    @iter.setter
    def iter(self, value: int) -> None:
        self._loop.set_iter(value)

    @property
    def smoothed_loss(self) -> float:
        """The loss Caffe displays: the mean over the last ``average_loss`` iterations."""
        return self._loop.smoothed_loss

    @property
    def lr(self) -> float:
        return float(solvers.current_lr(self.param, self._loop.ts.opt_state))

    @property
    def train_net(self) -> Net:
        return self.net

    @property
    def stopped(self) -> bool:
        return self._loop.stopped

    @property
    def on_iteration(self) -> Callable[[int], None] | None:
        return self._loop.on_iteration

    @on_iteration.setter
    def on_iteration(self, fn: Callable[[int], None] | None) -> None:
        self._loop.on_iteration = fn

    def set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        self.net.set_input_arrays(data, labels)

    def add_callback(self, on_start: Callable[[], None], on_gradients_ready: Callable[[], None]):
        """pycaffe's add_callback: ``on_start`` before each iteration's forward, and
        ``on_gradients_ready`` after its backward. The views are brought up to date before
        each call. (The update runs inside the same compiled step as the backward, so
        ``on_gradients_ready`` sees the param diffs after ApplyUpdate.)"""

        def synced(fn: Callable[[], None]) -> Callable[[], None]:
            def call() -> None:
                self._push()
                fn()
                self._pull()

            return call

        self._loop.on_start.append(synced(on_start))
        self._loop.on_gradients_ready.append(synced(on_gradients_ready))

    def copy_trained_layers(self, path: str | os.PathLike) -> None:
        """Caffe's CopyLayers: load weights into the train net and every test net."""
        self._pull()
        self._loop.copy_trained_layers(path)
        self._push()

    def close(self) -> None:
        """Stop every net's data prefetching and close its files."""
        self._loop.close()

    def request_stop(self) -> None:
        """Finish the current iteration, then stop (Caffe's SIGINT action "stop")."""
        self._loop.request_stop()

    def request_snapshot(self) -> None:
        """Snapshot after the current iteration (Caffe's SIGHUP action "snapshot")."""
        self._loop.request_snapshot()

    # -- keeping the views and the train state in step ---------------------------------------

    def _pull(self) -> None:
        """Param values a script changed through the views become the train state's."""
        loop, net = self._loop, self.net
        if net.params_version == self._pushed and not net.params_written():
            return
        params, state = net.param_values()
        state = NetState({**loop.ts.state, **state}, carry_of(state))
        loop.ts = loop.ts.replace(params=params, state=state)
        self._pushed = net.params_version

    def _push(self, tests: bool = True) -> None:
        """The train state's values into the views (arrays scripts hold see them); test nets
        share the train net's blobs, so their own blobs change only when ``tests``."""
        loop = self._loop
        self.net.show_params(loop.ts.params, loop.ts.state)
        self._pushed = self.net.params_version
        for i, test in enumerate(self.test_nets if tests else []):
            params, state = loop.test_params(i)
            shared = set(loop.shares[i])
            test.show_params(_unshared(params, shared), _unshared(state, shared))

    def _fill(self, fed: dict) -> dict:
        """Input layers of the train net take what the script put in ``net.blobs``."""
        for name, value in self.net.input_values().items():
            fed.setdefault(name, value)
        return fed

    # -- training -----------------------------------------------------------------------------

    def step(self, iters: int) -> None:
        """Caffe's Solver::Step: ``iters`` iterations (tests, display and snapshots included)."""
        self._pull()
        tested = self._loop.tests_run
        self._loop.step(iters, self._fill)
        self._show(tests=self._loop.tests_run != tested)

    def _show(self, tests: bool = True) -> None:
        loop = self._loop
        self._push(tests)
        record = loop.last_pass
        if record is not None:
            self.net.show_pass(record, loop.last_outputs)
            self.net.show_param_diffs(record.diffs)
        for test, env in zip(self.test_nets if tests else [], loop.last_test_env):
            if env is not None:
                test.show_forward(env)

    def solve(self, resume_file: str | os.PathLike | None = None) -> None:
        """Caffe's Solver::Solve: optionally restore, train to max_iter, snapshot, final test."""
        self._pull()
        self._loop.solve(resume_file)
        self._show()

    def test(self, index: int = 0) -> dict[str, float]:
        """Caffe's Solver::Test on test net ``index`` (returns each output's mean)."""
        self._pull()
        scores = self._loop.test(index)
        self._show()
        return scores

    def test_all(self) -> list[dict[str, float]]:
        return [self.test(i) for i in range(len(self.test_nets))]

    def apply_update(self) -> None:
        """pycaffe's apply_update: Caffe's ApplyUpdate with the diffs the script's own
        ``net.backward`` left in the param blobs (the learning rate of the current
        iteration, clipping, normalization, regularization), then ``iter`` += 1."""
        loop = self._loop
        self._pull()
        grads = self.net.param_diff_values()
        grads = {name: [g if v is not None else None for g, v in zip(grads[name], blobs)]
                 for name, blobs in loop.ts.params.items()}  # fmt: skip
        loop.ts = loop.trainer.apply(loop.ts, grads)
        self._push()

    # -- snapshots ----------------------------------------------------------------------------

    def snapshot(self) -> tuple[Path, Path]:
        """Caffe's Snapshot: weights then solver state, each written atomically."""
        self._pull()
        return self._loop.snapshot()

    def restore(self, path: str | os.PathLike) -> None:
        """Caffe's Restore: iter, current_step and history; the weights from ``learned_net``."""
        self._loop.restore(path)
        self._push()


def _unshared(tree: dict, shared: set) -> dict:
    """The slots of ``tree`` a test net owns itself (not taken from the train net)."""
    return {name: [None if (name, j) in shared else v for j, v in enumerate(blobs)]
            for name, blobs in tree.items()}  # fmt: skip


def _solver_class(kind: str) -> type[Solver]:
    return type(f"{kind}Solver", (Solver,), {"__doc__": f"pycaffe's caffe.{kind}Solver."})


SOLVER_CLASSES: dict[str, type[Solver]] = {kind: _solver_class(kind) for kind in SOLVER_RULES}
SGDSolver = SOLVER_CLASSES["SGD"]
NesterovSolver = SOLVER_CLASSES["Nesterov"]
AdaGradSolver = SOLVER_CLASSES["AdaGrad"]
RMSPropSolver = SOLVER_CLASSES["RMSProp"]
AdaDeltaSolver = SOLVER_CLASSES["AdaDelta"]
AdamSolver = SOLVER_CLASSES["Adam"]


def get_solver(source: Any, devices: str | int | list[int] | None = None,
               python_layers: str | None = None, dialect: str | None = None) -> Solver:  # fmt: skip
    """pycaffe's ``caffe.get_solver``: an instance of the class the file's ``type`` names
    (``SGDSolver``, ``AdamSolver``…); ``devices`` (``"all"``, ``"0,1"``, ids) trains
    data-parallel on them, as ``caffe train -gpu``; ``python_layers`` and ``dialect`` as for
    a Net."""
    from caffe2jax.runtime.train.setup import read_solver_param

    param, _ = read_solver_param(source, dialect)
    check_solver_type(param)
    return SOLVER_CLASSES[param.type](source, devices=devices, python_layers=python_layers,
                                      dialect=dialect)  # fmt: skip
