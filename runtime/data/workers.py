"""The data pipeline's workers: how many, and the threads they run in.

Decoding and transforming run in a pool of threads. They run in parallel because the work
happens outside the GIL: OpenCV's ``imdecode`` releases it, and so do numpy's ufuncs (the
transform's subtract and multiply); measured, two threads decode and transform 2.0× the
images of one (Pillow's decoder, the fallback, 1.5×). Threads write straight into the batch
being filled: no process boundary, nothing pickled or copied.

The number of workers defaults to the cores this process may run on: its CPU affinity
(psutil's ``cpu_affinity``, every OS that has one), capped by the CPU quota of the process's
own cgroup (``cpu.max``, or cgroup v1's ``cpu.cfs_quota_us``, as a container limits it; read
here because loky's and joblib's ``cpu_count`` read only the hierarchy's root).
``CAFFE2JAX_DATA_WORKERS`` or :func:`set_default_workers` (the CLI's ``--data_workers``) sets
it; 0 decodes in the prefetch thread itself, as Caffe's one prefetch thread per data layer does.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from caffe2jax.frontend import environment
from caffe2jax.frontend.errors import DataError

_ENV = "CAFFE2JAX_DATA_WORKERS"
_CGROUP = Path("/sys/fs/cgroup")
_default: int | None = None
_pools: dict[int, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def _cgroup_quota(root: Path = _CGROUP, proc: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs the process's cgroup allows (quota / period), None when unlimited or unknown."""
    candidates = []
    try:
        for line in proc.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":  # cgroup v2
                candidates.append(root / path.lstrip("/") / "cpu.max")
            elif "cpu" in controllers.split(","):
                for folder in ("cpu,cpuacct", "cpu"):
                    candidates.append(root / folder / path.lstrip("/") / "cpu.cfs_quota_us")
    except (OSError, ValueError):
        pass
    candidates += [root / "cpu.max", root / "cpu" / "cpu.cfs_quota_us"]
    for file in candidates:
        quota = _read_quota(file)
        if quota is not None:
            return quota
    return None


def _read_quota(file: Path) -> float | None:
    try:
        text = file.read_text().split()
        if file.name == "cpu.max":
            quota, period = text[0], text[1]
        else:
            quota, period = text[0], file.with_name("cpu.cfs_period_us").read_text().split()[0]
    except (OSError, IndexError):
        return None
    if quota in ("max", "-1"):
        return None
    return int(quota) / int(period) if int(period) > 0 and int(quota) > 0 else None


def available_cores() -> int:
    """The cores this process may use: its affinity, capped by its cgroup's CPU quota
    (rounded up: a quota of 1.5 CPUs keeps 2 workers busy part of the time)."""
    try:  # psutil: Linux, Windows and FreeBSD; macOS has no affinity
        cores = len(psutil.Process().cpu_affinity())
    except (AttributeError, OSError, psutil.Error):
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def set_default_workers(count: int | None) -> None:
    """The workers data layers opened from now on use (None: back to the default)."""
    if count is not None and count < 0:
        raise DataError(f"the number of data workers must be >= 0, not {count}")
    global _default
    _default = count


def default_workers() -> int:
    """:func:`set_default_workers`'s value, else ``CAFFE2JAX_DATA_WORKERS``, else
    :func:`available_cores`."""
    if _default is not None:
        return _default
    text = environment.value(_ENV)
    if text:
        try:
            count = int(text)
        except ValueError:
            raise DataError(f"{_ENV}={text!r} is not a number of workers") from None
        if count < 0:
            raise DataError(f"{_ENV} must be >= 0, not {count}")
        return count
    return available_cores()


def worker_pool(count: int) -> ThreadPoolExecutor:
    """The process's pool of ``count`` worker threads, shared by every data layer (a test
    net's reader and the train net's take turns rather than doubling the threads)."""
    with _lock:
        pool = _pools.get(count)
        if pool is None:
            pool = _pools[count] = ThreadPoolExecutor(count, thread_name_prefix="data-worker")
        return pool
