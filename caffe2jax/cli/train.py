"""`caffe2jax train --solver S [--weights W | --snapshot X.solverstate]`, like `caffe train`.

Pre-flight (before any net is built): an earlier run's snapshots (``<snapshot_prefix>_iter_*``)
or log are not overwritten unless training resumes (``--snapshot``, the log is then appended
to) or ``--force`` is given. Signals as Caffe's ``-sigint_effect``/``-sighup_effect``
(stop|snapshot|none, defaults stop and snapshot), acted on between iterations; a second
Ctrl-C exits at once with status 130.

Progress shows how long the steps waited for data (input-bound time): on the progress bar,
and in log mode a line after each display line (``Iteration N, input wait = 0.12s (3.1% of
3.9s)``), which Caffe's log parsers pass over. ``--data_workers`` sets the threads decoding
and transforming each data layer (default: the cores this process may use).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path

from caffe2jax import logs
from caffe2jax.cli.args import Subparsers, add_dialect, int32
from caffe2jax.frontend.errors import CaffeError, SolverError
from caffe2jax.runtime.host.process import exit_now


def add(sub: Subparsers) -> None:
    p = sub.add_parser("train", help="train a net with a Caffe solver prototxt")
    p.add_argument("--solver", required=True, help="solver prototxt")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--weights", help="comma-separated .caffemodel file(s) to fine-tune from")
    group.add_argument("--snapshot", help=".solverstate to resume training from")
    add_dialect(p, "the fork numbering --weights were written with (default: from the net)")
    p.add_argument("--iterations", type=int32, help="override the solver's max_iter")
    p.add_argument("--log", help="log file (default: <solver name>.log in this folder)")
    p.add_argument("--force", action="store_true", help="overwrite an earlier run's files")
    for sig, default in (("sigint", "stop"), ("sighup", "snapshot")):
        p.add_argument(
            f"--{sig}_effect",
            f"-{sig}_effect",
            choices=EFFECTS,
            default=default,
            help=f"what {sig.upper()} does between iterations (Caffe's default: {default})",
        )
    p.add_argument(
        "--progress",
        choices=["auto", "bar", "log"],
        default="auto",
        help="a progress bar (terminals, by default) or Caffe's log lines on stderr",
    )
    p.add_argument("--data_workers", "-data_workers", type=int32, metavar="N",
                   help="threads decoding and transforming each data layer's images (default: "
                   "the cores this process may use; 0: in its prefetch thread)")  # fmt: skip
    _add_device_flags(p)
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"],
                   help="how layers compute (weights and solver history stay fp32)")  # fmt: skip
    p.set_defaults(func=run)


def _add_device_flags(p: argparse.ArgumentParser) -> None:
    """Caffe's -gpu, and the processes of a multi-host run (jax.distributed)."""
    p.add_argument("--gpu", help="devices to train on: 'all' or ids like 0,1 (Caffe's -gpu)")
    p.add_argument("--coordinator", help="HOST:PORT of process 0, for multi-process training")
    p.add_argument("--num-processes", type=int32, help="number of processes (multi-process)")
    p.add_argument("--process-id", type=int32, help="this process's rank, 0..N-1 (multi-process)")
    p.add_argument("--timeout", type=int32, default=60,
                   help="seconds to wait for all processes to join (default 60)")  # fmt: skip


def _join_processes(args: argparse.Namespace) -> str | None:
    """jax.distributed from the flags or environment; the device spec to train on (every
    device of every process when several processes joined and --gpu is not given)."""
    from caffe2jax.runtime.parallel import devices

    setup = devices.distributed_params(args.coordinator, args.num_processes, args.process_id)
    if setup is None:
        return args.gpu
    devices.initialize(*setup, timeout_s=args.timeout)
    return args.gpu or "all"


EFFECTS = ("stop", "snapshot", "none")


