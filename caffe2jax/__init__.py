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
import importlib.abc
import importlib.util
import sys
from typing import Any

# Caffe's Phase enum as pycaffe exposes it (ints whose str() is the name)
from caffe2jax.frontend.phase import TEST, TRAIN, Phase  # noqa: F401 - public names

__version__ = "0.1.0"

# pycaffe's own module names (caffe/classifier.py, coord_map.py, …), kept importable
_PYCAFFE_MODULES = ("classifier", "coord_map", "detector", "draw", "io", "model_libs", "net_spec")

# public name -> (module, attribute); attribute None: the module itself
_NAMES: dict[str, tuple[str, str | None]] = {
    "Model": ("caffe2jax.lowering.model", "Model"),
    "compile": ("caffe2jax.lowering.model", "compile"),
    "EnginePolicy": ("caffe2jax.lowering.engines.policy", "EnginePolicy"),
    "Blob": ("caffe2jax.pycaffe.blob", "Blob"),
    "CaffeError": ("caffe2jax.frontend.errors", "CaffeError"),
    "register_python_layer": ("caffe2jax.lowering.python_layer", "register_python_layer"),
    "python_layers": ("caffe2jax.lowering.python_layer", "python_layers"),
    "register_layer": ("caffe2jax.lowering.forks.user", "register_layer"),
    "set_device": ("caffe2jax.pycaffe.mode", "set_device"),
    "set_mode_cpu": ("caffe2jax.pycaffe.mode", "set_mode_cpu"),
    "set_mode_gpu": ("caffe2jax.pycaffe.mode", "set_mode_gpu"),
    "set_random_seed": ("caffe2jax.pycaffe.mode", "set_random_seed"),
    "Net": ("caffe2jax.pycaffe.net", "Net"),
    "Detection": ("caffe2jax.runtime.outputs.detections", "Detection"),
    "detect": ("caffe2jax.runtime.outputs.detections", "detect"),
    "load_weights": ("caffe2jax.runtime.formats.weights", "load_weights"),
    "save_weights": ("caffe2jax.runtime.formats.weights", "save_weights"),
    "export_onnx": ("caffe2jax.runtime.onnx", "export_onnx"),
    "label_map": ("caffe2jax.runtime.outputs.segment", "label_map"),
    "ctc_greedy_decode": ("caffe2jax.runtime.outputs.ctc_decode", "ctc_greedy_decode"),
    **{
        name: ("caffe2jax.pycaffe.solver", name)
        for name in (
            "AdaDeltaSolver AdaGradSolver AdamSolver NesterovSolver RMSPropSolver SGDSolver "
            "Solver get_solver"
        ).split()
    },
    # pycaffe's other names: caffe.proto, net_spec, Layer, Classifier, Detector …
    **{m: (f"caffe2jax.pycaffe.{m}", None) for m in ("coord_map", "draw", "io", "net_spec")},
    "model_libs": ("caffe2jax.pycaffe.model_libs", None),  # the SSD fork's net builders
    "proto": ("caffe2jax.proto", None),
    "Classifier": ("caffe2jax.pycaffe.classifier", "Classifier"),
    "Detector": ("caffe2jax.pycaffe.detector", "Detector"),
    "Layer": ("caffe2jax.lowering.python_blobs", "Layer"),
    "NetSpec": ("caffe2jax.pycaffe.net_spec", "NetSpec"),
    "layers": ("caffe2jax.pycaffe.net_spec", "layers"),
    "params": ("caffe2jax.pycaffe.net_spec", "params"),
    "to_proto": ("caffe2jax.pycaffe.net_spec", "to_proto"),
    **{
        name: ("caffe2jax.pycaffe.process", name)
        for name in "Timer init_log layer_type_list log".split()
    },
    # pycaffe's multi-GPU names, answered by the data-parallel runtime
    **{
        name: ("caffe2jax.pycaffe.multigpu", name)
        for name in (
            "NCCL has_nccl set_multiprocess set_solver_count set_solver_rank solver_count "
            "solver_rank"
        ).split()
    },
}

__all__ = sorted(["Phase", "TEST", "TRAIN", "__version__", "install_as_caffe", *_NAMES])

# module names scripts import (pycaffe's ``caffe.io``, ``caffe.draw``…, and the functional API's
# ``caffe2jax.api``) -> the module that holds them; ``import caffe2jax.io`` gives that module
_MODULES: dict[str, str] = {
    **{f"caffe2jax.{m}": f"caffe2jax.pycaffe.{m}" for m in _PYCAFFE_MODULES},
    "caffe2jax.api": "caffe2jax.lowering.model",
    # the MobileNet-SSD generators' ``from caffe.mobilenet import MobileNetBody``
    "caffe2jax.mobilenet": "caffe2jax.pycaffe.model_libs.mobilenet",
}


def _aliased(fullname: str) -> str | None:
    """The module ``fullname`` names: a name of :data:`_MODULES`, or a submodule reached through
    another name of this package (``sys.modules['caffe'] = caffe2jax``, :func:`install_as_caffe`:
    ``caffe.draw`` is ``caffe2jax.draw``, ``caffe.proto.caffe_pb2``
    ``caffe2jax.proto.caffe_pb2``)."""
    if fullname in _MODULES:
        return _MODULES[fullname]
    head, dot, rest = fullname.partition(".")
    if not dot or head == __name__ or sys.modules.get(head) is not sys.modules[__name__]:
        return None
    own = f"{__name__}.{rest}"
    if own in _MODULES or own in sys.modules:
        return _MODULES.get(own, own)
    try:
        return own if importlib.util.find_spec(own) is not None else None
    except ImportError:
        return None


class _ModuleAliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an aliased name (:func:`_aliased`) as the one module it names (same object, so
    ``caffe.io`` and ``caffe2jax.pycaffe.io`` share their classes and state)."""

    def find_spec(self, fullname, path=None, target=None):
        if _aliased(fullname) is not None:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(_aliased(spec.name))

    def exec_module(self, module):
        pass


# first, so that an aliased name never loads a second copy of a module from caffe2jax's folders
sys.meta_path.insert(0, _ModuleAliases())


def install_as_caffe() -> None:
    """Make ``import caffe`` give caffe2jax (PyMySQL's ``install_as_MySQLdb`` convention): after
    it, ``import caffe.draw``, ``from caffe.proto import caffe_pb2``, ``from caffe.coord_map
    import crop``… give caffe2jax's modules, so pycaffe scripts run with no import changed.
    A plain ``sys.modules['caffe'] = caffe2jax`` does the same. Another ``caffe`` already
    imported is refused (its modules and caffe2jax's would mix)."""
    this = sys.modules[__name__]
    other = sys.modules.get("caffe")
    if other is not None and other is not this:
        from caffe2jax.frontend.errors import CaffeError

        where = getattr(other, "__file__", None) or repr(other)
        raise CaffeError(
            f"install_as_caffe: another 'caffe' module is already imported ({where}); "
            "call caffe2jax.install_as_caffe() before anything imports caffe"
        )
    sys.modules["caffe"] = this


class _CacheOnFirstUse(importlib.abc.MetaPathFinder):
    """Turns JAX's persistent compilation cache on (:mod:`caffe2jax.runtime.host.compile_cache`)
    when the part that compiles (``caffe2jax.lowering``) is first imported, by any way in: the
    functional API, pycaffe and the CLI alike; the parser alone stays free of it."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "caffe2jax.lowering":
            sys.meta_path.remove(self)
            from caffe2jax.runtime.host import compile_cache

            compile_cache.enable_by_default()
        return None


sys.meta_path.insert(0, _CacheOnFirstUse())


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
