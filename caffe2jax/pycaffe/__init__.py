"""pycaffe's Python API: Net, Solver, Blob, Classifier, Detector, io, draw, net_spec, coord_map,
multigpu, process and mode (``caffe2jax`` re-exports their public names, as ``caffe`` does).

The package also answers for BVLC's ``caffe/pycaffe.py`` module: ``from caffe.pycaffe import
Net`` (with ``caffe`` aliased to caffe2jax) gives the names that module defines."""

from __future__ import annotations

from typing import Any

#: BVLC's caffe/pycaffe.py: the names it gives ``caffe/__init__.py``
PYCAFFE_NAMES = (
    "Net SGDSolver NesterovSolver AdaGradSolver RMSPropSolver AdaDeltaSolver AdamSolver NCCL Timer"
).split()


def __getattr__(name: str) -> Any:
    if name not in PYCAFFE_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import caffe2jax

    return getattr(caffe2jax, name)