def _snapshot_files(prefix: str) -> list[Path]:
    """Files an earlier run with this ``snapshot_prefix`` left (Caffe's SnapshotFilename)."""
    if not prefix:
        return []
    base = Path(prefix)
    folder = base.parent if str(base.parent) else Path(".")
    if not folder.is_dir():
        return []
    start = base.name + "_iter_"
    kinds = (".caffemodel", ".solverstate", ".caffemodel.h5", ".solverstate.h5")
    return sorted(
        f for f in folder.iterdir() if f.name.startswith(start) and f.name.endswith(kinds)
    )


def preflight(args: argparse.Namespace, log_file: Path) -> None:
    """Refuse to overwrite an earlier run's snapshots or log unless resuming or forced."""
    from caffe2jax.runtime.train.setup import check_solver, read_solver_param

    param, folder = read_solver_param(args.solver)
    if args.iterations is not None:
        param.max_iter = args.iterations
    check_solver(param, args.solver)
    check_train_net_fits(param, folder)
    if args.force or args.snapshot:
        return
    earlier = _snapshot_files(param.snapshot_prefix)
    if earlier:
        raise CaffeError(
            f"{args.solver}: snapshots of an earlier run exist ({earlier[-1]}, {len(earlier)} "
            "file(s)); resume with --snapshot FILE.solverstate or pass --force to overwrite"
        )
    if log_file.exists():
        raise CaffeError(f"{log_file} exists (an earlier run's log); pass --force or --log FILE")


def check_train_net_fits(param, folder: Path) -> None:
    """The size check before anything is compiled or prefetched: the train net's blobs (as
    shaped by its data sources, read without prefetching) must fit the device."""
    from caffe2jax.frontend import caffe_pb2
    from caffe2jax.frontend.pipeline import load_net
    from caffe2jax.lowering.model import Model
    from caffe2jax.lowering.registry import type_problem
    from caffe2jax.runtime.data.feeding import source_shapes
    from caffe2jax.runtime.host.memory import check_net_fits
    from caffe2jax.runtime.train.setup import net_sources, net_state

    train, _ = net_sources(param, folder)
    extra = param.train_state if param.HasField("train_state") else None
    net = load_net(train, "TRAIN", state=net_state(caffe_pb2.TRAIN, train, extra),
                   layer_types=type_problem)  # fmt: skip
    shapes, _ = source_shapes(net, folder)
    try:
        model = Model(net, shapes)
    except CaffeError:
        return  # the Solver reports it, with its own context
    check_net_fits(model.net, itemsize=8, params=model.graph.decls)


def install_signals(solver, sigint: str, sighup: str) -> dict[int, object]:
    """Caffe's SignalHandler: SIGINT/SIGHUP request a stop or a snapshot, acted on between
    iterations; with an effect other than none, a second SIGINT exits at once (status 130).
    Returns the previous handlers."""
    seen = {"sigint": 0}

    def act(effect: str) -> None:  # no logging here: a handler may run inside a log call
        if effect == "stop":
            solver.request_stop()
        elif effect == "snapshot":
            solver.request_snapshot()

    def on_sigint(signum, frame) -> None:
        if sigint == "none":
            return
        seen["sigint"] += 1
        previous.pop(signal.SIGINT, None)  # keep this handler to the end: a second ^C exits
        if seen["sigint"] > 1:
            exit_now(130, "caffe2jax train: interrupted again; exiting now\n")
        sys.stderr.write(
            f"caffe2jax train: {sigint} after this iteration (Ctrl-C again: exit now)\n"
        )
        sys.stderr.flush()
        act(sigint)

    def on_sighup(signum, frame) -> None:
        if sighup != "none":
            act(sighup)

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, on_sigint)}
    if hasattr(signal, "SIGHUP"):
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_sighup)
    return previous


