"""pycaffe's ``Net``: a view with Caffe's memory semantics over a compiled net.

Existing pycaffe scripts port by changing ``import caffe`` to ``import caffe2jax as caffe``.
What a script reads is what Caffe would hold:

* ``net.blobs`` lists Caffe's blobs in Caffe's order, split blobs
  (``<blob>_<layer>_<i>_split_<j>``) included; ``net.layers`` / ``layer_dict`` list Caffe's
  layers, Split layers included, so layer indices match pycaffe's.
* Each Blob lives as long as its net: a reshape, or a forward on inputs of a new shape,
  reshapes it in place. ``.data`` / ``.diff`` are stable numpy arrays
  (:mod:`caffe2jax.pycaffe.blob`) that follow ``forward``, ``backward``, ``solver.step``…; a
  blob holds what was last written into it, by a layer or by the script.
* Shapes flow from the inputs on every forward, over the layers it runs
  (:mod:`caffe2jax.pycaffe.runner`); param blobs are shared as in Caffe.
* Nothing is computed or copied to the host unless the call or the script reads it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import Model
from caffe2jax.lowering.python_class import in_pass, instance_of, user_errors
from caffe2jax.lowering.python_layer import python_layers as choose_python_layers
from caffe2jax.pycaffe import batches, programs
from caffe2jax.pycaffe.blob import Blob
from caffe2jax.pycaffe.mode import random_seed
from caffe2jax.pycaffe.params import ParamBlobs
from caffe2jax.pycaffe.runner import Runner, version_shape
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
        dialect: str | None = None,
        precision: str | None = None,
        python_layers: str | None = None,
    ):
        """``python_layers`` (``auto``, ``builtin``, ``user``; None: ``$CAFFE2JAX_PYTHON_LAYERS``,
        default ``auto``): which implementation runs a fork Python layer caffe2jax has built in
        (:func:`caffe2jax.lowering.python_layer.python_layers`); it wins over the variable."""
        phase, weights, base_dir = constructor_args(
            network_file, phase_or_weights, phase, weights, base_dir
        )
        self.phase = phase_name(phase)
        seed = random_seed() if seed is None else seed
        with choose_python_layers(python_layers):
            compiled = CompiledNet.build(network_file, self.phase, level=level,
                                         stages=stages or (), state=state, base_dir=base_dir,
                                         seed=seed, dtype=dtype, dialect=dialect,
                                         precision=precision)  # fmt: skip
        from caffe2jax.runtime.host.memory import check_net_fits

        model = compiled.model  # blobs and params that cannot fit: one NetError, no MemoryError
        check_net_fits(model.net, itemsize=jnp.dtype(dtype).itemsize, params=model.graph.decls)
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
        cls._attach(net, compiled, params, state)
        return net

    def _attach(self, compiled: CompiledNet, params, state) -> None:
        """Net::Init's views: the blobs, the layers, the param blobs (from ``params``)."""
        self._net = compiled
        model = compiled.model
        graph = model.graph
        hosts = {host.name for host in compiled.host}
        types = {name: "Python" for name in hosts}  # run on the host, fed as inputs
        self._structure = layout = Structure(graph.caffe_layers, model.net.name, types)
        self._inputs = [u for layer in model.net.layers
                        if layer.type == "Input" and layer.name not in hosts
                        for u in layer.top_names]  # fmt: skip
        # Net::Init lists the blobs left unconsumed from a std::set<string>: by name, bytewise
        self._outputs = tuple(sorted(model.outputs, key=str.encode))
        self.blobs: OrderedDict[str, Blob] = OrderedDict(
            (name, Blob(version_shape(model, layout.diff_version[name]), model.dtype))
            for name in layout.names
        )
        for name, weight in layout.loss_weights.items():
            self.blobs[name].set_diff(np.full(self.blobs[name].shape, weight, model.dtype))
        for host in compiled.host:  # a top keeps what a script writes into it
            host.use_tops([self.blobs[name] for name in host.layer.top_names])
        self._params = ParamBlobs(model.dtype)
        self._params.own(graph)
        self._runner = Runner(compiled, layout, self.blobs, self._params)
        self.params: OrderedDict[str, list[Blob]] = OrderedDict()
        self.layers: list[Any] = []
        instances = {host.name: host.instance for host in compiled.host}
        running = {layer.name: instance_of(layer) for layer in model.net.layers
                   if layer.type == "Python"}  # fmt: skip
        for caffe in layout.layers:
            blobs = [] if caffe.key is None else self._params.of_layer(graph, caffe.key)
            if blobs:
                self.params[caffe.key] = blobs
            # pycaffe hands back a Python layer's own object (py-faster-rcnn's train.py calls
            # solver.net.layers[0].set_roidb(roidb) on its data layer)
            view = instances.get(caffe.name) or Layer(
                caffe.name, layout.type_of(caffe), blobs, self, running.get(caffe.name)
            )
            self.layers.append(view)
        self._params.show(params, state)

    # -- structure ----------------------------------------------------------------------------

    @property
    def model(self) -> Model:
        """The model of the current input shapes (the last forward's or reshape's)."""
        return self._runner.model

    @property
    def inputs(self) -> list[str]:
        return list(self._inputs)

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
        weights = self._structure.loss_weights
        return OrderedDict((name, float(weights.get(name, 0.0))) for name in self.blobs)

    @property
    def _blob_loss_weights(self) -> list[float]:
        return list(self.blob_loss_weights.values())

    def share_with(self, other: Net) -> None:
        """Caffe's ShareTrainedLayersWith: this net's layers use ``other``'s param blobs
        (by layer name; shapes must match), so both always show the same weights."""
        self._params.share(other.param_blobs, other.model.net.name)
        graph = self._net.model.graph
        for layer, caffe in zip(self.layers, self._structure.layers):
            if caffe.key is not None and layer.blobs:
                layer.blobs[:] = self.params[caffe.key] = self._params.of_layer(graph, caffe.key)

    # -- forward / backward -------------------------------------------------------------------

    def forward(
        self,
        blobs: Sequence[str] | None = None,
        start: str | None = None,
        end: str | None = None,
        **kwargs: Any,
    ) -> dict[str, np.ndarray]:
        """Caffe's ForwardFromTo(start, end) (layer names, inclusive); inputs as keywords.

        Returns the net outputs (the ``end`` layer's tops when ``end`` is given) and any
        ``blobs`` asked for, as pycaffe does. Shapes flow from the inputs over the layers
        run (a new input shape compiles once, then is reused)."""
        for name, value in kwargs.items():
            if name not in self.blobs:
                raise NetError(f"forward() got an unknown blob '{name}'")
            value = np.asarray(value)
            if value.shape != self.blobs[name].shape:
                self.blobs[name].reshape(*value.shape)
            self.blobs[name].data[...] = value
        lo = self._structure.index(start, 0)
        hi = self._structure.index(end, len(self.layers) - 1)
        if end is not None:
            wanted = list(self._structure.layers[hi].top_names)
        else:
            wanted = list(self.outputs)
        wanted += [b for b in (blobs or []) if b not in wanted]
        self._run_forward(lo, hi, wanted)
        return {name: self.blobs[name].data for name in wanted}

    @user_errors()
    def _run_forward(self, lo: int, hi: int, wanted: list[str]) -> None:
        if lo == 0:  # Caffe's data layers run first: their tops are this forward's inputs
            for user, value in self._net.feeder.next_batches().items():
                if self.blobs[user].shape != np.shape(value):  # a top sized per batch
                    self.blobs[user].reshape(*np.shape(value))
                self.blobs[user].set_data(value)
            for host in self._net.host:
                host.forward()  # writes into the blobs it was handed (use_tops)
        self._runner.forward(lo, hi, wanted)

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
        hi = self._structure.index(start, len(self.layers) - 1)
        lo = self._structure.index(end, 0)
        with user_errors():
            self._runner.backward(lo, hi)
        if end is not None:
            wanted = list(self._structure.layers[lo].bottom_names)
        else:
            wanted = list(self.inputs)
        wanted += [d for d in (diffs or []) if d not in wanted]
        return {name: self.blobs[name].diff for name in wanted}

    def clear_param_diffs(self) -> None:
        """Caffe's Net::ClearParamDiffs: every param diff to zero."""
        self._params.clear_diffs()

    # -- shapes, data, weights ----------------------------------------------------------------

    def reshape(self) -> None:
        """Caffe's Net::Reshape: every layer's tops take the shapes the input blobs' shapes
        give (param blobs keep theirs; held Blob objects stay valid)."""
        self._runner.model = model = self._runner.member(len(self.layers) - 1, provisional=False)
        for name in self._structure.names:
            shape = version_shape(model, self._structure.data_version[name])
            if self.blobs[name].shape != shape:
                self.blobs[name].reshape(*shape)

    def close(self) -> None:
        """Stop the data layers' prefetch threads and close their files and sinks."""
        self._net.close()

    def set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        """MemoryData: each forward takes the next batch_size rows, wrapping (Caffe's Reset)."""
        self._net.feeder.set_input_arrays(data, labels)

    def copy_from(self, weights: str | os.PathLike) -> None:
        """Load a .caffemodel / .caffemodel.h5 by layer name (CopyTrainedLayersFrom)."""
        from caffe2jax.runtime.formats.weights import load_weights

        params, state = load_weights(weights, self._net.model, *self.param_values())
        self._params.show(params, state)

    def load_hdf5(self, path: str | os.PathLike) -> None:
        """Caffe's CopyTrainedLayersFromHDF5."""
        self.copy_from(path)

    def save(self, path: str | os.PathLike) -> None:
        """Write the weights as a binary .caffemodel (Net::ToProto)."""
        from caffe2jax.runtime.formats.weights import save_weights

        save_weights(path, self._net.model, *self.param_values(), format="binary")

    def save_hdf5(self, path: str | os.PathLike) -> None:
        """Write the weights in Caffe's HDF5 format (Net::ToHDF5)."""
        from caffe2jax.runtime.formats.weights import save_weights

        save_weights(path, self._net.model, *self.param_values(), format="hdf5")

    # -- the view-sync API: how a driver that runs this net (pycaffe's Solver over the
    # runtime's SolverLoop) and the views a script reads stay in step ------------------------

    @property
    def param_blobs(self) -> ParamBlobs:
        """The param Blobs by owner (what ShareTrainedLayersWith shares between nets)."""
        return self._params

    def param_values(self) -> tuple[dict, dict]:
        """The params and state the views hold now, as the functional API takes them (what a
        script wrote into the arrays included)."""
        return self._params.values()

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
        return self._params.diffs(self._net.model.graph)

    def show_param_diffs(self, diffs: Mapping) -> None:
        """New param diffs, by layer (None slots keep theirs)."""
        self._params.show_diffs(diffs)

    def input_values(self) -> dict[str, Any]:
        """What a script put in the blobs Input layers feed, as device arrays."""
        return {name: self.blobs[name].device_data() for name in self._inputs}

    def show_forward(self, env: Mapping) -> None:
        """Make the blobs show a forward the driver ran (blob versions by SSA id)."""
        for name, version in self._structure.data_version.items():
            if version in env:
                self._show(name, env[version], np.shape(env[version]))

    def show_pass(self, record: Any, outputs: Mapping[str, Any]) -> None:
        """Make the blobs show one training pass (:class:`caffe2jax.runtime.train.state.Pass`):
        its inputs and ``outputs`` (which the step returned) as they are; other blobs' data
        from a forward, and diffs from a backward, computed only when first read."""
        with in_pass(record.index):  # the pass's Python-layer top shapes pick its model
            model = self._runner.model = self._net.member(record.inputs)
        weights = self._structure.loss_weights

        def seed(name: str) -> Any:
            return jnp.full(self.blobs[name].shape, weights.get(name, 0.0), model.dtype)

        data, diff = programs.pass_values(model, record, outputs, seed)
        for name, version in self._structure.data_version.items():
            shape = version_shape(model, version)
            value = record.inputs.get(name, outputs.get(name))
            self._show(name, (lambda v=version: data(v)) if value is None else value, shape)
        last = len(self.layers) - 1
        for name, _ in programs.backward(model, 0, last)[0].writes:
            self.blobs[name].set_diff(lambda n=name: diff(n))

    def _show(self, name: str, value: Any, shape: Sequence[int]) -> None:
        blob = self.blobs[name]
        if blob.shape != tuple(shape):
            blob.reshape(*shape)
        blob.set_data(value)
