"""caffe2jax: compile Caffe nets and solvers to JAX/XLA.

Three ways in: the ``caffe2jax`` CLI (shaped like Caffe's ``caffe`` tool), the functional API
(:func:`compile` → :class:`Model` with ``init``/``apply``/``loss``), and pycaffe's API
(:class:`Net`, :func:`get_solver`) so pycaffe scripts port by changing the import.
"""

__version__ = "0.1.0"

from caffe2jax import io  # noqa: E402
from caffe2jax.api import Model, compile  # noqa: E402,A004
from caffe2jax.blob import Blob  # noqa: E402
from caffe2jax.errors import CaffeError  # noqa: E402
from caffe2jax.lowering.python_layer import register_python_layer  # noqa: E402
from caffe2jax.mode import (  # noqa: E402
    set_device,
    set_mode_cpu,
    set_mode_gpu,
    set_random_seed,
)
from caffe2jax.multigpu import (  # noqa: E402
    NCCL,
    has_nccl,
    set_multiprocess,
    set_solver_count,
    set_solver_rank,
    solver_count,
    solver_rank,
)
from caffe2jax.pycaffe import TEST, TRAIN, Net  # noqa: E402
from caffe2jax.runtime.weights import load_weights, save_weights  # noqa: E402
from caffe2jax.solver import (  # noqa: E402
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    NesterovSolver,
    RMSPropSolver,
    SGDSolver,
    Solver,
    get_solver,
)

__all__ = [
    "TEST",
    "TRAIN",
    "AdaDeltaSolver",
    "AdaGradSolver",
    "AdamSolver",
    "Blob",
    "CaffeError",
    "NCCL",
    "Model",
    "NesterovSolver",
    "Net",
    "RMSPropSolver",
    "SGDSolver",
    "Solver",
    "__version__",
    "compile",
    "get_solver",
    "has_nccl",
    "io",
    "load_weights",
    "register_python_layer",
    "save_weights",
    "set_device",
    "set_multiprocess",
    "set_solver_count",
    "set_solver_rank",
    "set_mode_cpu",
    "set_mode_gpu",
    "set_random_seed",
    "solver_count",
    "solver_rank",
]
