"""A net ready to run outside the train step: its compiled model, the data layers feeding it,
its HDF5Output sinks and its PRNG key (Caffe's Net as a Solver or pycaffe holds it), and
Net::ShareTrainedLayersWith between a train net and a test net."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from caffe2jax.frontend.errors import SolverError
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.model import Model
from caffe2jax.runtime.data.feeding import Feeder, Sinks


@dataclass
class CompiledNet:
    """A net ready to run: its compiled model, the data layers feeding it, its HDF5Output
    sinks, and its PRNG key for forwards outside training."""

    model: Model
    feeder: Feeder
    sinks: Sinks
    key: jax.Array

    @classmethod
    def build(cls, source: Any, phase: str, *, level: int = 0, stages: Sequence[str] = (),
              state: Any = None, base_dir: Path, seed: int,
              dtype: Any = np.float32) -> CompiledNet:  # fmt: skip
        """Caffe's Net::Init for ``source`` (a path, prototxt text or NetParameter) in
        ``phase``/``level``/``stages`` (or a NetState ``state``): data layers opened relative
        to ``base_dir`` with ``seed``, the model compiled for the shapes they give."""
        net = load_net(source, phase, level, tuple(stages), state=state)
        feeder = Feeder(net, base_dir, seed=seed)
        return cls(Model(net, feeder.input_shapes(), dtype), feeder, Sinks(net),
                   jax.random.key(seed))  # fmt: skip

    def close(self) -> None:
        self.feeder.close()
        self.sinks.close()


def shared_layers(train: Model, test: Model) -> list[tuple[str, int]]:
    """Net::ShareTrainedLayersWith: the (layer, blob) slots a test net takes from the train
    net, by layer name; a shape mismatch is Caffe's fatal error."""
    out = []
    for name, j, decl in test.graph.owned():
        theirs = train.graph.decls.get(name)
        if theirs is None or j >= len(theirs) or (name, j) in train.graph.shared:
            continue
        if tuple(theirs[j].shape) != tuple(decl.shape):
            raise SolverError(
                f"cannot share layer '{name}' blob {j} with the test net: train shape "
                f"{list(theirs[j].shape)}, test {list(decl.shape)}"
            )
        out.append((name, j))
    return out
