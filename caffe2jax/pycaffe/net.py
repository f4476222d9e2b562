"""pycaffe's ``Net``: a view with Caffe's memory semantics over a compiled net.

Existing pycaffe scripts port by changing ``import caffe`` to ``import caffe2jax as caffe``.
What a script reads is what Caffe would hold:

* ``net.blobs`` lists Caffe's blobs in Caffe's order, split blobs
  (``<blob>_<layer>_<i>_split_<j>``) included; ``net.layers`` / ``layer_dict`` list Caffe's
  layers, Split layers included, so layer indices match pycaffe's.
* ``.data`` / ``.diff`` are stable numpy arrays (:mod:`caffe2jax.pycaffe.blob`) that follow
  ``forward``, ``backward``, ``solver.step``…; what a script writes is what the next run reads.
* Param blobs are shared as in Caffe: by param name, and between a solver's nets.
* Nothing is copied to the host unless a script reads it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering import ranges
from caffe2jax.lowering.model import Model
from caffe2jax.lowering.python_class import settle, user_errors
from caffe2jax.pycaffe import batches
from caffe2jax.pycaffe.blob import Blob
from caffe2jax.pycaffe.mode import random_seed
from caffe2jax.pycaffe.params import ParamBlobs
from caffe2jax.pycaffe.programs import RangePrograms, pass_values
from caffe2jax.pycaffe.structure import (  # noqa: F401 - TRAIN, TEST: pycaffe names
    TEST,
    TRAIN,
    Layer,
    Structure,
    constructor_args,
    phase_name,
)
from caffe2jax.runtime.train.compiled import CompiledNet


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
    ):
        phase, weights, self._base_dir = constructor_args(
            network_file, phase_or_weights, phase, weights, base_dir
        )
        self.phase = phase_name(phase)
        seed = random_seed() if seed is None else seed
        compiled = CompiledNet.build(network_file, self.phase, level=level, stages=stages or (),
                                     state=state, base_dir=self._base_dir, seed=seed,
                                     dtype=dtype)  # fmt: skip
        self._attach(compiled, *compiled.model.init(jax.random.key(seed)))
        if weights is not None:
            self.copy_from(weights)

    @classmethod
    def view(cls, compiled: CompiledNet, params: Mapping, state: Mapping) -> Net:
        """A Net over a net another driver runs (a solver's train or test net): its data
        layers are the driver's, and the views start from ``params``/``state``. The driver
        keeps them in step through the view-sync methods below."""
        net = cls.__new__(cls)
        net.phase = compiled.model.net.phase
        net._base_dir = Path(".")
        net._attach(compiled, params, state)
        return net

    def _attach(self, compiled: CompiledNet, params, state) -> None:
        self._net = compiled
        self._params = ParamBlobs(compiled.model.dtype)
        self._compile(compiled.model)
        self._params.own(self._model.graph)
        self._make_layer_views()
        self._params.show(params, state)

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
        self._structure = layout = Structure(graph.caffe_layers, model.net.name)
        self._programs = RangePrograms(graph)
        self._last: tuple | None = None  # what the last forward ran with (for backward)
        old = getattr(self, "blobs", {})
        self.blobs: OrderedDict[str, Blob] = OrderedDict()
        shapes = model.net.shapes
        for name in layout.names:
            top = layout.diff_version[name]
            shape = tuple(shapes.get(top) or shapes[top.split("#split", 1)[0]])
            blob = old.get(name)
            self.blobs[name] = blob if blob is not None and blob.shape == shape else Blob(
                shape, model.dtype)  # fmt: skip
        self._data_version = layout.data_version
        self._initial_diffs = layout.loss_weights
        if not old:
            for name, weight in self._initial_diffs.items():
                self.blobs[name]._set_diff(np.full(self.blobs[name].shape, weight, model.dtype))
        self._input_version = graph.input_versions

    def _make_layer_views(self) -> None:
        graph = self._model.graph
        self.params: OrderedDict[str, list[Blob]] = OrderedDict()
        self.layers: list[Layer] = []
        for caffe in graph.caffe_layers:
            blobs = [] if caffe.key is None else self._params.of_layer(graph, caffe.key)
            if blobs:
                self.params[caffe.key] = blobs
            self.layers.append(Layer(caffe.name, caffe.type, blobs, self))

    @property
    def inputs(self) -> list[str]:
        return [u for layer in self._model.net.layers if layer.type == "Input"
                for u in layer.top_names]  # fmt: skip

    @property
    def outputs(self) -> list[str]:
        return list(self._outputs)

    @property
    def _layer_names(self) -> list[str]:
        return list(self._structure.layer_names)

    @property
    def layer_dict(self) -> OrderedDict[str, Layer]:
        return OrderedDict(zip(self._layer_names, self.layers))

    @property
    def top_names(self) -> OrderedDict[str, list[str]]:
        return self._structure.top_names()

    @property
    def bottom_names(self) -> OrderedDict[str, list[str]]:
        return self._structure.bottom_names()

    @property
    def blob_loss_weights(self) -> OrderedDict[str, float]:
        """pycaffe's ``blob_loss_weights``: each blob's loss weight (0 for most)."""
        return OrderedDict((name, float(self._initial_diffs.get(name, 0.0))) for name in self.blobs)

    @property
    def _blob_loss_weights(self) -> list[float]:
        return list(self.blob_loss_weights.values())

    def share_with(self, other: Net) -> None:
        """Caffe's ShareTrainedLayersWith: this net's layers use ``other``'s param blobs
        (by layer name; shapes must match), so both always show the same weights."""
        self._params.share(other._params, other._model.net.name)
        self._make_layer_views()

    # -- forward / backward -----------------------------------------------------------------

    def _index(self, name: str | None, default: int) -> int:
        return self._structure.index(name, default)

    def _reshape_if_needed(self) -> None:
        shapes = {n: self.blobs[n].shape for n in self._inputs}
        if shapes != self._inputs:
            self.reshape()

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
            for user, value in self._net.feeder.next_batches().items():
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
            env = self._blob_env(ranges.plan(graph, lo, hi).external)
        params, state = self.param_values()
        env, new_state, self._net.key, rng = self._programs.forward(lo, hi)(
            params, state, env, self._net.key
        )
        settle(self._model.net, env)
        self._last = (params, state, rng)
        for name, version in self._data_version.items():
            if version in env and name not in self._inputs:
                self.blobs[name]._set_data(env[version])
        self._params.show({}, new_state)
        self._net.sinks.write(env)

    # pycaffe's whole-array helpers, as pycaffe attaches them (_Net_forward_all…)
    forward_all = batches.forward_all
    forward_backward_all = batches.forward_backward_all

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
        plan, fn = self._programs.backward(lo, hi)
        if self._last is None:
            params, state = self.param_values()
            rng = self._net.key
        else:
            _, state, rng = self._last
            params, _ = self.param_values()
        env = self._blob_env(plan.external)
        top_diffs = {name: self.blobs[name]._diff_device() for _, name in plan.seeds}
        diffs, grads, _ = fn(params, state, env, rng, top_diffs)
        settle(self._model.net, (diffs, grads))
        for name, value in diffs.items():
            self.blobs[name]._set_diff(value)
        self._params.add_diffs(grads, ranges.param_mask(self._model.graph, lo, hi))

    def clear_param_diffs(self) -> None:
        """Caffe's Net::ClearParamDiffs: every param diff to zero."""
        self._params.clear_diffs()

    # -- shapes, data, weights ----------------------------------------------------------------

    def reshape(self) -> None:
        """Caffe's Net::Reshape: re-infer every shape from the input blobs' shapes (params
        are kept; the net recompiles)."""
        shapes = {n: self.blobs[n].shape for n in self._model.inputs}
        params, state = self.param_values()
        self._compile(self._model.reshape(shapes))
        self._make_layer_views()
        self._params.show(params, state)

    def close(self) -> None:
        """Stop the data layers' prefetch threads and close their files and sinks."""
        self._net.feeder.close()
        self._net.sinks.close()

    def set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        """MemoryData: each forward takes the next batch_size rows, wrapping (Caffe's Reset)."""
        self._net.feeder.set_input_arrays(data, labels)

    def copy_from(self, weights: str | os.PathLike) -> None:
        """Load a .caffemodel / .caffemodel.h5 by layer name (CopyTrainedLayersFrom)."""
        from caffe2jax.runtime.formats.weights import load_weights

        params, state = load_weights(weights, self._model, *self.param_values())
        self._params.show(params, state)

    def load_hdf5(self, path: str | os.PathLike) -> None:
        """Caffe's CopyTrainedLayersFromHDF5."""
        self.copy_from(path)

    def save(self, path: str | os.PathLike) -> None:
        """Write the weights as a binary .caffemodel (Net::ToProto)."""
        from caffe2jax.runtime.formats.weights import save_weights

        save_weights(path, self._model, *self.param_values(), format="binary")

    def save_hdf5(self, path: str | os.PathLike) -> None:
        """Write the weights in Caffe's HDF5 format (Net::ToHDF5)."""
        from caffe2jax.runtime.formats.weights import save_weights

        save_weights(path, self._model, *self.param_values(), format="hdf5")

    # -- the view-sync API: how a driver that runs this net (pycaffe's Solver over the
    # runtime's SolverLoop) and the views a script reads stay in step ------------------------

    def param_values(self) -> tuple[dict, dict]:
        """The params and state the views hold now, as the functional API takes them (what a
        script wrote into the arrays included)."""
        return self._params.values(self._model.graph)

    @property
    def params_version(self) -> int:
        """Counts the param values shown (:meth:`show_params`, or a forward that moved
        BatchNorm's statistics)."""
        return self._params.version

    def params_written(self) -> bool:
        """Whether a script may have written a param array since its value was last shown."""
        return self._params.written()

    def show_params(self, params: Mapping, state: Mapping) -> None:
        """New param and state values (None slots keep theirs); arrays scripts hold see
        them."""
        self._params.show(params, state)

    def param_diff_values(self) -> dict[str, list]:
        """The param diffs the views hold (a script's own ``backward``), as a tree."""
        return self._params.diffs(self._model.graph)

    def show_param_diffs(self, diffs: Mapping) -> None:
        """New param diffs, by layer (None slots keep theirs)."""
        self._params.show_diffs(diffs)

    def input_values(self) -> dict[str, Any]:
        """What a script put in the blobs Input layers feed, as device arrays."""
        return {name: self.blobs[name]._device() for name in self._model.inputs}

    def show_forward(self, env: Mapping) -> None:
        """Make the blobs show a forward the driver ran (blob versions by SSA id)."""
        for name, version in self._data_version.items():
            if version in env:
                self.blobs[name]._set_data(env[version])

    def show_pass(self, record: Any, outputs: Mapping[str, Any]) -> None:
        """Make the blobs show one training pass (:class:`caffe2jax.runtime.train.state.Pass`):
        its inputs and ``outputs`` (which the step returned) as they are; other blobs' data
        from a forward, and diffs from a backward, computed only when first read."""
        dtype = self._model.dtype

        def seed(name: str) -> Any:
            return jnp.full(self.blobs[name].shape, self._initial_diffs.get(name, 0.0), dtype)

        data, diff = pass_values(self._programs, record, outputs, seed)
        for name, version in self._data_version.items():
            if name in record.inputs:
                self.blobs[name]._set_data(record.inputs[name])
            elif name in outputs:
                self.blobs[name]._set_data(outputs[name])
            else:
                self.blobs[name]._set_data(lambda v=version: data(v))
        for name, _ in self._programs.backward(0, len(self.layers) - 1)[0].writes:
            self.blobs[name]._set_diff(lambda n=name: diff(n))
