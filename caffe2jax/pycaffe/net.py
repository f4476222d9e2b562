"""pycaffe's ``Net``: a view with Caffe's memory semantics over a compiled net.

Existing pycaffe scripts port by changing ``import caffe`` to ``import caffe2jax as caffe``.
What a script reads is what Caffe would hold:

* ``net.blobs`` lists Caffe's blobs in Caffe's order, split blobs
  (``<blob>_<layer>_<i>_split_<j>``) included; ``net.layers`` / ``layer_dict`` list Caffe's
  layers, Split layers included, so layer indices match pycaffe's.
* ``.data`` / ``.diff`` are stable numpy arrays (:mod:`caffe2jax.pycaffe.blob`): an array a script
  holds shows new values after ``forward``, ``backward``, ``solver.step``, ``copy_from``…, and
  what a script writes into it is what the next computation reads.
* Param blobs are shared the way Caffe shares them: between layers that name the same param,
  and between a solver's train net and its test nets (``share_with``).
* Nothing is copied to the host unless a script reads it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import CaffeError, NetError
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering import ranges as passes
from caffe2jax.lowering.model import Model
from caffe2jax.lowering.python_class import settle, user_errors
from caffe2jax.lowering.registry import NetState, carry_of
from caffe2jax.pycaffe.blob import Blob
from caffe2jax.pycaffe.mode import random_seed
from caffe2jax.runtime.data.feeding import Feeder, Sinks
from caffe2jax.runtime.train.loop import CompiledNet

TRAIN = 0
TEST = 1


def phase_name(phase: int | str) -> str:
    """Caffe's Phase enum (TRAIN = 0, TEST = 1) or its name → "TRAIN" / "TEST"."""
    if phase in (TRAIN, "TRAIN", "train"):
        return ir.TRAIN
    if phase in (TEST, "TEST", "test"):
        return ir.TEST
    raise CaffeError(f"unknown phase {phase!r}: use caffe2jax.TRAIN or caffe2jax.TEST")


class Layer:
    """pycaffe's layer view: ``type``, ``blobs`` (its param blobs) and ``reshape``."""

    def __init__(self, name: str, type_: str, blobs: list[Blob], net: Net):
        self.name = name
        self.type = type_
        self.blobs = blobs
        self._net = net

    def reshape(self, bottom=None, top=None) -> None:
        """Caffe's Layer::Reshape from pycaffe: the net re-infers every shape."""
        self._net.reshape()

    def __repr__(self) -> str:
        return f"<Layer {self.name!r} type {self.type}>"


