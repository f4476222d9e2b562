"""How much memory there is, and whether a net's blobs can fit in it (checked before
compiling: XLA would otherwise try, and fail or swap, long after the user's mistake)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from caffe2jax.frontend.errors import NetError

GIB = 1 << 30


def available_memory() -> int:
    """Bytes of host memory available now (MemAvailable; total RAM where unknown)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 1 << 34


def device_memory() -> int:
    """Bytes the default JAX device can hold (its allocator limit; host memory on CPU)."""
    import jax

    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # backends without memory stats
        stats = {}
    limit = stats.get("bytes_limit")
    return int(limit) if limit else available_memory()


def check_net_fits(
    net, itemsize: int = 4, available: int | None = None, params: Mapping | None = None
) -> int:
    """Raise a NetError naming the largest blob when an IR net's blobs (each layer's tops, and
    the param blobs of ``params``: layer -> declarations with ``.shape``), at ``itemsize``
    bytes per value, exceed ``available`` bytes (default: the device's memory). Returns the
    bytes they need."""
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
    limit = device_memory() if available is None else available
    if need > limit:
        blob, shape = blobs[sizes.index(max(sizes))]
        raise NetError(
            f"net '{net.name}': its blobs need {need / GIB:.3g} GiB, more than the "
            f"{limit / GIB:.3g} GiB available (largest: '{blob}' {list(shape)[:8]}); lower "
            "batch_size or the input shapes"
        )
    return need
