"""Caffe's Net::ForwardFromTo and Net::BackwardFromTo for a pycaffe net, over its blobs.

Caffe's reshape model: before each layer runs, its tops take the shapes its bottoms give. So
the shapes of a forward flow from its inputs (what a script wrote into ``net.blobs``, a data
layer's batch, a Python data layer's tops), over the layers the call runs and no others; a
layer after ``end`` is neither reshaped nor checked. Here each input shape signature has its
model (:meth:`caffe2jax.lowering.model.Model.reshape`, built once and kept), whose shapes
stop at ``end`` when a later layer cannot take them, and each model its compiled programs
(:mod:`caffe2jax.pycaffe.programs`).

A forward returns only what the call and the script read: the blobs asked for and the
outputs. Every other blob written by the forward is computed when first read, by running the
same forward again (same params, state, inputs and rng: the same values); once a script reads
such blobs, later forwards return every blob (no second run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering import ranges
from caffe2jax.lowering.model import Model
from caffe2jax.lowering.python_blobs import retrace, settle
from caffe2jax.lowering.registry import data_layers
from caffe2jax.pycaffe import programs

SINK_TYPES = frozenset(data_layers("sink"))

if TYPE_CHECKING:
    from caffe2jax.pycaffe.blob import Blob
    from caffe2jax.pycaffe.params import ParamBlobs
    from caffe2jax.pycaffe.structure import Structure
    from caffe2jax.runtime.train.compiled import CompiledNet


@dataclass
class Forward:
    """What one forward ran with: enough to run it again (a blob read later) and for the
    backward that follows it."""

    model: Model
    lo: int
    hi: int
    params: Any
    state: Any
    rng: jax.Array
    env: dict[str, Any]
    every: dict[str, Any] | None = None  # every blob version, once computed


def version_shape(model: Model, version: str) -> tuple[int, ...]:
    """The shape of a blob version under ``model`` (a split top has its bottom's)."""
    shapes = model.net.shapes
    return tuple(shapes.get(version) or shapes[version.split("#split", 1)[0]])


class Runner:
    """Runs ranges of a pycaffe :class:`~caffe2jax.pycaffe.net.Net` and shows the results in
    its blobs. It is handed the parts of the net it works on (the compiled net, what Net::Init
    fixed, the blobs, the param blobs) and holds :attr:`model`, the model of the current input
    shapes."""

    def __init__(self, compiled: CompiledNet, structure: Structure, blobs: dict[str, Blob],
                 params: ParamBlobs):  # fmt: skip
        self.compiled, self.structure, self.blobs, self.params = compiled, structure, blobs, params
        self.model: Model = compiled.model
        self.last: Forward | None = None
        self.wide = False  # a script read a blob a forward did not return
        self._whole_fails: set = set()  # input shapes the whole net cannot take

    # -- the model for the current inputs ---------------------------------------------------

    def member(self, hi: int, provisional: bool = True) -> Model:
        """The model for the input blobs' current shapes that reaches layer ``hi``: the whole
        net's when every layer takes them, else one whose shapes stop after ``hi``.
        ``provisional`` (a forward's, not Net::Reshape's): a probe where a Python layer's tops
        are known only once its forward has run (:meth:`Model.reshape`)."""
        current, base = self.model, self.compiled.model
        shapes = {n: self.blobs[n].shape for n in base.inputs}
        if current.inputs == shapes and self._reaches(current, hi) and current.is_current():
            return current
        signature = tuple(sorted(shapes.items()))
        if signature not in self._whole_fails:
            try:
                return self._checked(base.reshape(shapes, provisional=provisional))
            except NetError:
                self._whole_fails.add(signature)
        layers = self.structure.layers
        upto = next(c.key for c in reversed(layers[: hi + 1]) if c.key is not None)
        return self._checked(base.reshape(shapes, upto=upto, provisional=provisional))

    def _reaches(self, model: Model, hi: int) -> bool:
        if model.upto is None:
            return True
        keys = [c.key for c in self.structure.layers[: hi + 1] if c.key is not None]
        names = [layer.name for layer in model.net.layers]
        return names.index(keys[-1]) <= names.index(model.upto)

    def _checked(self, model: Model) -> Model:
        """``model`` once its params are known to fit the net's param blobs (Caffe's layers
        refuse a reshape that changes their params, e.g. InnerProduct's input size)."""
        if "params fit" not in model.programs:
            blobs = self.params.blobs
            for name, j, decl in model.graph.owned():
                have = blobs.get((name, j))
                if have is not None and tuple(have.shape) != tuple(decl.shape):
                    raise NetError(
                        f"layer '{name}': for these input shapes its blob {j} would be "
                        f"{list(decl.shape)}, but it holds {list(have.shape)} (params do not "
                        "reshape; as in Caffe, the input size of such a layer is fixed)"
                    )
            model.programs["params fit"] = True
        return model

    # -- ForwardFromTo ------------------------------------------------------------------------

    def forward(self, lo: int, hi: int, wanted: list[str]) -> None:
        """Run layers ``lo``..``hi``; ``wanted`` are the blobs the call returns. A Python
        layer that reshapes its tops in ``forward`` has the range run again at the new shapes
        (:func:`~caffe2jax.lowering.python_blobs.retrace`)."""
        retrace(lambda: self._forward(lo, hi, wanted))

    def _forward(self, lo: int, hi: int, wanted: list[str]) -> None:
        self.model = model = self.member(hi)
        writes = self.structure.writes(lo, hi)
        blobs = self.blobs
        if lo == 0:
            versions = model.graph.input_versions
            env = {versions[n]: blobs[n].device_data() for n in model.inputs}
        else:
            plan = programs.plan(model, lo, hi)
            env = {v: blobs[name].device_data() for v, name in plan.external}
        params, state = self.params.values()
        key = self.compiled.key
        if self.wide:
            key, rng = jax.random.split(key)
            out, new_state = programs.replay(model, lo, hi)(params, state, env, rng)
        else:
            returned = frozenset(writes[n] for n in wanted if n in writes) | self._sunk(model)
            run = programs.forward(model, lo, hi, returned)  # oneDNN's weights packed once
            whole = lo == 0 and hi == len(self.structure.layers) - 1  # then BatchNorm folds
            out, new_state, key, rng = run(model.packed(params, state if whole else None),
                                           state, env, key)  # fmt: skip
        settle(model.net, out)
        self.compiled.key = key
        self.last = record = Forward(model, lo, hi, params, state, rng, env, out if self.wide
                                     else None)  # fmt: skip
        self._show(record, writes, out)
        self.params.show({}, new_state)
        self.compiled.sinks.write(out)

    @staticmethod
    def _sunk(model: Model) -> frozenset[str]:
        """The versions the sink layers (HDF5Output, MatWrite) write after a forward."""
        return frozenset(b for layer in model.net.layers if layer.type in SINK_TYPES
                         for b in layer.bottoms)  # fmt: skip

    def _show(self, record: Forward, writes: dict[str, str], out: dict[str, Any]) -> None:
        blobs = self.blobs
        for name, version in writes.items():
            if version in record.env:  # an input: the blob holds it already
                continue
            blob = blobs[name]
            shape = version_shape(record.model, version)
            if blob.shape != shape:
                blob.reshape(*shape)
            if version in out:
                blob.set_data(out[version])
            else:
                blob.set_data(lambda v=version: self._replayed(record)[v])

    def _replayed(self, record: Forward) -> dict[str, Any]:
        """Every blob of ``record``'s forward (run again once; the next forwards return them
        all)."""
        if record.every is None:
            self.wide = True
            run = programs.replay(record.model, record.lo, record.hi)
            args = (record.params, record.state, record.env, record.rng)
            record.every = retrace(lambda: settle(record.model.net, run(*args)[0]), again=True)
        return record.every

    # -- BackwardFromTo -----------------------------------------------------------------------

    def backward(self, lo: int, hi: int) -> None:
        """Caffe's BackwardFromTo(hi, lo) after the last forward (its state and rng)."""
        record = self.last
        model = record.model if record is not None else self.model
        if not self._reaches(model, hi):
            raise NetError(
                f"backward from layer '{self.structure.layer_names[hi]}': the last forward's "
                f"input shapes reach only up to layer '{model.upto}' (later layers cannot "
                "take them), so there is nothing to run backward from there"
            )
        plan, fn = programs.backward(model, lo, hi)
        params, state = self.params.values()
        rng = self.compiled.key
        if record is not None:
            state, rng = record.state, record.rng
        env = {v: self.blobs[name].device_data() for v, name in plan.external}
        top_diffs = {name: self.blobs[name].device_diff() for _, name in plan.seeds}
        diffs, grads, _ = retrace(lambda: settle(model.net, fn(params, state, env, rng, top_diffs)),
                                  again=record is not None)  # fmt: skip
        for name, value in diffs.items():
            self.blobs[name].set_diff(value)
        self.params.add_diffs(grads, ranges.param_mask(model.graph, lo, hi))
