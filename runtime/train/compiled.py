"""A net ready to run: its compiled model (one per input shape signature, as Caffe reshapes a
net on every forward), the data layers feeding it (the data pipeline's, and Python data layers
run on the host), its HDF5Output sinks and its PRNG key — Caffe's Net as a Solver or pycaffe
holds it — and Net::ShareTrainedLayersWith between a train net and a test net."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from caffe2jax.frontend.errors import SolverError
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.model import Model
from caffe2jax.lowering.python_layer import HostDataLayer, host_data_layers
from caffe2jax.lowering.registry import type_problem
from caffe2jax.runtime.data.feeding import Feeder, Sinks
from caffe2jax.runtime.host import startup_cache


@dataclass
class CompiledNet:
    """A net ready to run: its model (for the shapes Net::Init gives; :meth:`member` for
    others), the data layers feeding it, its HDF5Output sinks, its PRNG key for forwards
    outside training, and its Python data layers (``host``), run before each forward."""

    model: Model
    feeder: Feeder
    sinks: Sinks
    key: jax.Array
    host: list[HostDataLayer] = field(default_factory=list)

    @classmethod
    def build(cls, source: Any, phase: str, *, level: int = 0, stages: Sequence[str] = (),
              state: Any = None, base_dir: Path, seed: int, dtype: Any = np.float32,
              dialect: str | None = None, precision: str | None = None) -> CompiledNet:  # fmt: skip
        """Caffe's Net::Init for ``source`` (a path, prototxt text or NetParameter) in
        ``phase``/``level``/``stages`` (or a NetState ``state``): data layers opened relative
        to ``base_dir`` with ``seed``, the model compiled for the shapes they give."""
        net, host = host_data_layers(
            load_net(
                source,
                phase,
                level,
                tuple(stages),
                state=state,
                dialect=dialect,
                layer_types=type_problem,
            )  # fmt: skip
        )
        feeder = Feeder(net, base_dir, seed=seed)
        shapes = feeder.input_shapes()
        for layer in host:
            shapes.update(layer.shapes())
        key = startup_cache.net_key(net, shapes, (np.dtype(dtype).name, precision))
        model = Model(net, shapes, dtype, precision, known_tops=startup_cache.known_tops(key))
        startup_cache.keep_tops(key, startup_cache.top_shapes(model.net))
        return cls(model, feeder, Sinks(net), jax.random.key(seed), host)

    def next_inputs(self) -> dict[str, Any]:
        """The inputs of the next forward: each data layer's next batch, and the tops of the
        Python data layers after their ``reshape`` and ``forward``."""
        batches = self.feeder.next_batches()
        for layer in self.host:
            batches.update(layer.forward())
        return batches

    def member(self, inputs: Mapping[str, Any]) -> Model:
        """The model for the shapes of ``inputs`` (by blob name; the rest as they were)."""
        model = self.model
        given = model.inputs
        shapes = {k: tuple(np.shape(v)) for k, v in inputs.items() if k in given}
        if all(given[k] == s for k, s in shapes.items()) and model.is_current():
            return model
        return model.reshape(shapes, provisional=True)

    def program(self, kind: Hashable, inputs: Mapping[str, Any],
                build: Callable[[Model], Any]) -> Any:  # fmt: skip
        """``build(model)`` for the model of ``inputs``' shapes, built once per model (kept
        with it in its family, so dropped with it)."""
        model = self.member(inputs)
        if kind not in model.programs:
            model.programs[kind] = build(model)
        return model.programs[kind]

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
