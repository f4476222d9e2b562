"""The runtime: training (``train/``), Caffe's file formats and the snapshot record
(``formats/``), data feeding (``data/``: ``readers/``, ``records/``, ``transform/``), a net's
results on the host (``outputs/``), Caffe's tools as functions (``tools/``), the host's memory
budget and compile cache (``host/``), devices (``parallel/``) and the RL trainer (``rl/``).

Training is :class:`SolverLoop` (Caffe's Solver: Step, Test, Snapshot, Restore) over a
:class:`TrainState`; the CLI and ``caffe2jax.get_solver`` both drive it. Names load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "SolverLoop": "caffe2jax.runtime.train.loop",
    "CompiledNet": "caffe2jax.runtime.train.compiled",
    "TrainState": "caffe2jax.runtime.train.state",
    "Trainer": "caffe2jax.runtime.train.step",
    "load_weights": "caffe2jax.runtime.formats.weights",
    "save_weights": "caffe2jax.runtime.formats.weights",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'caffe2jax.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(_NAMES[name]), name)
    globals()[name] = value
    return value
