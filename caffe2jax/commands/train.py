"""`caffe2jax train --solver S [--weights W | --snapshot X.solverstate]`, like `caffe train`."""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path

from caffe2jax import logs
from caffe2jax.errors import CaffeError


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a net with a Caffe solver prototxt")
    p.add_argument("--solver", required=True, help="solver prototxt")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--weights", help="comma-separated .caffemodel file(s) to fine-tune from")
    group.add_argument("--snapshot", help=".solverstate to resume training from")
    p.add_argument("--iterations", type=int, help="override the solver's max_iter")
    p.add_argument("--log", help="log file (default: <solver name>.log in this folder)")
    p.add_argument(
        "--progress",
        choices=["auto", "bar", "log"],
        default="auto",
        help="a progress bar (terminals, by default) or Caffe's log lines on stderr",
    )
    _add_device_flags(p)
    p.set_defaults(func=run)


def _add_device_flags(p: argparse.ArgumentParser) -> None:
    """Caffe's -gpu, and the processes of a multi-host run (jax.distributed)."""
    p.add_argument("--gpu", help="devices to train on: 'all' or ids like 0,1 (Caffe's -gpu)")
    p.add_argument("--coordinator", help="HOST:PORT of process 0, for multi-process training")
    p.add_argument("--num-processes", type=int, help="number of processes (multi-process)")
    p.add_argument("--process-id", type=int, help="this process's rank, 0..N-1 (multi-process)")
    p.add_argument("--timeout", type=int, default=60,
                   help="seconds to wait for all processes to join (default 60)")  # fmt: skip


def _join_processes(args: argparse.Namespace) -> str | None:
    """jax.distributed from the flags or environment; the device spec to train on (every
    device of every process when several processes joined and --gpu is not given)."""
    from caffe2jax.runtime import devices

    setup = devices.distributed_params(args.coordinator, args.num_processes, args.process_id)
    if setup is None:
        return args.gpu
    devices.initialize(*setup, timeout_s=args.timeout)
    return args.gpu or "all"


def _progress_handler(bar: logs.ProgressBar) -> logging.Handler:
    """Shows test results and the end of training above the bar; the rest goes to the file."""

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "Test net output" in message or "Optimization Done" in message:
                bar.stream.write("\r" + message.strip().ljust(80) + "\n")
                bar.status = message.strip().split(": ", 1)[-1][:40]
            elif ", loss = " in message:
                bar.status = "loss " + message.rsplit("= ", 1)[-1]

    return Handler()


def _quiet_logger() -> logging.Logger:
    logger = logging.getLogger("caffe2jax.worker")
    logger.setLevel(logging.WARNING)
    return logger


def run(args: argparse.Namespace) -> int:
    from caffe2jax.runtime.devices import is_primary
    from caffe2jax.runtime.solver_loop import SolverLoop

    gpu = _join_processes(args)
    log_file = Path(args.log) if args.log else Path(Path(args.solver).stem + ".log")
    use_bar = is_primary() and (
        args.progress == "bar" or (args.progress == "auto" and logs.is_terminal())
    )
    # Caffe's root solver logs; other processes keep quiet (their warnings still show)
    logger = logs.setup(log_file, console=not use_bar) if is_primary() else _quiet_logger()
    solver = SolverLoop(args.solver, logger=logger, devices=gpu)
    if args.iterations is not None:
        if args.iterations < 0:
            raise CaffeError(f"--iterations must be >= 0, got {args.iterations}")
        solver.param.max_iter = args.iterations
    if args.weights:
        for path in args.weights.split(","):
            logger.info(f"Finetuning from {path}")
            solver.copy_trained_layers(path)
    bar = None
    if use_bar:
        bar = logs.ProgressBar(solver.param.max_iter)
        logger.addHandler(_progress_handler(bar))
        solver.on_iteration = bar.update
    previous = signal.signal(signal.SIGINT, lambda *_: solver.request_stop())
    try:
        solver.solve(args.snapshot)
    finally:
        signal.signal(signal.SIGINT, previous)
        solver.close()
        if bar is not None:
            bar.close()
    if solver.stopped:
        print(f"Stopped at iteration {solver.iter}; snapshot written. Log: {log_file}")
    elif use_bar:
        print(f"Done: {solver.iter} iterations. Log: {log_file}")
    return 0
