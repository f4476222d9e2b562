"""pycaffe's process-level names: ``layer_type_list``, ``Timer``, ``init_log``/``log``.

The multi-GPU names (``has_nccl``, ``NCCL``, ``solver_count``, ``solver_rank``…) live in
:mod:`caffe2jax.pycaffe.multigpu`, answered by the data-parallel runtime.
"""

from __future__ import annotations

import logging
import sys
import time

from caffe2jax.frontend.errors import CaffeError
from caffe2jax.logs import LOGGER, GlogFormatter

# glog's minloglevel: 0 INFO, 1 WARNING, 2 ERROR, 3 FATAL.
_GLOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.CRITICAL}


def layer_type_list() -> list[str]:
    """Every layer type string a net may use, sorted (Caffe's LayerRegistry::LayerTypeList)."""
    from caffe2jax.lowering.registry import registered_types

    return registered_types()


class Timer:
    """pycaffe's ``caffe.Timer``: ``start()``, ``stop()``, and ``ms`` (milliseconds between
    them; reading ``ms`` while running stops the timer first, as Caffe's Timer does)."""

    def __init__(self) -> None:
        self._start: float | None = None
        self._elapsed = 0.0
        self._running = False

    def start(self) -> None:
        self._start = time.perf_counter()
        self._running = True

    def stop(self) -> None:
        if self._running:
            self._elapsed = time.perf_counter() - self._start
            self._running = False

    @property
    def ms(self) -> float:
        if self._start is None:
            logging.getLogger(LOGGER).warning("Timer has never been run before reading time.")
            return 0.0
        self.stop()
        return self._elapsed * 1e3


class _InitLogHandler(logging.StreamHandler):
    """The one stderr handler :func:`init_log` adds (a second call does not add another)."""


def init_log(level: int = 0, use_stderr: bool = True) -> None:
    """pycaffe's ``init_log([level[, stderr]])``: Caffe-format log lines at glog's
    ``minloglevel`` (0 INFO … 3 FATAL). Lines always go to stderr (glog's log files are not
    written)."""
    if level not in _GLOG_LEVELS:
        raise CaffeError(f"init_log level must be 0 (INFO) to 3 (FATAL), got {level}")
    logger = logging.getLogger(LOGGER)
    logger.setLevel(_GLOG_LEVELS[level])
    logger.propagate = False
    if not any(isinstance(h, _InitLogHandler) for h in logger.handlers):
        handler = _InitLogHandler(sys.stderr)
        handler.setFormatter(GlogFormatter())
        logger.addHandler(handler)


def log(message: str) -> None:
    """pycaffe's ``caffe.log``: one INFO line in Caffe's format."""
    logging.getLogger(LOGGER).info(str(message))
