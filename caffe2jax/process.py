"""pycaffe's process-level names: ``layer_type_list``, ``Timer``, ``init_log``/``log``,
``has_nccl``, ``solver_count``/``solver_rank``/``set_multiprocess``.

caffe2jax trains in one process: the solver count is 1 and the rank 0 until multi-device
training defines more; ``has_nccl()`` is False because no NCCL build is involved (JAX's own
collectives do that work).
"""

from __future__ import annotations

import logging
import sys
import time

from caffe2jax.errors import CaffeError
from caffe2jax.logs import LOGGER, GlogFormatter

_solver_count = 1
_solver_rank = 0
_multiprocess = False

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


def init_log(level: int = 0, use_stderr: bool = True) -> None:
    """pycaffe's ``init_log([level[, stderr]])``: Caffe-format log lines at glog's
    ``minloglevel`` (0 INFO … 3 FATAL). Lines always go to stderr (glog's log files are not
    written)."""
    if level not in _GLOG_LEVELS:
        raise CaffeError(f"init_log level must be 0 (INFO) to 3 (FATAL), got {level}")
    logger = logging.getLogger(LOGGER)
    logger.setLevel(_GLOG_LEVELS[level])
    logger.propagate = False
    if not any(getattr(h, "_caffe2jax_init_log", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(GlogFormatter())
        handler._caffe2jax_init_log = True
        logger.addHandler(handler)


def log(message: str) -> None:
    """pycaffe's ``caffe.log``: one INFO line in Caffe's format."""
    logging.getLogger(LOGGER).info(str(message))


def has_nccl() -> bool:
    """False: caffe2jax is not built with NCCL (multi-device work uses JAX's collectives)."""
    return False


def solver_count() -> int:
    """The number of training processes (1: caffe2jax trains in one process)."""
    return _solver_count


def set_solver_count(count: int) -> None:
    """Only 1 is supported: multi-process training is not part of caffe2jax yet."""
    global _solver_count
    if int(count) != 1:
        raise CaffeError(f"solver_count {count}: caffe2jax trains in one process; only 1 works")
    _solver_count = 1


def solver_rank() -> int:
    """This process's rank among the solvers (0: the only one)."""
    return _solver_rank


def set_solver_rank(rank: int) -> None:
    """Only 0 is supported (see :func:`set_solver_count`)."""
    global _solver_rank
    if int(rank) != 0:
        raise CaffeError(f"solver_rank {rank}: caffe2jax trains in one process; only 0 works")
    _solver_rank = 0


def multiprocess() -> bool:
    """Whether :func:`set_multiprocess` was called with True."""
    return _multiprocess


def set_multiprocess(value: bool) -> None:
    """Record pycaffe's multiprocess flag; with one process it changes nothing."""
    global _multiprocess
    _multiprocess = bool(value)
