"""Caffe's Solver (Init, Step, Solve, Test, Snapshot, Restore) over a :class:`TrainState`.

This is the one training loop: the CLI drives it directly and pycaffe's ``Solver`` is a view
over it. It reproduces Solver::Step (a test pass at ``test_interval``, iter_size passes and one
update per iteration as one compiled program, the smoothed loss, display lines, snapshots),
Solver::Solve (snapshot after training, a last display and test), Caffe's log line shapes,
and Caffe's signal actions (stop / snapshot, checked between iterations).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.frontend.errors import SolverError
from caffe2jax.lowering.model import Model
from caffe2jax.lowering.python_blobs import retrace, settle, user_errors
from caffe2jax.lowering.registry import NetState, carry_of, data_layers
from caffe2jax.runtime.formats.atomic import remove_stale_temps
from caffe2jax.runtime.formats.snapshot import resume_path
from caffe2jax.runtime.parallel import data_parallel
from caffe2jax.runtime.parallel.devices import make_mesh
from caffe2jax.runtime.train import snapshots, solvers
from caffe2jax.runtime.train.compiled import CompiledNet, shared_layers
from caffe2jax.runtime.train.detection_eval import DetectionTally, check_eval
from caffe2jax.runtime.train.rules import check_solver_type
from caffe2jax.runtime.train.setup import (
    long_test_warnings,
    net_sources,
    net_state,
    read_solver_param,
)
from caffe2jax.runtime.train.state import LossWindow, Pass, TrainState, train_step
from caffe2jax.runtime.train.step import Trainer, merge

log = logging.getLogger("caffe2jax")

__all__ = ["CompiledNet", "SolverLoop", "resume_path", "shared_layers"]


class SolverLoop:
    """A Caffe solver over a train net and its test nets, driving a :class:`TrainState`."""

    def __init__(self, source: Any, *, logger: logging.Logger | None = None,
                 devices: str | int | Sequence[int] | None = None,
                 precision: str | None = None, dialect: str | None = None):  # fmt: skip
        """``devices`` (Caffe's ``-gpu``: ``"all"``, ``"0,1"``, ids) trains data-parallel on
        a mesh of them, each running the net's batch_size; ``None``: the default device.
        ``precision`` (``"fp32"``, ``"tf32"``, ``"bf16"``; None: fp32) is how the train and
        test nets' layers compute (lowering/engines/precision.py). ``dialect``: the fork
        numbering of every net of the solver, as for a Net (a fork's caffe.proto too)."""
        self.precision, self.dialect = precision, dialect
        self.mesh = make_mesh(devices) if devices is not None else None
        self.param, self.folder = read_solver_param(source, dialect)
        self.log = logger or log
        check_solver_type(self.param)
        check_eval(self.param)
        if self.mesh is not None and self.param.eval_type == "detection":
            raise SolverError("eval_type detection is not supported with several devices")
        p = self.param
        self.seed = int(p.random_seed if p.random_seed >= 0 else time.time_ns() % 2**31)
        self._build_nets()
        if self.mesh is not None:
            data_parallel.check_loop(self)
        self._build_trainer()
        self.last_pass: Pass | None = None
        self.last_outputs: dict[str, Any] = {}
        self.last_test_env: list[dict | None] = [None] * len(self.tests)
        self.tests_run = 0
        self.window = LossWindow(p.average_loss)
        self._pending: list[tuple[int, Any]] = []
        self.stopped = False
        self._snapshot_requested = False
        self.on_iteration: Callable[[int], None] | None = None
        self.on_start: list[Callable[[], None]] = []
        self.on_gradients_ready: list[Callable[[], None]] = []
        if p.snapshot_prefix:  # temp files an interrupted snapshot left behind
            prefix = Path(p.snapshot_prefix)
            remove_stale_temps(prefix.parent if str(prefix.parent) else Path("."), prefix.name)

    def _build_nets(self) -> None:
        """Solver::InitTrainNet and InitTestNets: the train net, the test nets (sharing the
        train net's layers by name), each with its data layers."""
        p = self.param
        train, tests = net_sources(p, self.folder)
        train_state = p.train_state if p.HasField("train_state") else None
        common = {"base_dir": self.folder, "seed": self.seed, "precision": self.precision,
                  "dialect": self.dialect}  # fmt: skip
        self.train = CompiledNet.build(
            train, ir.TRAIN, state=net_state(caffe_pb2.TRAIN, train, train_state, self.dialect),
            **common)  # fmt: skip
        self.tests = [
            CompiledNet.build(net, ir.TEST, **common,
                              state=net_state(caffe_pb2.TEST, net,
                                              p.test_state[i] if p.test_state else None,
                                              self.dialect))
            for i, net in enumerate(tests)
        ]  # fmt: skip
        self.shares = [shared_layers(self.train.model, t.model) for t in self.tests]
        for warning in long_test_warnings(p, self.tests):
            self.log.warning(warning)
        for layer in self.train.model.net.layers:
            if layer.type in data_layers("sink"):
                self.log.warning(
                    f"{layer.type} layer '{layer.name}' in the train net is not written during "
                    "the compiled train steps (test nets and Net.forward write it)"
                )

    def _build_trainer(self) -> None:
        """The params from the fillers, the compiled step, the train state, and the test
        nets' own state and forwards."""
        key = jax.random.key(self.seed)
        params, state = self.train.model.init(key)
        try:
            self.trainer = Trainer(self.train.model, self.param, params, state, self.mesh)
        except ValueError as err:
            raise SolverError(str(err)) from None
        self.ts = TrainState(params, state, self.trainer.init(params, state), key)
        self.test_states = [t.model.init(key)[1] for t in self.tests]
        if self.mesh is not None:  # one input shape on a mesh
            self._test_forward = [data_parallel.test_forward(t.model, self.mesh)
                                  for t in self.tests]  # fmt: skip

    # -- requests from signal handlers ----------------------------------------------------

    def request_stop(self) -> None:
        """Finish the current iteration, then stop (Caffe's SolverAction STOP)."""
        self.stopped = True

    def request_snapshot(self) -> None:
        """Snapshot after the current iteration and go on (Caffe's SolverAction SNAPSHOT)."""
        self._snapshot_requested = True

    # -- training ---------------------------------------------------------------------------

    @property
    def iter(self) -> int:
        return self.ts.iteration

    def set_iter(self, value: int) -> None:
        self.ts = self.ts.replace(iteration=int(value))

    @property
    def smoothed_loss(self) -> float:
        self._flush_losses()
        return self.window.smoothed

    def _passes(self, fill: Callable[[dict], dict] | None) -> list[dict[str, Any]]:
        """The inputs of each of the iter_size forwards: data layers advance per forward;
        ``fill`` supplies Input blobs (pycaffe: what the script put in ``net.blobs``)."""
        out = []
        for _ in range(self.trainer.iter_size):
            if self.mesh is None:
                fed = self.train.next_inputs()
                out.append(fill(fed) if fill is not None else fed)
                continue
            # Caffe's solvers each read their own batch_size: one batch per device
            plan = data_parallel.plan_of(self.mesh.size, self.mesh)
            fed = data_parallel.read_round(self.train.feeder, plan, 0, self.mesh.size, self.mesh)
            fed = [fill(f) if fill is not None else f for f in fed]
            out.append(data_parallel.assemble(fed, self.mesh))
        return self.train.feeder.padded_alike(out) if self.mesh is None else out

    def _flush_losses(self) -> None:
        for iteration, loss in self._pending:
            self.window.add(float(loss), iteration)
        self._pending = []

    @user_errors()
    def step(self, iters: int, fill: Callable[[dict], dict] | None = None) -> None:
        """Caffe's Solver::Step: ``iters`` iterations (tests, display and snapshots included);
        a stop request ends it after the current iteration."""
        p = self.param
        self.window = LossWindow(p.average_loss, self.iter)
        self._pending = []
        stop = self.iter + iters
        timer, last_iter = time.perf_counter(), self.iter
        while self.iter < stop and not self.stopped:
            if (
                p.test_interval
                and self.iter % p.test_interval == 0
                and (self.iter > 0 or p.test_initialization)
            ):
                self.test_all()
            iteration = self.iter
            for callback in self.on_start:
                callback()
            display = p.display and iteration % p.display == 0
            if display:
                lr = float(solvers.current_lr(p, self.ts.opt_state))
            self.ts, loss, self.last_outputs, self.last_pass = self._train_step(fill)
            for callback in self.on_gradients_ready:
                callback()
            self._pending.append((iteration, loss))
            if display:
                self._flush_losses()
                lapse = time.perf_counter() - timer
                rate = (iteration - last_iter) / (lapse or 1)
                self.log.info(
                    f"Iteration {iteration} ({rate:.6g} iter/s, {lapse:.6g}s/{p.display} "
                    f"iters), loss = {self.window.smoothed:.6g}"
                )
                self.log_outputs("Train", self.train.model, self.last_outputs)
                self.log.info(f"Iteration {iteration}, lr = {lr:.6g}")
                timer, last_iter = time.perf_counter(), iteration
            if self.on_iteration is not None:
                self.on_iteration(self.iter)
            if (p.snapshot and self.iter % p.snapshot == 0) or self._snapshot_requested:
                self._snapshot_requested = False
                self.snapshot()
        # the losses are folded into the smoothed loss when it is read: waiting for them here
        # would stall a step(1) loop on every call

    def _train_step(self, fill: Callable[[dict], dict] | None) -> tuple:
        """One iteration on the next batches; run again at the new shapes when a Python layer
        reshapes its tops in forward (the batches are read once)."""
        passes = self._passes(fill)

        def run() -> tuple:
            out = train_step(self.trainer, self.ts, passes)
            return settle(self.train.model.net, out)

        return retrace(run)

    def solve(self, resume_file: str | os.PathLike | None = None) -> None:
        """Caffe's Solver::Solve: optionally restore, train to max_iter, snapshot, last test."""
        p = self.param
        self.log.info(f"Solving {self.train.model.net.name}")
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
            loss = self._final_loss()
            self.window.add(loss, self.iter)
            self.log.info(f"Iteration {self.iter}, loss = {self.window.smoothed:.6g}")
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        self.log.info("Optimization Done.")

    @user_errors()
    def _final_loss(self) -> float:
        """Solve's extra forward after the last update (its loss is displayed)."""
        model = self.train.model
        self.train.key, rng = jax.random.split(self.train.key)
        if self.mesh is not None:
            # the root solver's forward on its own batch (device 0)
            forward = data_parallel.test_forward(model, self.mesh)
            params, state = self.trainer.place(self.ts.params, self.ts.state)
            keys = data_parallel.shard_keys([rng] * self.mesh.size, self.mesh)
            _, (_, objective), state = forward(params, state,
                                               self._passes(None)[0], keys)  # fmt: skip
            self.ts = self.ts.replace(state=state)
            return float(np.asarray(objective)[0])
        inputs = self._passes(None)[0]

        def run() -> tuple:
            model = self.train.member(inputs)
            blobs, state = model.apply(self.ts.params, self.ts.state, inputs, rng)
            return settle(model.net, (model.graph.objective(blobs), state))

        objective, state = retrace(run)
        self.ts = self.ts.replace(state=state)
        return float(objective)

    # -- testing ----------------------------------------------------------------------------

    @staticmethod
    def _forward_fn(model: Model) -> Callable:
        def forward(params, state, inputs, rng):
            return model.apply(params, state, inputs, rng)

        return forward

    def _test_forward_on(self, net: CompiledNet, params, state, inputs, rng) -> tuple:
        """A test net's forward on ``inputs`` (the program of their shapes)."""
        forward = net.program("test", inputs, lambda m: jax.jit(self._forward_fn(m)))
        return settle(net.model.net, forward(params, state, inputs, rng))

    def test_params(self, index: int) -> tuple[dict, dict]:
        """The test net's params and state with the train net's shared in (by layer name)."""
        params, state = {}, {}
        mine = self.test_states[index]
        test = self.tests[index].model
        shared = set(self.shares[index])
        merged = merge(self.ts.params, self.ts.state)
        for name, j, decl in test.graph.owned():
            tree = state if decl.state else params
            blobs = tree.setdefault(name, [None] * len(test.graph.decls[name]))
            blobs[j] = merged[name][j] if (name, j) in shared else mine[name][j]
        state = NetState(state, carry_of(mine))
        return params, state

    def test_all(self) -> list[dict[str, float]]:
        return [self.test(i) for i in range(len(self.tests))]

    @user_errors()
    def test(self, index: int) -> dict[str, float]:
        """Caffe's Solver::Test: mean of each output over test_iter forwards."""
        self.log.info(f"Iteration {self.iter}, Testing net (#{index})")
        net = self.tests[index]
        iters = self.param.test_iter[index]
        params, state = self.test_params(index)
        if self.mesh is not None:
            return data_parallel.test_on_mesh(self, index, params, state,
                                              self._test_forward[index])  # fmt: skip
        sums: dict[str, Any] = {}
        loss = 0.0
        blobs = None
        tally = DetectionTally() if self.param.eval_type == "detection" else None
        for _ in range(iters):
            if self.stopped:  # Caffe checks for a stop request before each test batch
                self.log.info("Test interrupted.")
                return {}
            net.key, rng = jax.random.split(net.key)
            inputs = net.next_inputs()
            run = functools.partial(self._test_forward_on, net, params, state, inputs, rng)
            blobs, state = retrace(run)
            net.sinks.write(blobs)
            if self.param.test_compute_loss:
                loss += float(net.member(inputs).graph.objective(blobs))
            for j, name in enumerate(net.model.outputs):
                if tally is not None:  # the fork's TestDetection
                    tally.add(j, name, np.asarray(blobs[name]))
                    continue
                value = np.asarray(blobs[name], np.float64)
                sums[name] = sums.get(name, 0) + value
        self.test_states[index] = NetState(self.test_states[index], carry_of(state))
        self.last_test_env[index] = blobs
        self.tests_run += 1
        if not iters:  # Caffe's test_iter 0: no batches, no output lines
            return {}
        if self.param.test_compute_loss:
            self.log.info(f"Test loss: {loss / iters:.6g}")
        if tally is not None:
            p = self.param
            return tally.report(self.log, list(net.model.outputs), p.ap_version,
                                p.show_per_class_result)  # fmt: skip
        return self.log_outputs("Test", net.model, {k: v / iters for k, v in sums.items()})

    def log_outputs(self, which: str, model: Model, outputs: dict[str, Any]) -> dict[str, float]:
        """Caffe's ``Train/Test net output #k: name = v (* w = w·v loss)`` lines."""
        net = model.net
        weights = {user: weight for layer in net.layers
                   for user, weight in zip(layer.top_names, layer.loss_weights)}  # fmt: skip
        scores, index = {}, 0
        for name in net.outputs:
            weight = weights.get(name, 0.0)
            for value in np.atleast_1d(np.asarray(outputs[name], np.float64)).ravel():
                extra = f" (* {weight:g} = {weight * value:.6g} loss)" if weight else ""
                self.log.info(f"    {which} net output #{index}: {name} = {value:.6g}{extra}")
                scores[name] = float(value)
                index += 1
        return scores

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> tuple[Path, Path] | None:
        """Caffe's Snapshot: weights then solver state, each written atomically."""
        return snapshots.snapshot(self)

    def restore(self, path: str | os.PathLike) -> None:
        """Caffe's Restore: iter, current_step and history; the weights from ``learned_net``."""
        snapshots.restore(self, path)

    def copy_trained_layers(self, path: str | os.PathLike, dialect: str | None = None) -> None:
        """Caffe's CopyLayers into the train net (test nets share its layers); ``dialect``:
        the fork numbering of a binary file (default: the net's)."""
        from caffe2jax.runtime.formats.weights import load_weights

        params, state = load_weights(path, self.train.model, self.ts.params, self.ts.state,
                                     dialect=dialect)  # fmt: skip
        self.ts = self.ts.replace(params=params, state=state)
        for i, net in enumerate(self.tests):
            tp, ts = self.test_params(i)
            loaded = load_weights(path, net.model, tp, ts, dialect=dialect)[1]
            self.test_states[i] = {**self.test_states[i], **loaded}

    def close(self) -> None:
        """Stop every net's data prefetching and close its files."""
        for net in [self.train, *self.tests]:
            net.close()