def _progress_handler(bar: logs.ProgressBar, shown: dict) -> logging.Handler:
    """Shows test results and the end of training above the bar; the rest goes to the file.
    ``shown`` holds the bar's parts (the last loss or result, the input wait)."""

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "Test net output" in message or "Optimization Done" in message:
                bar.write(message.strip())
                shown["status"] = message.strip().split(": ", 1)[-1][:40]
            elif ", loss = " in message:
                shown["status"] = "loss " + message.rsplit("= ", 1)[-1]
            bar.status = " ".join(v for v in (shown["status"], shown["input"]) if v)

    return Handler()


def input_wait_progress(solver, logger: logging.Logger, bar: logs.ProgressBar | None,
                        shown: dict) -> None:  # fmt: skip
    """Report how long the train steps waited for their data: the bar shows the share of
    the time since the last display, log mode logs it after each display line."""
    feeder = solver.train.feeder
    last = {"time": time.perf_counter(), "waited": feeder.stats().get("waited_s", 0.0)}

    def on_iteration(iteration: int) -> None:
        display = solver.param.display
        if display and (iteration - 1) % display == 0:
            now, waited = time.perf_counter(), feeder.stats().get("waited_s", 0.0)
            lapse, wait = now - last["time"], waited - last["waited"]
            last.update(time=now, waited=waited)
            share = 100 * wait / lapse if lapse > 0 else 0.0
            shown["input"] = f"input-bound {share:.0f}%"
            if bar is None:
                logger.info(f"Iteration {iteration - 1}, input wait = {wait:.3g}s "
                            f"({share:.1f}% of {lapse:.3g}s)")  # fmt: skip
        if bar is not None:
            bar.status = " ".join(v for v in (shown["status"], shown["input"]) if v)
            bar.update(iteration)

    solver.on_iteration = on_iteration


def _quiet_logger() -> logging.Logger:
    logger = logging.getLogger("caffe2jax.worker")
    logger.setLevel(logging.WARNING)
    return logger


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except SolverError as err:
        text = str(err)
        raise SolverError(text if args.solver in text else f"{args.solver}: {text}") from None


def _run(args: argparse.Namespace) -> int:
    from caffe2jax.runtime.parallel.devices import is_primary, select
    from caffe2jax.runtime.train.loop import SolverLoop

    gpu = _join_processes(args)
    log_file = Path(args.log) if args.log else Path(Path(args.solver).stem + ".log")
    if args.iterations is not None and args.iterations < 0:
        raise CaffeError(f"--iterations must be >= 0, got {args.iterations}")
    if gpu is not None:  # bad ids fail before anything is written
        select(gpu)
    if args.data_workers is not None:
        from caffe2jax.runtime.data.workers import set_default_workers

        set_default_workers(args.data_workers)
    if is_primary():
        preflight(args, log_file)
    use_bar = is_primary() and (
        args.progress == "bar" or (args.progress == "auto" and logs.is_terminal())
    )
    # Caffe's root solver logs; other processes keep quiet (their warnings still show)
    logger = (logs.setup(log_file, console=not use_bar, append=bool(args.snapshot))
              if is_primary() else _quiet_logger())  # fmt: skip
    solver = SolverLoop(args.solver, logger=logger, devices=gpu, precision=args.precision)
    if args.iterations is not None:
        solver.param.max_iter = args.iterations
    if args.weights:
        for path in args.weights.split(","):
            logger.info(f"Finetuning from {path}")
            solver.copy_trained_layers(path, dialect=args.dialect)
    bar, shown = None, {"status": "", "input": ""}
    if use_bar:
        bar = logs.ProgressBar(solver.param.max_iter)
        logger.addHandler(_progress_handler(bar, shown))
    if is_primary():
        input_wait_progress(solver, logger, bar, shown)
    previous = install_signals(solver, args.sigint_effect, args.sighup_effect)
    try:
        solver.solve(args.snapshot)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        solver.close()
        if bar is not None:
            bar.close()
    if solver.stopped:
        print(f"Stopped at iteration {solver.iter}; snapshot written. Log: {log_file}")
    elif use_bar:
        print(f"Done: {solver.iter} iterations. Log: {log_file}")
    return 0
