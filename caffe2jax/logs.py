"""Caffe-shaped logging: glog line prefixes, a log file, and a progress bar (tqdm) on terminals.

Lines look like Caffe's (``I1122 19:20:43.994473 12345 solver.py:220] Iteration 100, loss =
0.3``), so Caffe's own log tools (parse_log.py, plot_training_log.py) read our logs. The prefix is
written here, not by ``absl.logging``: absl's ``get_absl_log_prefix`` has glog's layout but
puts Python's thread ident (``threading.get_ident()``, a 15-digit address) where glog puts a
5-wide process/thread id, so its lines are not Caffe's.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

LOGGER = "caffe2jax"
_LEVELS = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E"}


class GlogFormatter(logging.Formatter):
    """``<L><mmdd> <hh:mm:ss.uuuuuu> <pid> <file>:<line>] <message>``, as glog writes."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.localtime(record.created)
        micros = int((record.created % 1) * 1e6)
        head = (
            f"{_LEVELS.get(record.levelno, 'F')}{time.strftime('%m%d %H:%M:%S', stamp)}."
            f"{micros:06d} {os.getpid():5d} {record.filename}:{record.lineno}]"
        )
        return f"{head} {record.getMessage()}"


class ProgressBar:
    """Training's progress bar, drawn by tqdm: iterations done of ``total``, the rate, the time
    left (ETA) and a status (the last loss, the input wait). Lines that must stay on screen
    are written above it (:meth:`write`, tqdm's ``write``), never through it."""

    def __init__(self, total: int, stream: TextIO = sys.stderr):
        self.stream, self.started = stream, False
        self.bar = tqdm(total=max(total, 1), file=stream, unit="iter", dynamic_ncols=True,
                        mininterval=0.2, smoothing=0.1)  # fmt: skip

    @property
    def status(self) -> str:
        return self.bar.postfix or ""

    @status.setter
    def status(self, text: str) -> None:
        self.bar.set_postfix_str(text, refresh=False)

    def update(self, done: int) -> None:
        """``done`` iterations are done (the bar redraws at most every 0.2 s). The first call
        starts the clock there: a resumed run's rate and ETA count its own iterations only."""
        if not self.started:
            self.started = True
            self.bar.reset(self.bar.total)
            self.bar.initial = self.bar.n = self.bar.last_print_n = max(done - 1, 0)
        if done > self.bar.n:
            self.bar.update(done - self.bar.n)

    def write(self, line: str) -> None:
        """``line`` above the bar, which is redrawn below it."""
        self.bar.write(line, file=self.stream)

    def close(self) -> None:
        self.bar.close()


def setup(
    log_file: str | os.PathLike | None, *, console: bool = True, append: bool = False
) -> logging.Logger:
    """The caffe2jax logger writing Caffe-format lines to ``log_file`` (appended to when
    ``append``, e.g. a resumed run) and, when ``console``, to stderr (as glog does)."""
    logger = logging.getLogger(LOGGER)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    formatter = GlogFormatter()
    if log_file is not None:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_file, mode="a" if append else "w", encoding="utf-8")
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    if console:
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(formatter)
        logger.addHandler(stream)
    return logger


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: the current ``sys.stderr``, looked up at call time) is a
    terminal; a closed or detached stream is not."""
    stream = sys.stderr if stream is None else stream
    try:
        return hasattr(stream, "isatty") and stream.isatty()
    except ValueError:
        return False
