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
    "Model",
    "NesterovSolver",
    "Net",
    "RMSPropSolver",
    "SGDSolver",
    "Solver",
    "__version__",
    "compile",
    "get_solver",
    "io",
    "load_weights",
    "register_python_layer",
    "save_weights",
    "set_device",
    "set_mode_cpu",
    "set_mode_gpu",
    "set_random_seed",
]

# --- pycaffe's other names (issue 11): caffe.proto, net_spec, Layer, Classifier, Detector … ---
from caffe2jax import coord_map, net_spec, proto  # noqa: E402
from caffe2jax.classifier import Classifier  # noqa: E402
from caffe2jax.detector import Detector  # noqa: E402
from caffe2jax.lowering.python_class import Layer  # noqa: E402
from caffe2jax.net_spec import NetSpec, layers, params, to_proto  # noqa: E402
from caffe2jax.process import (  # noqa: E402
    Timer,
    has_nccl,
    init_log,
    layer_type_list,
    log,
    set_multiprocess,
    set_solver_count,
    set_solver_rank,
    solver_count,
    solver_rank,
)

__all__ += [
    "Classifier",
    "Detector",
    "Layer",
    "NetSpec",
    "Timer",
    "coord_map",
    "has_nccl",
    "init_log",
    "layer_type_list",
    "layers",
    "log",
    "net_spec",
    "params",
    "proto",
    "set_multiprocess",
    "set_solver_count",
    "set_solver_rank",
    "solver_count",
    "solver_rank",
    "to_proto",
]
# --- end of issue 11's names ---
