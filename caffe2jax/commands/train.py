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
    # issue 13 (precision): bf16/tf32 compute, fp32 master weights and solver history
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"],
                   help="how layers compute (weights and solver history stay fp32)")  # fmt: skip
    p.set_defaults(func=run)


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


def run(args: argparse.Namespace) -> int:
    from caffe2jax.api import default_precision
    from caffe2jax.runtime.solver_loop import SolverLoop

    log_file = Path(args.log) if args.log else Path(Path(args.solver).stem + ".log")
    use_bar = args.progress == "bar" or (args.progress == "auto" and logs.is_terminal())
    logger = logs.setup(log_file, console=not use_bar)
    with default_precision(args.precision):  # issue 13: nets the loop compiles use it
        solver = SolverLoop(args.solver, logger=logger)
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
