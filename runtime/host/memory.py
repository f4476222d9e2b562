"""How much memory this process may still use, and whether a net's blobs fit in it (checked
before compiling: XLA would otherwise try, and fail or swap, long after the user's mistake).

The host figure is the smallest of what the machine has free (``MemAvailable``, read by
psutil on every OS) and what the process's own limits leave: its address-space and data-segment
limits (``ulimit -v``/``-d``, RLIMIT_AS/RLIMIT_DATA, against what it already maps; psutil reads
them on Linux and FreeBSD, elsewhere the check is off and said once in the log) and its
cgroup's memory limit (v2 ``memory.max`` − ``memory.current``, v1 ``memory.limit_in_bytes`` −
``memory.usage_in_bytes``, the cgroup and its ancestors: a walk no library does, over psutil's
list of mounts). A container or ``ulimit -v`` user is refused with the figure and the limit
that binds, not killed by the allocation the check exists to prevent.
``$CAFFE2JAX_CGROUP_DIR`` names a cgroup folder to read instead of the process's own (tests
simulate a limit with it where no cgroup can be made).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from caffe2jax.frontend import environment
from caffe2jax.frontend.errors import DataError, NetError
from caffe2jax.lowering.limits import shape_problem, show_shape

log = logging.getLogger(__name__)

GIB = 1 << 30
CGROUP_ENV = "CAFFE2JAX_CGROUP_DIR"
UNLIMITED = 1 << 60  # cgroup v1 writes "unlimited" as a page-rounded 2^63 - 1
# What a process under a hard limit keeps back for what no estimate sees (XLA's compiler,
# thread stacks, Python objects): 256 MiB plus a tenth of what is left.
HEADROOM = 256 << 20
SMALL = 64 << 20  # batches up to this size are not weighed against the budget (per batch)


@dataclass(frozen=True)
class Budget:
    """Bytes this process may still allocate, and the limit that sets the figure."""

    bytes: int
    limit: str

    def describe(self) -> str:
        return f"{gib(self.bytes)} available ({self.limit})"


def gib(n: float) -> str:
    """Bytes as GiB (MiB below one GiB), three significant digits."""
    return f"{n / GIB:.3g} GiB" if abs(n) >= GIB else f"{n / (1 << 20):.3g} MiB"


def _meminfo() -> Budget | None:
    """What the machine has free (psutil: ``MemAvailable`` on Linux, the OS's own figure
    elsewhere)."""
    try:
        return Budget(int(psutil.virtual_memory().available), "free host memory, MemAvailable")
    except (OSError, RuntimeError, AttributeError):
        return None


def _after_headroom(left: int) -> int:
    return max(0, left - HEADROOM - left // 10)


@functools.cache
def _rlimits_unsupported() -> bool:
    """Whether psutil reads no rlimits here (macOS, Windows): the check is off, said once."""
    if hasattr(psutil.Process, "rlimit") and hasattr(psutil, "RLIMIT_AS"):
        return False
    log.info("memory budget: this platform reports no RLIMIT_AS/RLIMIT_DATA; not checked")
    return True


def _rlimits() -> list[Budget]:
    """RLIMIT_AS and RLIMIT_DATA (``ulimit -v``/``-d``) against what the process maps
    (psutil's ``vms`` and ``data``: /proc/self/statm)."""
    if _rlimits_unsupported():
        return []
    process = psutil.Process()
    mapped = process.memory_info()
    out = []
    for name, flag, used in (
        ("RLIMIT_AS", "ulimit -v", mapped.vms),
        ("RLIMIT_DATA", "ulimit -d", getattr(mapped, "data", 0)),
    ):
        soft, _ = process.rlimit(getattr(psutil, name))
        if soft == psutil.RLIM_INFINITY or soft < 0:
            continue
        out.append(Budget(_after_headroom(soft - used),
                          f"{name} ({flag}) {gib(soft)}, {gib(used)} in use"))  # fmt: skip
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if text == "max":
        return UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _cgroup_dir_budget(folder: Path) -> Budget | None:
    """The limit set on one cgroup folder (v2 or v1 file names), if any."""
    for limit_name, usage_name in (
        ("memory.max", "memory.current"),
        ("memory.limit_in_bytes", "memory.usage_in_bytes"),
    ):
        limit = _read_int(folder / limit_name)
        if limit is None:
            continue
        if limit >= UNLIMITED:
            return None
        used = _read_int(folder / usage_name) or 0
        return Budget(
            _after_headroom(limit - used),
            f"cgroup {limit_name} {gib(limit)}, {gib(used)} in use ({folder})",
        )
    return None


def _cgroup_folders() -> list[Path]:
    """The process's memory cgroup folders (v2 and v1), innermost first, ancestors after."""
    override = environment.value(CGROUP_ENV)
    if override:
        return [Path(override)]
    try:
        groups = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    mounts = [m for m in _mounts() if m.fstype in ("cgroup", "cgroup2")]
    folders = []
    for line in groups:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        v2 = controllers == ""
        if not v2 and "memory" not in controllers.split(","):
            continue
        for mount in mounts:
            if mount.fstype != ("cgroup2" if v2 else "cgroup"):
                continue
            if not v2 and "memory" not in mount.opts.split(","):
                continue
            folders += _ancestors(Path(mount.mountpoint), path)
    return folders


def _mounts() -> list:
    """The mounted file systems (psutil's ``disk_partitions``: mount point, type, options)."""
    try:
        return psutil.disk_partitions(all=True)
    except (OSError, RuntimeError):
        return []


def _ancestors(mount: Path, path: str) -> list[Path]:
    """The cgroup folder of ``path`` under ``mount`` and its ancestors up to the mount."""
    inner = (mount / path.lstrip("/")).resolve() if path not in (".", "/") else mount
    if not inner.is_dir():  # a cgroup namespace: the mount shows our own cgroup
        inner = mount
    out = [inner]
    while inner != mount and mount in inner.parents:
        inner = inner.parent
        out.append(inner)
    return out


def memory_budget() -> Budget:
    """The smallest of the host's free memory and the process's own limits (see module)."""
    found = [b for b in [_meminfo(), *_rlimits()] if b is not None]
    for folder in _cgroup_folders():
        budget = _cgroup_dir_budget(folder)
        if budget is not None:
            found.append(budget)
    if not found:
        return Budget(1 << 34, "unknown; assumed 16 GiB")
    return min(found, key=lambda b: b.bytes)


def available_memory() -> int:
    """Bytes of host memory this process may still allocate (see :func:`memory_budget`)."""
    return memory_budget().bytes


def device_budget() -> Budget:
    """What the default JAX device can hold: its allocator limit on an accelerator, the host
    budget on the CPU."""
    import jax

    try:
        device = jax.devices()[0]
        stats = device.memory_stats() or {}
    except Exception:  # backends without memory stats
        device, stats = None, {}
    limit = stats.get("bytes_limit")
    if limit:
        used = int(stats.get("bytes_in_use", 0))
        return Budget(int(limit) - used, f"{device} allocator limit {gib(int(limit))}")
    return memory_budget()


def device_memory() -> int:
    """Bytes the default JAX device can hold (its allocator limit; host memory on CPU)."""
    return device_budget().bytes


def check_net_fits(
    net, itemsize: int = 4, available: int | Budget | None = None, params: Mapping | None = None
) -> int:
    """Raise a NetError naming the largest blob when an IR net's blobs (each layer's tops, and
    the param blobs of ``params``: layer -> declarations with ``.shape``), at ``itemsize``
    bytes per value, exceed ``available`` bytes (default: what the device can still hold,
    under the process's own limits; the message names the limit). Returns the bytes needed."""
    blobs = [
        (user, net.shapes[ssa])
        for layer in net.layers
        for ssa, user in zip(layer.tops, layer.top_names)
        if ssa in net.shapes
    ]
    blobs += [
        (f"{layer} param {j}", tuple(d.shape))
        for layer, decls in (params or {}).items()
        for j, d in enumerate(decls)
    ]
    if not blobs:
        return 0
    sizes = [math.prod(shape) * itemsize for _, shape in blobs]
    need = sum(sizes)
    if available is None:
        budget = device_budget()
    elif isinstance(available, Budget):
        budget = available
    else:
        budget = Budget(available, "")
    if need > budget.bytes:
        blob, shape = blobs[sizes.index(max(sizes))]
        limit = f" under {budget.limit}" if budget.limit else ""
        raise NetError(
            f"net '{net.name}': its blobs need {gib(need)}, more than the {gib(budget.bytes)} "
            f"available{limit} (largest: '{blob}' {list(shape)[:8]}); lower batch_size or "
            "the input shapes"
        )
    return need


def check_batches_fit(
    layer: str,
    tops: list[str] | tuple[str, ...],
    shapes: list[tuple[int, ...]],
    copies: int,
    budget: Budget | None = None,
) -> int:
    """Before a data layer's reader allocates a batch: its tops must be shapes Caffe allows,
    and ``copies`` batches (the prefetch queue, the one being read, the one in use) must fit
    in ``budget`` (default: :func:`memory_budget`). A DataError naming the layer otherwise;
    returns the bytes they need."""
    for name, shape in zip(tops, shapes):
        problem = shape_problem(shape)
        if problem:
            raise DataError(f"layer '{layer}': top '{name}' {show_shape(shape)} {problem}")
    need = sum(math.prod(shape) for shape in shapes) * 4 * copies
    if need <= SMALL and budget is None:  # not worth the few file reads the budget costs
        return need
    budget = budget or memory_budget()
    if need > budget.bytes:
        raise DataError(
            f"layer '{layer}': {copies} batches of {show_shape(shapes[0])} need {gib(need)}, "
            f"more than the {gib(budget.bytes)} available under {budget.limit}; lower "
            "batch_size (or data_param.prefetch)"
        )
    return need
