"""caffe2jax: compile Caffe nets and solvers to JAX/XLA.

Three ways in: the ``caffe2jax`` CLI (shaped like Caffe's ``caffe`` tool), the functional API
(:func:`compile` → :class:`Model` with ``init``/``apply``/``loss``), and pycaffe's API
(:class:`Net`, :func:`get_solver`, ``caffe.io``, ``caffe.NetSpec``…) so pycaffe scripts port by
changing the import.

Names are imported on first use (PEP 562), so ``import caffe2jax.frontend`` — the parser and
the Net IR — loads neither JAX nor the runtime.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

TRAIN = 0  # Caffe's Phase enum, as pycaffe exposes it
TEST = 1

# public name -> (module, attribute); attribute None: the module itself
_NAMES: dict[str, tuple[str, str | None]] = {
    "Model": ("caffe2jax.api", "Model"),
    "compile": ("caffe2jax.api", "compile"),
    "Blob": ("caffe2jax.blob", "Blob"),
    "CaffeError": ("caffe2jax.frontend.errors", "CaffeError"),
    "register_python_layer": ("caffe2jax.lowering.python_layer", "register_python_layer"),
    "set_device": ("caffe2jax.mode", "set_device"),
    "set_mode_cpu": ("caffe2jax.mode", "set_mode_cpu"),
    "set_mode_gpu": ("caffe2jax.mode", "set_mode_gpu"),
    "set_random_seed": ("caffe2jax.mode", "set_random_seed"),
    "Net": ("caffe2jax.pycaffe", "Net"),
    "load_weights": ("caffe2jax.runtime.weights", "load_weights"),
    "save_weights": ("caffe2jax.runtime.weights", "save_weights"),
    **{
        name: ("caffe2jax.solver", name)
        for name in (
            "AdaDeltaSolver AdaGradSolver AdamSolver NesterovSolver RMSPropSolver SGDSolver "
            "Solver get_solver"
        ).split()
    },
    # pycaffe's other names: caffe.proto, net_spec, Layer, Classifier, Detector …
    **{m: (f"caffe2jax.{m}", None) for m in ("coord_map", "draw", "io", "net_spec", "proto")},
    "Classifier": ("caffe2jax.classifier", "Classifier"),
    "Detector": ("caffe2jax.detector", "Detector"),
    "Layer": ("caffe2jax.lowering.python_class", "Layer"),
    "NetSpec": ("caffe2jax.net_spec", "NetSpec"),
    "layers": ("caffe2jax.net_spec", "layers"),
    "params": ("caffe2jax.net_spec", "params"),
    "to_proto": ("caffe2jax.net_spec", "to_proto"),
    **{name: ("caffe2jax.process", name) for name in "Timer init_log layer_type_list log".split()},
    # pycaffe's multi-GPU names, answered by the data-parallel runtime
    **{
        name: ("caffe2jax.multigpu", name)
        for name in (
            "NCCL has_nccl set_multiprocess set_solver_count set_solver_rank solver_count "
            "solver_rank"
        ).split()
    },
}

__all__ = sorted(["TEST", "TRAIN", "__version__", *_NAMES])


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _NAMES[name]
    except KeyError:
        raise AttributeError(f"module 'caffe2jax' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
