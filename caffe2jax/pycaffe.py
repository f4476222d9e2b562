"""pycaffe's ``Net`` and ``Blob``, backed by jitted JAX functions.

Existing pycaffe scripts port by changing ``import caffe`` to ``import caffe2jax as caffe``:
``net.blobs[name].data`` / ``.diff``, ``net.params[layer][i].data``, ``net.forward(**inputs)``,
``net.backward(**top_diffs)``, ``net.reshape()``, ``net.copy_from(path)``, ``net.save(path)``,
``net.set_input_arrays(data, labels)``. Each of forward and backward compiles once per input
shape (and per ``start``/``end`` range).
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

from caffe2jax import ir
from caffe2jax.api import Model
from caffe2jax.blob import Blob, Layer
from caffe2jax.errors import CaffeError, NetError
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.registry import is_carry
from caffe2jax.mode import random_seed
from caffe2jax.runtime.feeding import Feeder, Sinks

TRAIN = 0
TEST = 1


def phase_name(phase: int | str) -> str:
    """Caffe's Phase enum (TRAIN = 0, TEST = 1) or its name → "TRAIN" / "TEST"."""
    if phase in (TRAIN, "TRAIN", "train"):
        return ir.TRAIN
    if phase in (TEST, "TEST", "test"):
        return ir.TEST
    raise CaffeError(f"unknown phase {phase!r}: use caffe2jax.TRAIN or caffe2jax.TEST")


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
        if isinstance(phase_or_weights, str | os.PathLike) and phase_or_weights not in (
            "TRAIN",
            "TEST",
            "train",
            "test",
        ):
            weights, phase_or_weights = phase_or_weights, TEST if phase is None else phase
        self.phase = phase_name(phase_or_weights)
        seed = random_seed() if seed is None else seed
        self._source = network_file
        if base_dir is not None:
            self._base_dir = Path(base_dir)
        elif isinstance(network_file, str | os.PathLike) and not _is_text(network_file):
            self._base_dir = Path(network_file).parent
        else:
            self._base_dir = Path(".")
        net = load_net(network_file, self.phase, level, stages or (), state=state)
        self._feeder = Feeder(net, self._base_dir, seed=seed)
        self._sinks = Sinks(net)
        self._model = Model(net, self._feeder.input_shapes(), dtype)
        self._rng = jax.random.key(seed)
        self._jitted: dict[tuple, Any] = {}
        self._carry: dict[str, list] = {}
        params, state = self._model.init(jax.random.key(seed))
        self._make_blobs()
        self._make_params(params, state)
        if weights is not None:
            self.copy_from(weights)

    # -- structure ------------------------------------------------------------------------

    @property
    def model(self) -> Model:
        return self._model

    def _make_blobs(self) -> None:
        net = self._model.net
        self.blobs: OrderedDict[str, Blob] = OrderedDict()
        for layer in net.layers:
            for user in layer.top_names:
                if user not in self.blobs:
                    self.blobs[user] = Blob(net.shapes[net.blob_names[user]], self._model.dtype)
        for layer in net.layers:  # loss tops start with their loss weight as diff, as in Caffe
            for user, weight in zip(layer.top_names, layer.loss_weights):
                if weight:
                    self.blobs[user].diff[...] = weight

    def _make_params(self, params, state) -> None:
        """Create the param Blobs (one per owned blob; sharers get the owner's Blob)."""
        graph = self._model.graph
        own: dict[tuple[str, int], Blob] = {}
        self.params: OrderedDict[str, list[Blob]] = OrderedDict()
        self.layers: list[Layer] = []
        for layer in self._model.net.layers:
            blobs = []
            for j, decl in enumerate(graph.decls.get(layer.name, [])):
                if (layer.name, j) in graph.shared:
                    blob = own[graph.shared[(layer.name, j)]]
                else:
                    blob = Blob(decl.shape, self._model.dtype)
                    own[(layer.name, j)] = blob
                blobs.append(blob)
            if blobs:
                self.params[layer.name] = blobs
            self.layers.append(Layer(layer, blobs))
        self._set_params(params, state)

    def _set_params(self, params, state) -> None:
        """New values for the param Blobs, in place (references users hold stay valid); values
        a layer carries between forwards (not Caffe blobs) are kept aside."""
        for tree in (params, state):
            for name, values in tree.items():
                if is_carry(name):
                    self._carry[name] = list(values)
                    continue
                for j, value in enumerate(values):
                    if value is not None:
                        self.params[name][j]._set_device(value)

    @property
    def inputs(self) -> list[str]:
        return [u for layer in self._model.net.layers if layer.type == "Input"
                for u in layer.top_names]  # fmt: skip

    @property
    def outputs(self) -> list[str]:
        return list(self._model.outputs)

    @property
    def _layer_names(self) -> list[str]:
        return [layer.name for layer in self._model.net.layers]

    @property
    def layer_dict(self) -> OrderedDict[str, Layer]:
        return OrderedDict(zip(self._layer_names, self.layers))

    @property
    def top_names(self) -> OrderedDict[str, list[str]]:
        return OrderedDict((layer.name, list(layer.top_names)) for layer in self._model.net.layers)

    @property
    def bottom_names(self) -> OrderedDict[str, list[str]]:
        return OrderedDict(
            (layer.name, list(layer.bottom_names)) for layer in self._model.net.layers
        )

    # -- params and state as pytrees --------------------------------------------------------

    def _trees(self) -> tuple[dict, dict]:
        graph = self._model.graph
        params: dict[str, list] = {}
        state: dict[str, list] = {}
        for layer in self._model.net.layers:
            decls = graph.decls.get(layer.name, [])
            p, s = [None] * len(decls), [None] * len(decls)
            for j, decl in enumerate(decls):
                if (layer.name, j) not in graph.shared:
                    (s if decl.state else p)[j] = jnp.asarray(self.params[layer.name][j]._value())
            if any(v is not None for v in p):
                params[layer.name] = p
            if any(v is not None for v in s):
                state[layer.name] = s
        state.update(self._carry)
        return params, state

    # -- forward / backward -----------------------------------------------------------------

    def _index(self, name: str | None, default: int) -> int:
        if name is None:
            return default
        try:
            return self._layer_names.index(name)
        except ValueError:
            raise NetError(f"no layer named '{name}' in net '{self._model.net.name}'") from None

    def _reshape_if_needed(self) -> None:
        shapes = {n: self.blobs[n].shape for n in self._model.inputs}
        if shapes != self._model.inputs:
            self.reshape()

    def _compiled(self, kind: str, start: int, stop: int):
        key = (kind, start, stop)
        if key not in self._jitted:
            graph = self._model.graph
            if kind == "forward":

                def fn(params, state, env, rng):
                    return graph.run(params, state, env, rng, start=start, stop=stop)
            else:
                fn = self._backward_fn()
            self._jitted[key] = jax.jit(fn)
        return self._jitted[key]

    def _env(self) -> dict[str, jax.Array]:
        """Every blob's current value, keyed by the SSA id of its final version."""
        net = self._model.net
        env = {}
        for user, blob in self.blobs.items():
            value = blob._value()
            if value is not None:
                env[net.blob_names[user]] = jnp.asarray(value)
        for user in self._model.inputs:  # inputs are read by their first version
            ssa = self._model.graph._input_ssa[user]
            env[ssa] = jnp.asarray(self.blobs[user]._value(), self._model.dtype)
        return env

    def forward(
        self,
        blobs: Sequence[str] | None = None,
        start: str | None = None,
        end: str | None = None,
        **kwargs: Any,
    ) -> dict[str, np.ndarray]:
        """Forward from ``start`` to ``end`` (layer names, inclusive); inputs as keywords.

        Returns the net outputs (and any ``blobs`` asked for) as numpy arrays.
        """
        for name, value in kwargs.items():
            if name not in self.blobs:
                raise NetError(f"forward() got an unknown blob '{name}'")
            value = np.asarray(value)
            if value.shape != self.blobs[name].shape:
                self.blobs[name].reshape(*value.shape)
            self.blobs[name].data[...] = value
        first = self._index(start, 0)
        if first == 0:
            for user, value in self._feeder.next_batches().items():
                self.blobs[user]._set_device(jnp.asarray(value))
        self._reshape_if_needed()
        stop = self._index(end, len(self.layers) - 1) + 1
        params, state = self._trees()
        self._rng, rng = jax.random.split(self._rng)
        env, new_state = self._compiled("forward", first, stop)(params, state, self._env(), rng)
        self._last_rng, self._forward_state = rng, state
        net = self._model.net
        for user, blob in self.blobs.items():
            ssa = net.blob_names[user]
            if ssa in env and user not in self._model.inputs:
                blob._set_device(env[ssa])
        self._set_params({}, new_state)
        self._sinks.write(env)
        wanted = list(self.outputs) + [b for b in (blobs or []) if b not in self.outputs]
        return {name: self.blobs[name].data for name in wanted}

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
            chunk = {}
            for name, value in kwargs.items():
                part = np.asarray(value[start : start + batch], np.float32)
                if len(part) < batch:  # pad the last batch, as pycaffe does
                    pad = np.zeros((batch - len(part), *part.shape[1:]), np.float32)
                    part = np.concatenate([part, pad])
                chunk[name] = part
            for name, value in self.forward(blobs, **chunk).items():
                outs.setdefault(name, []).append(np.array(value))
        return {name: np.concatenate(parts)[:total] for name, parts in outs.items()}

    def _seeds(self) -> list[str]:
        """Blobs whose diffs start the backward pass: the outputs and every loss top."""
        net = self._model.net
        return list(dict.fromkeys(
            [net.blob_names[o] for o in net.outputs]
            + [t for layer in net.layers for t, w in zip(layer.tops, layer.loss_weights) if w]
        ))  # fmt: skip

    def _backward_fn(self):
        graph, seeds = self._model.graph, self._seeds()

        def fn(params, state, env, rng, taps, cotangents):
            def objective(params, taps):
                blobs, _ = graph.run(params, state, env, rng, taps=taps)
                return sum(jnp.vdot(cotangents[s], blobs[s]) for s in seeds)

            return jax.grad(objective, argnums=(0, 1))(params, taps)

        return fn

    def backward(
        self,
        diffs: Sequence[str] | None = None,
        start: str | None = None,
        end: str | None = None,
        **kwargs: Any,
    ) -> dict[str, np.ndarray]:
        """Back-propagate the output diffs (loss tops carry their loss weight, as in Caffe).

        Fills every blob's and param's ``diff``; returns the input blobs' diffs (and any
        ``diffs`` asked for). Runs the whole net: ``start``/``end`` ranges are not supported.
        """
        if start is not None or end is not None:
            raise CaffeError("backward(start=..., end=...) is not supported; run the whole net")
        for name, value in kwargs.items():
            if name not in self.outputs:
                raise NetError(f"backward() takes diffs of output blobs; '{name}' is not one")
            self.blobs[name].diff[...] = value
        net = self._model.net
        fn = self._compiled("backward", 0, len(self.layers))
        users = {ssa: user for user, ssa in net.blob_names.items()}
        cotangents = {}
        for ssa in self._seeds():
            layer = net.producer()[ssa]
            weight = dict(zip(layer.tops, layer.loss_weights)).get(ssa, 0.0)
            diff = self.blobs[users[ssa]].diff if ssa in users else None
            cotangents[ssa] = jnp.asarray(diff if diff is not None else np.full(
                net.shapes[ssa], weight, self._model.dtype))  # fmt: skip
        taps = {ssa: jnp.zeros(net.shapes[ssa], self._model.dtype)
                for ssa in net.first_version.values()}  # fmt: skip
        params, _ = self._trees()
        # The forward is recomputed from the inputs with the rng and state it ran with (the
        # state before it: a recurrent layer's carried values have moved on since).
        state = getattr(self, "_forward_state", None) or self._trees()[1]
        rng = getattr(self, "_last_rng", self._rng)
        grad_params, grad_taps = fn(params, state, self._input_env(), rng, taps, cotangents)
        outputs = set(self.outputs)
        for user, ssa in net.first_version.items():
            if user not in outputs:
                self.blobs[user].diff[...] = np.asarray(grad_taps[ssa])
        for name, blobs in grad_params.items():
            for j, g in enumerate(blobs):
                if g is not None:
                    self.params[name][j].diff[...] = np.asarray(g)
        wanted = list(self.inputs) + [d for d in (diffs or []) if d not in self.inputs]
        return {name: self.blobs[name].diff for name in wanted}

    def _input_env(self) -> dict[str, jax.Array]:
        graph = self._model.graph
        return {graph._input_ssa[u]: jnp.asarray(self.blobs[u]._value(), self._model.dtype)
                for u in self._model.inputs}  # fmt: skip

    # -- shapes, data, weights ----------------------------------------------------------------

    def reshape(self) -> None:
        """Recompile for the input blobs' current shapes (params are kept)."""
        shapes = {n: self.blobs[n].shape for n in self._model.inputs}
        params, state = self._trees()
        self._model = self._model.reshape(shapes)
        self._jitted.clear()
        old = self.blobs
        self._make_blobs()
        for name in self._model.inputs:
            self.blobs[name] = old[name]
        self._make_params(params, state)

    def close(self) -> None:
        """Stop the data layers' prefetch threads and close their files and sinks."""
        self._feeder.close()
        self._sinks.close()

    def set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        """MemoryData: each forward takes the next batch_size rows, wrapping (Caffe's Reset)."""
        self._feeder.set_input_arrays(data, labels)

    def copy_from(self, weights: str | os.PathLike) -> None:
        """Load a .caffemodel / .caffemodel.h5 by layer name (CopyTrainedLayersFrom)."""
        from caffe2jax.runtime.weights import load_weights

        params, state = load_weights(weights, self._model, *self._trees())
        self._set_params(params, state)

    def save(self, path: str | os.PathLike) -> None:
        """Write the weights as a binary .caffemodel (Net::ToProto)."""
        from caffe2jax.runtime.weights import save_weights

        save_weights(path, self._model, *self._trees(), format="binary")

    def save_hdf5(self, path: str | os.PathLike) -> None:
        """Write the weights in Caffe's HDF5 format (Net::ToHDF5)."""
        from caffe2jax.runtime.weights import save_weights

        save_weights(path, self._model, *self._trees(), format="hdf5")


def _is_text(source: Any) -> bool:
    return isinstance(source, str) and ("\n" in source or "{" in source)
