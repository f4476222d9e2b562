"""pycaffe's multi-GPU names: ``has_nccl``, ``NCCL``, ``solver_count``, ``solver_rank``.

pycaffe trains on several GPUs by starting one process per GPU, each with its own solver,
and joining them with NCCL (Caffe's python/train.py). caffe2jax runs one solver over a device
mesh instead (``get_solver(path, devices="all")``, ``caffe2jax train --gpu all``), across
hosts through ``jax.distributed`` (``--coordinator/--num-processes/--process-id``). So the
counts below describe that mesh, and the names that configure Caffe's own process-per-GPU
machinery say what to use instead.
"""

from __future__ import annotations

from typing import Any

import jax

from caffe2jax.frontend.errors import CaffeError
from caffe2jax.runtime.parallel.devices import last_mesh, local_slots

_INSTEAD = (
    "one solver trains on several devices: get_solver(path, devices='all'|[ids]) or "
    "`caffe2jax train --gpu all|0,1` (--coordinator, --num-processes, --process-id across "
    "machines)"
)


def has_nccl() -> bool:
    """False: there is no NCCL communicator to build by hand (XLA's collectives, NCCL among
    them on GPUs, run inside the compiled step)."""
    return False


class NCCL:
    """pycaffe's ``caffe.NCCL(solver, uid)``: not available; the error names what is."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise CaffeError(f"caffe.NCCL is not supported: {_INSTEAD}")

    @staticmethod
    def new_uid() -> bytes:
        raise CaffeError(f"caffe.NCCL.new_uid is not supported: {_INSTEAD}")


def solver_count() -> int:
    """Caffe's solver_count: devices training together in the latest solver (1 without a
    mesh)."""
    mesh = last_mesh()
    return 1 if mesh is None else mesh.size


def solver_rank() -> int:
    """Caffe's solver_rank: the rank of this process's first device on the latest solver's
    mesh (0 on the process that logs and snapshots, as Caffe's root solver)."""
    mesh = last_mesh()
    if mesh is None:
        return jax.process_index()
    return local_slots(mesh)[0]


def _refuse(name: str) -> Any:
    def refuse(*args: Any) -> None:
        raise CaffeError(f"caffe.{name} is not supported: {_INSTEAD}")

    refuse.__name__ = name
    refuse.__doc__ = f"pycaffe's ``{name}``: refused with a message naming what to use."
    return refuse


set_solver_count = _refuse("set_solver_count")
set_solver_rank = _refuse("set_solver_rank")
set_multiprocess = _refuse("set_multiprocess")
