"""pycaffe's Solver: ``get_solver(path)``, ``step(n)``, ``solve()``, ``snapshot()``, ``restore()``.

Reproduces Caffe's Solver: train net and test nets from the solver's net fields with their
NetStates (Solver::InitTrainNet / InitTestNets), the Step loop (test at ``test_interval``,
iter_size forward/backward passes, smoothed loss, display, ApplyUpdate, snapshots), Solve
(snapshot after training, a final display and test), and Caffe's log line shapes. Each step is
one compiled XLA program (see :mod:`caffe2jax.runtime.training`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from caffe2jax.errors import SolverError
from caffe2jax.frontend import caffe_pb2
from caffe2jax.lowering.registry import is_carry
from caffe2jax.pycaffe import TEST, TRAIN, Net
from caffe2jax.runtime import solvers
from caffe2jax.runtime.solver_setup import (
    SOLVER_TYPES,
    net_sources,
    net_state,
    read_solver_param,
)
from caffe2jax.runtime.solverstate import (
    SolverStateFile,
    read_solverstate,
    snapshot_name,
    write_solverstate,
)
from caffe2jax.runtime.training import Trainer, learnable_order, merge

log = logging.getLogger("caffe2jax")


class Solver:
    """A Caffe solver over a train net and its test nets (pycaffe's ``caffe.SGDSolver`` …)."""

    def __init__(self, source: Any, *, logger: logging.Logger | None = None):
        self.param, self._folder = read_solver_param(source)
        self.log = logger or log
        if self.param.type not in SOLVER_TYPES:
            raise SolverError(
                f"unknown solver type '{self.param.type}'; known: {', '.join(SOLVER_TYPES)}"
            )
        seed = self.param.random_seed if self.param.random_seed >= 0 else time.time_ns() % 2**31
        self._rng = jax.random.key(seed)
        train, tests = net_sources(self.param, self._folder)
        train_state = self.param.train_state if self.param.HasField("train_state") else None
        self.net = Net(train, TRAIN, state=net_state(caffe_pb2.TRAIN, train, train_state),
                       base_dir=self._folder, seed=int(seed))  # fmt: skip
        self.test_nets = [
            Net(net, TEST, base_dir=self._folder, seed=int(seed),
                state=net_state(caffe_pb2.TEST, net,
                             self.param.test_state[i] if self.param.test_state else None))
            for i, net in enumerate(tests)
        ]  # fmt: skip
        for layer in self.net.model.net.layers:
            if layer.type == "HDF5Output":
                self.log.warning(
                    f"HDF5Output layer '{layer.name}' in the train net is not written during "
                    "the compiled train steps (test nets and Net.forward write it)"
                )
        params, state = self.net._trees()
        try:
            self._trainer = Trainer(self.net.model, self.param, params, state)
        except ValueError as err:
            raise SolverError(str(err)) from None
        self._opt_state = self._trainer.init(params, state)
        self._iter = 0
        self._losses: list[float] = []
        self._pending: list[tuple[int, Any]] = []
        self._smoothed = 0.0
        self._start_iter = 0
        self.stopped = False
        self.on_iteration: Callable[[int], None] | None = None

    # -- pycaffe surface ----------------------------------------------------------------------

    @property
    def iter(self) -> int:
        """Caffe's ``iter_``: updates applied so far (kept on the host: reading it never
        waits for the device)."""
        return self._iter

    @property
    def smoothed_loss(self) -> float:
        """The loss Caffe displays: the mean over the last ``average_loss`` iterations."""
        self._flush_losses()
        return self._smoothed

    @property
    def lr(self) -> float:
        return float(solvers.current_lr(self.param, self._opt_state))

    @property
    def train_net(self) -> Net:
        return self.net

    def set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        self.net.set_input_arrays(data, labels)

    def copy_trained_layers(self, path: str | os.PathLike) -> None:
        """Caffe's CopyLayers: load weights into the train net and every test net."""
        for net in [self.net, *self.test_nets]:
            net.copy_from(path)

    def close(self) -> None:
        """Stop every net's data prefetching and close its files."""
        for net in [self.net, *self.test_nets]:
            net.close()

    def request_stop(self) -> None:
        """Finish the current iteration, then stop (Caffe's SIGINT action "stop")."""
        self.stopped = True

    def request_snapshot(self) -> None:
        """Snapshot after the current iteration (Caffe's SIGHUP action "snapshot")."""
        self._snapshot_requested = True

    # -- training -----------------------------------------------------------------------------

    def _batches(self) -> list[dict[str, Any]]:
        """The inputs of each of the iter_size forwards: MemoryData/Data sources advance per
        forward; Input blobs repeat what the caller put in ``net.blobs``."""
        per_pass = []
        for _ in range(self._trainer.iter_size):
            fed = self.net._feeder.next_batches()
            for name in self.net.model.inputs:
                if name not in fed:
                    fed[name] = self.net.blobs[name]._value()
            per_pass.append(fed)
        return per_pass

    def _update_smoothed(self, loss: float, iteration: int) -> None:
        """Caffe's UpdateSmoothedLoss over the last ``average_loss`` iterations."""
        average = max(1, self.param.average_loss)
        if len(self._losses) < average:
            self._losses.append(loss)
            size = len(self._losses)
            self._smoothed = (self._smoothed * (size - 1) + loss) / size
        else:
            idx = (iteration - self._start_iter) % average
            self._smoothed += (loss - self._losses[idx]) / average
            self._losses[idx] = loss

    def _flush_losses(self) -> None:
        """Fold the losses of finished steps into the smoothed loss (fetched lazily, so the
        host never waits on the device except to display)."""
        for iteration, loss in self._pending:
            self._update_smoothed(float(loss), iteration)
        self._pending = []

    def step(self, iters: int) -> None:
        """Caffe's Solver::Step: ``iters`` iterations (tests, display and snapshots included)."""
        p = self.param
        self._start_iter = self.iter
        self._losses, self._smoothed, self._pending = [], 0.0, []
        stop = self.iter + iters
        timer, last_iter = time.perf_counter(), self.iter
        params, state = self.net._trees()
        while self.iter < stop:
            if (
                p.test_interval
                and self.iter % p.test_interval == 0
                and (self.iter > 0 or p.test_initialization)
            ):
                self._push(params, state)
                self.test_all()
            iteration = self._iter
            display = p.display and iteration % p.display == 0
            if display:
                lr = float(solvers.current_lr(p, self._opt_state))
            params, state, self._opt_state, loss, outputs = self._trainer.step(
                params, state, self._opt_state, self._batches(), self._rng, iteration
            )
            self._pending.append((iteration, loss))
            self._iter += 1
            if display:
                self._flush_losses()
                lapse = time.perf_counter() - timer
                rate = (iteration - last_iter) / (lapse or 1)
                self.log.info(
                    f"Iteration {iteration} ({rate:.6g} iter/s, {lapse:.6g}s/{p.display} "
                    f"iters), loss = {self._smoothed:.6g}"
                )
                self._log_outputs("Train", self.net, outputs)
                self.log.info(f"Iteration {iteration}, lr = {lr:.6g}")
                timer, last_iter = time.perf_counter(), iteration
            if self.on_iteration is not None:
                self.on_iteration(self.iter)
            if p.snapshot and self.iter % p.snapshot == 0:
                self._push(params, state)
                self.snapshot()
        self._flush_losses()
        self._push(params, state)

    def _push(self, params, state) -> None:
        """Make the solver's current params visible through ``net.params`` (pycaffe)."""
        self.net._set_params(params, state)

    def _log_outputs(self, which: str, net: Net, outputs: dict[str, Any]) -> dict[str, float]:
        """Caffe's ``Train/Test net output #k: name = v (* w = w·v loss)`` lines."""
        ir_net = net.model.net
        weights = {
            user: weight
            for layer in ir_net.layers
            for user, weight in zip(layer.top_names, layer.loss_weights)
        }
        scores, index = {}, 0
        for name in ir_net.outputs:
            weight = weights.get(name, 0.0)
            for value in np.atleast_1d(np.asarray(outputs[name], np.float64)).ravel():
                extra = f" (* {weight:g} = {weight * value:.6g} loss)" if weight else ""
                self.log.info(f"    {which} net output #{index}: {name} = {value:.6g}{extra}")
                scores[name] = float(value)
                index += 1
        return scores

    def solve(self, resume_file: str | os.PathLike | None = None) -> None:
        """Caffe's Solver::Solve: optionally restore, train to max_iter, snapshot, final test."""
        p = self.param
        self.log.info(f"Solving {self.net.model.net.name}")
        self.log.info(f"Learning Rate Policy: {p.lr_policy}")
        if resume_file is not None:
            self.log.info(f"Restoring previous solver status from {resume_file}")
            self.restore(resume_file)
        self.step(p.max_iter - self.iter)
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self.snapshot()
        if self.stopped:
            self.log.info("Optimization stopped early.")
            return
        if p.display and self.iter % p.display == 0:
            out = self.net.forward()
            loss = float(self.net.model.graph.objective(
                {self.net.model.net.blob_names[k]: v for k, v in out.items()}
            ))  # fmt: skip
            self._update_smoothed(loss, self.iter)
            self.log.info(f"Iteration {self.iter}, loss = {self._smoothed:.6g}")
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        self.log.info("Optimization Done.")

    # -- testing ------------------------------------------------------------------------------

    def test_all(self) -> list[dict[str, float]]:
        return [self.test(i) for i in range(len(self.test_nets))]

    def test(self, index: int) -> dict[str, float]:
        """Caffe's Solver::Test: mean of each output over test_iter forwards."""
        self.log.info(f"Iteration {self.iter}, Testing net (#{index})")
        test_net = self.test_nets[index]
        self._share_trained_layers(test_net)
        iters = self.param.test_iter[index]
        sums: dict[str, np.ndarray] = {}
        loss = 0.0
        graph, names = test_net.model.graph, test_net.model.net.blob_names
        for _ in range(iters):
            out = test_net.forward()
            if self.param.test_compute_loss:
                loss += float(graph.objective({names[k]: v for k, v in out.items()}))
            for name, value in out.items():
                sums[name] = sums.get(name, 0) + np.asarray(value, np.float64)
        if self.param.test_compute_loss:
            self.log.info(f"Test loss: {loss / iters:.6g}")
        return self._log_outputs("Test", test_net, {k: v / iters for k, v in sums.items()})

    def _share_trained_layers(self, test_net: Net) -> None:
        """Net::ShareTrainedLayersWith: test layers take the train net's blobs by layer name."""
        params, state = self.net._trees()
        mine_p, mine_s = test_net._trees()
        for tree, source in ((mine_p, params), (mine_s, state)):
            for name, blobs in tree.items():
                if name in source and not is_carry(name):
                    for j, value in enumerate(source[name]):
                        if j < len(blobs) and value is not None:
                            if tuple(value.shape) != tuple(blobs[j].shape):
                                raise SolverError(
                                    f"cannot share layer '{name}' blob {j} with the test net: "
                                    f"train shape {list(value.shape)}, test {list(blobs[j].shape)}"
                                )
                            blobs[j] = value
        test_net._set_params(mine_p, mine_s)

    # -- snapshots ----------------------------------------------------------------------------

    def _prefix(self) -> str:
        if not self.param.snapshot_prefix:
            raise SolverError("snapshot_prefix is not set; cannot write a snapshot")
        return self.param.snapshot_prefix

    def snapshot(self) -> tuple[Path, Path]:
        """Caffe's Snapshot: weights then solver state, each written atomically."""
        from caffe2jax.runtime.weights import save_weights

        hdf5 = self.param.snapshot_format == caffe_pb2.SolverParameter.HDF5
        prefix = self._prefix()
        weights = Path(snapshot_name(prefix, self.iter, hdf5, "caffemodel"))
        weights.parent.mkdir(parents=True, exist_ok=True)
        params, state = self.net._trees()
        kind = "HDF5 file" if hdf5 else "binary proto file"
        self.log.info(f"Snapshotting to {kind} {weights}")
        save_weights(weights, self.net.model, params, state, format="hdf5" if hdf5 else "binary")
        order = learnable_order(self.net.model)
        history = solvers.history_blobs(self._opt_state, order)
        inner = solvers.solver_state(self._opt_state)
        solverstate = Path(snapshot_name(prefix, self.iter, hdf5, "solverstate"))
        self.log.info(f"Snapshotting solver state to {kind} {solverstate}")
        write_solverstate(
            solverstate,
            SolverStateFile(self.iter, str(weights), int(inner.current_step), history),
            hdf5,
        )
        return weights, solverstate

    def restore(self, path: str | os.PathLike) -> None:
        """Caffe's Restore: iter, current_step and history; the weights from ``learned_net``."""
        from caffe2jax.runtime.weights import load_weights

        path = Path(path)
        saved = read_solverstate(path)
        if saved.learned_net:
            # Caffe writes the weights beside the state (same prefix) and records the path it
            # used, relative to its working directory then: look beside the state first.
            beside = path.parent / Path(saved.learned_net).name
            weights = beside if beside.exists() else Path(saved.learned_net)
            if not weights.exists():
                raise SolverError(
                    f"{path}: its weights file '{saved.learned_net}' was found neither beside "
                    "it nor relative to the working directory"
                )
            params, state = load_weights(weights, self.net.model, *self.net._trees())
            self.net._set_params(params, state)
        params, state = self.net._trees()
        merged = merge(params, state)
        try:
            self._opt_state = self._trainer.own_buffers(solvers.state_from_history(
                self.param, merged, saved.history, learnable_order(self.net.model),
                saved.iter, saved.current_step,
            ))  # fmt: skip
        except ValueError as err:
            raise SolverError(f"{path}: {err}") from None
        self._iter = saved.iter


class SGDSolver(Solver):
    pass


NesterovSolver = AdaGradSolver = RMSPropSolver = AdaDeltaSolver = AdamSolver = SGDSolver


def get_solver(source: Any) -> Solver:
    """pycaffe's ``caffe.get_solver``: the solver the file's ``type`` names."""
    return Solver(source)
