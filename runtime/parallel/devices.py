"""Devices for data-parallel training: Caffe's ``-gpu`` flag on a ``jax.sharding.Mesh``.

Caffe trains on several GPUs with ``caffe train -gpu 0,1,2,3`` (or ``-gpu all``): one solver
per GPU, each running the net's batch_size, rank 0 the root solver that tests, displays and
snapshots. Here the devices are those of JAX's default backend (GPUs, or the CPU devices XLA
exposes with ``--xla_force_host_platform_device_count``), laid out on a one-axis mesh
(:data:`DATA`); across hosts, ``jax.distributed`` joins the processes first and process 0
plays the root solver.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from caffe2jax.frontend.errors import CaffeError
from caffe2jax.runtime.host.process import exit_now

DATA = "data"
DEFAULT_TIMEOUT_S = 60
_last_mesh: Mesh | None = None
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


class DeviceError(CaffeError):
    """A device selection or a multi-process setup that cannot be honoured."""


def parse_spec(spec: str | int | Sequence[int] | None) -> list[int] | None:
    """Caffe's ``-gpu`` value as device ids; ``None`` for ``all`` (every device)."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
        return None
    if isinstance(spec, int):
        return [spec]
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    try:
        ids = [int(str(item).strip()) for item in items]
    except ValueError:
        raise DeviceError(f"--gpu takes 'all' or device ids like 0,1; got '{spec}'") from None
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
        raise DeviceError(f"--gpu needs distinct non-negative device ids; got '{spec}'")
    return ids


def select(spec: str | int | Sequence[int] | None) -> list[jax.Device]:
    """The devices ``spec`` names, in mesh order. Ids count each process's own devices (as
    Caffe's ids count one machine's GPUs), so every host picks the same local ids."""
    ids = parse_spec(spec)
    devices = jax.devices()
    if ids is None:
        return devices
    local = len(jax.local_devices())
    missing = [i for i in ids if i >= local]
    if missing:
        kind = devices[0].platform.upper()
        raise DeviceError(
            f"no {kind} device {', '.join(map(str, missing))}: this process sees {local} "
            f"(ids 0..{local - 1})"
        )
    chosen = []
    for process in range(jax.process_count()):
        mine = sorted((d for d in devices if d.process_index == process), key=lambda d: d.id)
        chosen += [mine[i] for i in ids]
    return chosen


def make_mesh(spec: str | int | Sequence[int] | None) -> Mesh | None:
    """A one-axis mesh over the selected devices; ``None`` when that is a single device
    (training then runs exactly as without a mesh)."""
    global _last_mesh
    devices = select(spec)
    if len(devices) == 1 and jax.process_count() == 1:
        _last_mesh = None
        return None
    _last_mesh = Mesh(np.array(devices), (DATA,))
    return _last_mesh


def last_mesh() -> Mesh | None:
    """The mesh the latest solver built (``None``: one device)."""
    return _last_mesh


def check_batch(name: str, batch: int, mesh: Mesh | None) -> None:
    """Caffe's per-device batches: a batch can only be split evenly over the mesh."""
    if mesh is not None and batch % mesh.size:
        raise DeviceError(f"{name}: batch of {batch} rows cannot be split over {mesh.size} devices")


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def sharded(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(DATA))


def replicate(tree: Any, mesh: Mesh) -> Any:
    """``tree`` with every array replicated over ``mesh`` (a no-op for arrays already so);
    across processes each process supplies its own, identical copy."""
    sharding = replicated(mesh)

    def put(x: Any) -> Any:
        if isinstance(x, jax.Array) and x.sharding == sharding:
            return x
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.wrap_key_data(put(jax.random.key_data(x)),
                                            impl=jax.random.key_impl(x))  # fmt: skip
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(put, tree)


def local_slots(mesh: Mesh) -> list[int]:
    """Positions on the mesh's data axis of this process's devices."""
    me = jax.process_index()
    return [i for i, d in enumerate(mesh.devices.flat) if d.process_index == me]


# -- processes ----------------------------------------------------------------------------


def distributed_params(coordinator: str | None, num_processes: int | None,
                       process_id: int | None) -> tuple[str, int, int] | None:  # fmt: skip
    """The multi-process setup from the flags, else the ``JAX_COORDINATOR_ADDRESS`` /
    ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` environment variables; ``None`` when neither
    asks for one."""
    coordinator = coordinator or os.environ.get(ENV_COORDINATOR)
    if num_processes is None and os.environ.get(ENV_NUM_PROCESSES):
        num_processes = int(os.environ[ENV_NUM_PROCESSES])
    if process_id is None and os.environ.get(ENV_PROCESS_ID):
        process_id = int(os.environ[ENV_PROCESS_ID])
    given = [coordinator, num_processes, process_id]
    if all(v is None for v in given):
        return None
    if any(v is None for v in given):
        raise DeviceError(
            "multi-process training needs --coordinator HOST:PORT, --num-processes N and "
            f"--process-id I (or {ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID})"
        )
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise DeviceError(
            f"--process-id must be in 0..{num_processes - 1} for --num-processes "
            f"{num_processes}; got {process_id}"
        )
    if ":" not in coordinator:
        raise DeviceError(f"--coordinator must be HOST:PORT; got '{coordinator}'")
    return coordinator, num_processes, process_id


def initialize(coordinator: str, num_processes: int, process_id: int,
               timeout_s: int = DEFAULT_TIMEOUT_S) -> None:  # fmt: skip
    """``jax.distributed.initialize``, CPU collectives through gloo. JAX aborts the process
    when the rendezvous times out; a watchdog says so in one line and exits 1 first."""
    if jax.distributed.is_initialized():
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")

    def give_up() -> None:
        exit_now(1, f"caffe2jax: error: the coordinator {coordinator} did not gather all "
                 f"{num_processes} processes within {timeout_s} s (this is process "
                 f"{process_id})\n")  # fmt: skip

    watchdog = threading.Timer(timeout_s, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(coordinator, num_processes, process_id,
                                   initialization_timeout=timeout_s + 30)  # fmt: skip
    except (RuntimeError, ValueError) as err:
        raise DeviceError(f"cannot join {coordinator}: {str(err).splitlines()[0]}") from None
    finally:
        watchdog.cancel()


def is_primary() -> bool:
    """Caffe's root_solver: process 0 writes the log and the snapshots."""
    return jax.process_index() == 0