class Net:
    """pycaffe's ``caffe.Net(network_file, phase, level=0, stages=None, weights=None)``.

    The older ``Net(network_file, weights, phase)`` form is accepted too.
    """

    def __init__(
        self,
        network_file: str | os.PathLike,
        phase_or_weights: Any = TEST,
        phase: Any = None,
        *,
        level: int = 0,
        stages: Sequence[str] | None = None,
        weights: str | os.PathLike | None = None,
        dtype: Any = jnp.float32,
        seed: int | None = None,
        state: Any = None,
        base_dir: str | os.PathLike | None = None,
        dialect: str | None = None,
    ):
        if isinstance(phase_or_weights, str | os.PathLike) and phase_or_weights not in (
            "TRAIN",
            "TEST",
            "train",
            "test",
        ):
            weights, phase_or_weights = phase_or_weights, TEST if phase is None else phase
        self.phase = phase_name(phase_or_weights)
        seed = random_seed() if seed is None else seed
        if base_dir is not None:
            self._base_dir = Path(base_dir)
        elif isinstance(network_file, str | os.PathLike) and not _is_text(network_file):
            self._base_dir = Path(network_file).parent
        else:
            self._base_dir = Path(".")
        net = load_net(network_file, self.phase, level, stages or (), state=state,
                       dialect=dialect)  # fmt: skip
        feeder = Feeder(net, self._base_dir, seed=seed)
        compiled = CompiledNet(Model(net, feeder.input_shapes(), dtype), feeder, Sinks(net),
                               jax.random.key(seed))  # fmt: skip
        self._attach(compiled, *compiled.model.init(jax.random.key(seed)))
        if weights is not None:
            self.copy_from(weights)

    @classmethod
    def _over(cls, compiled: CompiledNet, params, state) -> Net:
        """A view over a net a solver runs (no second copy of its data layers)."""
        net = cls.__new__(cls)
        net.phase = compiled.model.net.phase
        net._base_dir = Path(".")
        net._attach(compiled, params, state)
        return net

    def _attach(self, compiled: CompiledNet, params, state) -> None:
        self._net = compiled
        self._carry: dict[str, list] = {}
        self._param_blobs: dict[tuple[str, int], Blob] = {}
        self._compile(compiled.model)
        self._own_params(params, state)

    @property
    def _feeder(self) -> Feeder:
        return self._net.feeder

    @property
    def _sinks(self) -> Sinks:
        return self._net.sinks

    # -- structure ------------------------------------------------------------------------

    @property
    def model(self) -> Model:
        return self._model

    def _compile(self, model: Model) -> None:
        """Views for a (re)compiled model: blobs by Caffe's names, layers, compiled ranges."""
        self._model = self._net.model = model
        self._inputs = model.inputs  # computed once: forward reads them on every call
        self._outputs = tuple(model.outputs)
        graph = model.graph
        self._jitted: dict[tuple, Any] = {}
        self._last: tuple | None = None  # what the last forward ran with (for backward)
        old = getattr(self, "blobs", {})
        self.blobs: OrderedDict[str, Blob] = OrderedDict()
        self._data_version: dict[str, str] = {}  # Caffe blob name -> version its data shows
        self._diff_version: dict[str, str] = {}
        net = model.net
        for caffe in graph.caffe_layers:
            for top, name in zip(caffe.tops, caffe.top_names):
                self._data_version[name] = top
                if name not in self.blobs:
                    self._diff_version[name] = top
                    shape = net.shapes.get(top) or net.shapes[top.split("#split", 1)[0]]
                    blob = old.get(name)
                    if blob is None or blob.shape != tuple(shape):
                        blob = Blob(shape, model.dtype)
                    self.blobs[name] = blob
        self._initial_diffs = {
            name: w for caffe in graph.caffe_layers
            for name, w in zip(caffe.top_names, caffe.loss_weights) if w
        }  # fmt: skip
        if not old:
            for name, weight in self._initial_diffs.items():
                self.blobs[name]._set_diff(np.full(self.blobs[name].shape, weight, model.dtype))
        self._input_version = dict(graph._input_ssa)

    def _own_params(self, params, state) -> None:
        """Param Blobs: one per owned blob (a sharer gets its owner's); the layer views."""
        graph = self._model.graph
        for name, j, decl in graph._owned():
            if (name, j) not in self._param_blobs:
                self._param_blobs[(name, j)] = Blob(decl.shape, self._model.dtype)
        self._make_layer_views()
        self._set_params(params, state)

    def _make_layer_views(self) -> None:
        graph = self._model.graph
        self.params: OrderedDict[str, list[Blob]] = OrderedDict()
        self.layers: list[Layer] = []
        for caffe in graph.caffe_layers:
            blobs = []
            if caffe.key is not None:
                for j in range(len(graph.decls.get(caffe.key, []))):
                    blobs.append(
                        self._param_blobs[graph.shared.get((caffe.key, j), (caffe.key, j))]
                    )
                if blobs:
                    self.params[caffe.key] = blobs
            self.layers.append(Layer(caffe.name, caffe.type, blobs, self))

    def _set_params(self, params, state) -> None:
        """New values for the param Blobs (arrays users hold see them); values a layer
        carries between forwards (not Caffe blobs) are kept aside. ``_params_version`` counts
        these changes (a solver notices a forward that moved BatchNorm's statistics)."""
        self._params_version = getattr(self, "_params_version", 0) + 1
        self._carry.update({name: list(c) for name, c in carry_of(state).items()})
        for tree in (params, state):
            for name, values in tree.items():
                for j, value in enumerate(values):
                    if value is not None and (name, j) in self._param_blobs:
                        self._param_blobs[(name, j)]._set_data(value)

    @property
    def inputs(self) -> list[str]:
        return [u for layer in self._model.net.layers if layer.type == "Input"
                for u in layer.top_names]  # fmt: skip

    @property
    def outputs(self) -> list[str]:
        return list(self._outputs)

    @property
    def _layer_names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    @property
    def layer_dict(self) -> OrderedDict[str, Layer]:
        return OrderedDict(zip(self._layer_names, self.layers))

    @property
    def top_names(self) -> OrderedDict[str, list[str]]:
        return OrderedDict((c.name, list(c.top_names)) for c in self._model.graph.caffe_layers)

    @property
    def bottom_names(self) -> OrderedDict[str, list[str]]:
        return OrderedDict((c.name, list(c.bottom_names)) for c in self._model.graph.caffe_layers)

    @property
    def blob_loss_weights(self) -> OrderedDict[str, float]:
        """pycaffe's ``blob_loss_weights``: each blob's loss weight (0 for most)."""
        return OrderedDict((name, float(self._initial_diffs.get(name, 0.0))) for name in self.blobs)

    @property
    def _blob_loss_weights(self) -> list[float]:
        return list(self.blob_loss_weights.values())

    # -- params and state as pytrees --------------------------------------------------------

    def _trees(self) -> tuple[dict, dict]:
        """The current params and state as the functional API takes them."""
        graph = self._model.graph
        params: dict[str, list] = {}
        state: dict[str, list] = {}
        for name, j, decl in graph._owned():
            tree = state if decl.state else params
            blobs = tree.setdefault(name, [None] * len(graph.decls[name]))
            blobs[j] = self._param_blobs[(name, j)]._device()
        state = NetState(state, self._carry)
        return params, state

    def _param_diffs(self) -> dict:
        graph = self._model.graph
        return {
            name: [self._param_blobs[(name, j)]._diff_device()
                   if (name, j) in self._param_blobs else None for j in range(len(decls))]
            for name, decls in graph.decls.items() if decls
        }  # fmt: skip

    def share_with(self, other: Net) -> None:
        """Caffe's ShareTrainedLayersWith: this net's layers use ``other``'s param blobs
        (by layer name; shapes must match), so both always show the same weights."""
        mine = self._model.graph
        for (name, j), blob in list(self._param_blobs.items()):
            theirs = other._param_blobs.get((name, j))
            if theirs is None or theirs is blob:
                continue
            if theirs.shape != blob.shape:
                raise NetError(
                    f"cannot share layer '{name}' blob {j}: its shape is {list(blob.shape)} "
                    f"here and {list(theirs.shape)} in net '{other._model.net.name}'"
                )
            self._param_blobs[(name, j)] = theirs
        del mine
        self._make_layer_views()

    # -- forward / backward -----------------------------------------------------------------

    def _index(self, name: str | None, default: int) -> int:
        if name is None:
            return default
        try:
            return self._layer_names.index(name)
        except ValueError:
            raise NetError(f"no layer named '{name}' in net '{self._model.net.name}'") from None

    def _reshape_if_needed(self) -> None:
        shapes = {n: self.blobs[n].shape for n in self._inputs}
        if shapes != self._inputs:
            self.reshape()

    def _compiled(self, kind: str, lo: int, hi: int):
        key = (kind, lo, hi)
        if key not in self._jitted:
            graph = self._model.graph
            if kind == "forward":
                fn = passes.forward_fn(graph, lo, hi)

                def step(params, state, env, key):
                    key, rng = jax.random.split(key)
                    env, state = fn(params, state, env, rng)
                    return env, state, key, rng

                self._jitted[key] = jax.jit(step)
            elif kind == "replay":
                kept = tuple(v for v, _ in passes.host_tops(graph))
                self._jitted[key] = jax.jit(passes.forward_fn(graph, lo, hi, kept))
            else:
                plan = passes.plan(graph, lo, hi)
                self._jitted[key] = (plan, jax.jit(passes.backward_fn(graph, plan)))
        return self._jitted[key]

    def _blob_env(self, versions) -> dict[str, Any]:
        """The values Caffe's layers would read from memory for these (version, blob) pairs."""
        return {v: self.blobs[name]._device() for v, name in versions}

    def forward(
        self,
        blobs: Sequence[str] | None = None,
        start: str | None = None,
        end: str | None = None,
        **kwargs: Any,
    ) -> dict[str, np.ndarray]:
        """Caffe's ForwardFromTo(start, end) (layer names, inclusive); inputs as keywords.

        Returns the net outputs (the ``end`` layer's tops when ``end`` is given) and any
        ``blobs`` asked for, as pycaffe does.
        """
        for name, value in kwargs.items():
            if name not in self.blobs:
                raise NetError(f"forward() got an unknown blob '{name}'")
            value = np.asarray(value)
            if value.shape != self.blobs[name].shape:
                self.blobs[name].reshape(*value.shape)
            self.blobs[name].data[...] = value
        lo = self._index(start, 0)
        if lo == 0:
            for user, value in self._feeder.next_batches().items():
                self.blobs[user]._set_data(value)
        self._reshape_if_needed()
        hi = self._index(end, len(self.layers) - 1)
        self._run_forward(lo, hi)
        if end is not None:
            wanted = list(self.top_names[self.layers[hi].name])
        else:
            wanted = list(self.outputs)
        wanted += [b for b in (blobs or []) if b not in wanted]
        return {name: self.blobs[name].data for name in wanted}

    @user_errors()
    def _run_forward(self, lo: int, hi: int) -> None:
        graph = self._model.graph
        if lo == 0:
            env = self._blob_env((self._input_version[n], n) for n in self._inputs)
        else:
            env = self._blob_env(passes.plan(graph, lo, hi).external)
        params, state = self._trees()
        env, new_state, self._net.key, rng = self._compiled("forward", lo, hi)(
            params, state, env, self._net.key
        )
        settle(self._model.net, env)
        self._last = (params, state, rng)
        for name, version in self._data_version.items():
            if version in env and name not in self._inputs:
                self.blobs[name]._set_data(env[version])
        self._set_params({}, new_state)
        self._sinks.write(env)

    def forward_all(self, blobs: Sequence[str] | None = None, **kwargs: Any) -> dict:
        """Forward every row of the given input arrays, a batch at a time (the last batch is
        padded); returns the outputs (and ``blobs``) for all rows, as pycaffe does."""
        if not kwargs:
            raise NetError("forward_all() needs the input arrays as keywords")
        rows = {len(v) for v in kwargs.values()}
        if len(rows) != 1:
            raise NetError("forward_all(): every input needs the same number of rows")
        total = rows.pop()
        batch = self.blobs[next(iter(kwargs))].shape[0]
        outs: dict[str, list[np.ndarray]] = {}
        for start in range(0, total, batch):
            chunk = {name: _padded(value[start : start + batch], batch)
                     for name, value in kwargs.items()}  # fmt: skip
            for name, value in self.forward(blobs, **chunk).items():
                outs.setdefault(name, []).append(np.array(value))
        return _rows(outs, total)

    def backward(
        self,
        diffs: Sequence[str] | None = None,
        start: str | None = None,
        end: str | None = None,
        **kwargs: Any,
    ) -> dict[str, np.ndarray]:
        """Caffe's BackwardFromTo(start, end): top diffs as keywords (outputs only).

        Writes each bottom's diff, *adds* to the param diffs (as Caffe does; call
        ``clear_param_diffs`` to start over), and returns the diffs of the inputs (of the
        ``end`` layer's bottoms when ``end`` is given) and any ``diffs`` asked for.
        """
        for name, value in kwargs.items():
            if name not in self.outputs:
                raise NetError(f"backward() takes diffs of output blobs; '{name}' is not one")
            self.blobs[name].diff[...] = value
        hi = self._index(start, len(self.layers) - 1)
        lo = self._index(end, 0)
        self._run_backward(lo, hi)
        if end is not None:
            wanted = list(self.bottom_names[self.layers[lo].name])
        else:
            wanted = list(self.inputs)
        wanted += [d for d in (diffs or []) if d not in wanted]
        return {name: self.blobs[name].diff for name in wanted}

    @user_errors()
    def _run_backward(self, lo: int, hi: int) -> None:
        plan, fn = self._compiled("backward", lo, hi)
        if self._last is None:
            params, state = self._trees()
            rng = self._net.key
        else:
            _, state, rng = self._last
            params, _ = self._trees()
        env = self._blob_env(plan.external)
        top_diffs = {name: self.blobs[name]._diff_device() for _, name in plan.seeds}
        diffs, grads, _ = fn(params, state, env, rng, top_diffs)
        settle(self._model.net, (diffs, grads))
        for name, value in diffs.items():
            self.blobs[name]._set_diff(value)
        mask = passes.param_mask(self._model.graph, lo, hi)
        for name, flags in mask.items():
            for j, on in enumerate(flags):
                if on and grads.get(name) is not None and grads[name][j] is not None:
                    blob = self._param_blobs[(name, j)]
                    blob._set_diff(blob._diff_device() + grads[name][j])

    def clear_param_diffs(self) -> None:
        """Caffe's Net::ClearParamDiffs: every param diff to zero."""
        for blob in self._param_blobs.values():
            blob._set_diff(None)

    def forward_backward_all(
        self, blobs: Sequence[str] | None = None, diffs: Sequence[str] | None = None, **kwargs
    ) -> tuple[dict, dict]:
        """pycaffe's forward_backward_all: forward and backward over every batch of the given
        inputs (output diffs may be given as keywords too); outputs and input diffs."""
        inputs = {k: v for k, v in kwargs.items() if k in self.inputs}
        top_diffs = {k: v for k, v in kwargs.items() if k in self.outputs}
        rows = {len(v) for v in [*inputs.values(), *top_diffs.values()]}
        if len(rows) != 1:
            raise NetError("forward_backward_all(): every array needs the same number of rows")
        total = rows.pop()
        batch = self.blobs[self.inputs[0]].shape[0] if self.inputs else total
        outs: dict[str, list] = {}
        grads: dict[str, list] = {}
        for start in range(0, total, batch):
            rows_in = {k: _padded(v[start : start + batch], batch) for k, v in inputs.items()}
            for name, value in self.forward(blobs, **rows_in).items():
                outs.setdefault(name, []).append(np.array(value))
            rows_diff = {k: _padded(v[start : start + batch], batch)
                         for k, v in top_diffs.items()}  # fmt: skip
            for name, value in self.backward(diffs, **rows_diff).items():
                grads.setdefault(name, []).append(np.array(value))
        return _rows(outs, total), _rows(grads, total)

    # -- shapes, data, weights ----------------------------------------------------------------

    def reshape(self) -> None:
        """Caffe's Net::Reshape: re-infer every shape from the input blobs' shapes (params
        are kept; the net recompiles)."""
        shapes = {n: self.blobs[n].shape for n in self._model.inputs}
        params, state = self._trees()
        self._compile(self._model.reshape(shapes))
        self._make_layer_views()
        self._set_params(params, state)

    def close(self) -> None:
        """Stop the data layers' prefetch threads and close their files and sinks."""
        self._feeder.close()
        self._sinks.close()

    def set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        """MemoryData: each forward takes the next batch_size rows, wrapping (Caffe's Reset)."""
        self._feeder.set_input_arrays(data, labels)

    def copy_from(self, weights: str | os.PathLike) -> None:
        """Load a .caffemodel / .caffemodel.h5 by layer name (CopyTrainedLayersFrom)."""
        from caffe2jax.runtime.formats.weights import load_weights

        params, state = load_weights(weights, self._model, *self._trees())
        self._set_params(params, state)

    def load_hdf5(self, path: str | os.PathLike) -> None:
        """Caffe's CopyTrainedLayersFromHDF5."""
        self.copy_from(path)

    def save(self, path: str | os.PathLike) -> None:
        """Write the weights as a binary .caffemodel (Net::ToProto)."""
        from caffe2jax.runtime.formats.weights import save_weights

        save_weights(path, self._model, *self._trees(), format="binary")

    def save_hdf5(self, path: str | os.PathLike) -> None:
        """Write the weights in Caffe's HDF5 format (Net::ToHDF5)."""
        from caffe2jax.runtime.formats.weights import save_weights

        save_weights(path, self._model, *self._trees(), format="hdf5")

    # -- for the solver ---------------------------------------------------------------------

    def _show_forward(self, env: dict) -> None:
        """Make the blobs show a forward the solver ran (a test pass)."""
        for name, version in self._data_version.items():
            if version in env:
                self.blobs[name]._set_data(env[version])

    def _show_pass(self, record: Any, outputs: dict[str, Any]) -> None:
        """Make the blobs show one training pass (:class:`caffe2jax.runtime.train.state.Pass`):
        its inputs and ``outputs`` (which the step returned) as they are; other blobs' data
        from a forward, and diffs from a backward, recomputed only when first read."""
        hi = len(self.layers) - 1
        dtype = self._model.dtype
        forward = self._compiled("replay", 0, hi)
        plan, backward = self._compiled("backward", 0, hi)
        cache: dict[str, Any] = {}

        def env() -> dict[str, Any]:
            given = {self._input_version[n]: jnp.asarray(v, dtype)
                     for n, v in record.inputs.items() if n in self._input_version}  # fmt: skip
            given.update({v: outputs[v] for v, _ in passes.host_tops(self._model.graph)})
            return given

        def data(version: str) -> Any:
            if "out" not in cache:
                cache["out"] = forward(record.params, record.state, env(), record.rng)[0]
            return cache["out"][version]

        def diff(name: str) -> Any:
            if "diffs" not in cache:
                seeds = {n: jnp.full(self.blobs[n].shape, self._initial_diffs.get(n, 0.0), dtype)
                         for _, n in plan.seeds}  # fmt: skip
                cache["diffs"] = backward(record.params, record.state, env(), record.rng,
                                          seeds)[0]  # fmt: skip
            return cache["diffs"][name]

        for name, version in self._data_version.items():
            if name in record.inputs:
                self.blobs[name]._set_data(record.inputs[name])
            elif name in outputs:
                self.blobs[name]._set_data(outputs[name])
            else:
                self.blobs[name]._set_data(lambda v=version: data(v))
        for name, _ in plan.writes:
            self.blobs[name]._set_diff(lambda n=name: diff(n))


def _rows(parts: dict[str, list[np.ndarray]], total: int) -> dict[str, np.ndarray]:
    """Per-batch results joined row-wise (padding dropped); a scalar output such as a loss
    gives one value per batch (pycaffe cannot join those at all)."""
    return {name: np.stack(v) if v[0].ndim == 0 else np.concatenate(v)[:total]
            for name, v in parts.items()}  # fmt: skip


def _padded(value: Any, batch: int) -> np.ndarray:
    part = np.asarray(value, np.float32)
    if len(part) < batch:  # pad the last batch, as pycaffe does
        part = np.concatenate([part, np.zeros((batch - len(part), *part.shape[1:]), np.float32)])
    return part


def _is_text(source: Any) -> bool:
    return isinstance(source, str) and ("\n" in source or "{" in source)
