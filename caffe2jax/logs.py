"""Caffe-shaped logging: glog line prefixes, a log file, and a progress bar on terminals.

Lines look like Caffe's (``I1122 19:20:43.994473 12345 solver.py:220] Iteration 100, loss =
0.3``), so Caffe's own log tools (parse_log.py, plot_training_log.py) read our logs.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import TextIO

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
    """A one-line progress bar redrawn in place on a terminal."""

    def __init__(self, total: int, stream: TextIO = sys.stderr, width: int = 30):
        self.total, self.stream, self.width = max(total, 1), stream, width
        self.start = time.perf_counter()
        self.status = ""

    def update(self, done: int, start: int = 0) -> None:
        frac = min(max(done - start, 0) / max(self.total - start, 1), 1.0)
        filled = int(frac * self.width)
        elapsed = time.perf_counter() - self.start
        rate = (done - start) / elapsed if elapsed > 0 else 0.0
        bar = "=" * filled + (">" if filled < self.width else "") + " " * (self.width - filled - 1)
        line = f"\r[{bar}] {done}/{self.total} iters {rate:6.1f} it/s {self.status}"
        self.stream.write(line[:120].ljust(80))
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


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
