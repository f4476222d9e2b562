"""Class-style Python layers: Caffe's PythonLayer running a ``caffe.Layer`` subclass.

As Caffe does, ``python_param.module`` is imported from ``sys.path`` and the class
``python_param.layer`` is instantiated with the LayerParameter; ``self.param_str`` (also as
``self.param_str_``, old pycaffe's name, which py-faster-rcnn's layers read),
``self.phase`` (Caffe's Phase enum: ``str()`` ``'TRAIN'``) and ``self.blobs`` are set before
``setup(bottom, top)``; ``reshape(bottom, top)`` gives the top shapes the net is compiled for.
A later ``reshape`` or ``forward`` may give other shapes (py-faster-rcnn's proposal layer
knows its count only after NMS): the callback raises :class:`TopsReshaped`, the tops take the
new shapes (``_Bound.top_shapes``; :func:`is_current`), and the runtime's :func:`retrace` runs
the pass again with the program of those shapes (one per shape signature, kept in the model's
bounded family), the layer's forward not run twice. The iter_size passes of an iteration keep
their own top shapes (keyed by the pass, :func:`in_pass`): each may give its own count.
Tops no forward has given yet are provisional (:func:`provisional`): where a later layer
refuses them, a forward's model is a probe up to the layer (lowering/model.py), whose forward
then runs in an io_callback (:func:`probing`) before the net is built at the real shapes.

Inside the compiled program the layer runs on the host through JAX callbacks, with numpy
``bottom``/``top`` blobs (``.data``, ``.diff``, ``.reshape``, ``.num`` …):

- forward: ``reshape`` then ``forward`` (Caffe's Layer::Forward order) in a
  ``jax.pure_callback``; a layer without bottoms (a data layer reading files) uses an
  ``io_callback`` instead, because XLA may merge or drop pure callbacks and a reader's
  forward must run once per pass;
- backward: a ``custom_vjp`` whose backward calls the layer's ``backward(top,
  propagate_down, bottom)`` with the top diffs; ``propagate_down[i]`` is whether bottom ``i``
  needs a gradient. The layer's attributes holding numpy arrays are restored to what its own
  forward left (backward often reads e.g. ``self.diff``), even if XLA ran another forward of
  the layer in between.

``self.blobs`` (``add_blob(*shape)`` in ``setup``) become the layer's learnable params: their
values after ``setup`` are the initial values, the solver updates them, and ``backward``'s
``self.blobs[i].diff`` is their gradient. Exceptions raised by the layer's code surface as a
``JaxRuntimeError`` from the compiled call; :func:`user_errors` turns that into one line
naming the layer, its module and class and the error (a ``PythonLayerError``, also of the
user's exception type; the user's exception is its cause, traceback kept).
"""

from __future__ import annotations

import importlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.experimental import io_callback

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.phase import Phase
from caffe2jax.lowering.python_blobs import (  # noqa: F401 - user_errors, retrace, in_pass: callers'
    SNAPSHOTS_KEPT,
    BlobVec,
    HostBlob,
    TopsReshaped,
    copied,
    current_pass,
    host_backward,
    in_pass,
    layer_error,
    load_blobs,
    pass_slot,
    probing,
    record_error,
    retrace,
    settle,
    user_errors,
)
from caffe2jax.lowering.registry import ParamDecl, Shape


@dataclass
class _ArrayFiller:
    """A filler whose "constant" is the array the layer's setup left in a blob (duck-types
    FillerParameter for lowering.fillers: ``constant`` broadcasts ``value``)."""

    value: np.ndarray
    type: str = "constant"
    sparse: int = -1


# -- exceptions and passes: lowering/python_blobs.py (user_errors, retrace, settle) -----------


# -- one instance per compiled layer ------------------------------------------------------------


@dataclass
class _Bound:
    """A layer's instance and its host blobs; callbacks of one layer run one at a time."""

    instance: Any
    name: str
    bottom: list[HostBlob]
    top: list[HostBlob]
    # (pass index within an iteration, bottom shapes) -> top shapes (:func:`tops_for`)
    top_shapes: dict[tuple[int, tuple[Shape, ...]], tuple[Shape, ...]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    serial: int = 0
    holds: int = 0  # the forward whose attributes the instance holds now
    snapshots: OrderedDict = field(default_factory=OrderedDict)
    records: list = field(default_factory=list)  # its forwards in a pass of :func:`retrace`
    confirmed: set = field(default_factory=set)  # keys of top_shapes a forward gave
    last: tuple = ()  # the key it was last bound at (:func:`provisional`)

    @property
    def named(self) -> str:
        kind = type(self.instance)
        return f"Python layer '{self.name}' ({kind.__module__}.{kind.__qualname__})"

    def fail(self, problem: str) -> NetError:
        return NetError(f"{self.named}: {problem}")

    def call(self, where: str, method, *args) -> None:
        """``method(*args)`` of the user's layer; its exception named (:func:`layer_error`)."""
        try:
            method(*args)
        except Exception as err:  # noqa: BLE001 - the user's code: named, their error its cause
            raise layer_error(err, self.name, self.instance, where) from err

    def tops_for(self, slot: int, bottoms: tuple[Shape, ...]) -> tuple[Shape, ...] | None:
        """The top shapes of pass ``slot`` (within an iteration) at ``bottoms``: those its
        last forward in that pass gave, else pass 0's (a pass not run yet)."""
        found = self.top_shapes.get((slot, bottoms))
        return self.top_shapes.get((0, bottoms)) if found is None else found


@dataclass
class _Record:
    """A forward run inside a pass: what it read and gave, for the pass run again."""

    serial: int
    slot: int  # the pass within its iteration (iter_size passes)
    inputs: list[np.ndarray]  # params then bottoms
    tops: list[np.ndarray]
    attributes: dict[str, Any]

    def same_inputs(self, serial: int, slot: int, inputs: Sequence[Any]) -> bool:
        same = len(inputs) == len(self.inputs) and (serial, slot) == (self.serial, self.slot)
        return same and all(np.array_equal(a, b) for a, b in zip(self.inputs, inputs))


_BOUND: dict[int, tuple[weakref.ref, _Bound]] = {}


def _make_instance(layer: ir.Layer) -> Any:
    """Import ``python_param.module`` (from sys.path) and instantiate ``python_param.layer``
    with the LayerParameter, as Caffe's layer factory does."""
    p = layer.param.python_param
    module = importlib.import_module(p.module)
    try:
        cls = getattr(module, p.layer)
    except AttributeError:
        raise NetError(
            f"layer '{layer.name}' (type Python): module '{p.module}' ({module.__file__}) "
            f"has no class '{p.layer}'"
        ) from None
    instance = cls(layer.param)
    instance.param_str = p.param_str
    instance.param_str_ = p.param_str  # pycaffe before 2016 (py-faster-rcnn's layers) spelled it so
    instance.phase = Phase(0 if layer.param.phase == 0 else 1)  # an int whose str is its name
    if not isinstance(getattr(instance, "blobs", None), BlobVec):
        instance.blobs = BlobVec()
    return instance


def _forget(key: int):
    """A weakref callback dropping the instance of a layer that no net holds any more."""
    return lambda _: _BOUND.pop(key, None)


def bind(layer: ir.Layer, bottom_shapes: Sequence[Shape]) -> _Bound:
    """The layer's instance (created and ``setup`` on first use), reshaped for
    ``bottom_shapes`` (in the pass :func:`pass_slot` names). User exceptions from
    ``setup``/``reshape`` propagate unchanged."""
    entry = _BOUND.get(id(layer))
    bound = entry[1] if entry is not None and entry[0]() is layer else None
    shapes = tuple(tuple(int(d) for d in s) for s in bottom_shapes)
    if bound is None:
        instance = _make_instance(layer)
        bound = _Bound(instance, layer.name, [HostBlob(s) for s in shapes],
                       [HostBlob() for _ in layer.tops])  # fmt: skip
        bound.call("setup", instance.setup, bound.bottom, bound.top)
        key = id(layer)
        _BOUND[key] = (weakref.ref(layer, _forget(key)), bound)
    slot = pass_slot()
    bound.last = (slot, shapes)
    if (slot, shapes) not in bound.top_shapes and (0, shapes) in bound.top_shapes:
        bound.top_shapes[slot, shapes] = bound.top_shapes[0, shapes]
    if (slot, shapes) not in bound.top_shapes:
        for blob, shape in zip(bound.bottom, shapes):
            if blob.shape != shape:
                blob.reshape(*shape)
        bound.call("reshape", bound.instance.reshape, bound.bottom, bound.top)
        bound.top_shapes[slot, shapes] = tuple(t.shape for t in bound.top)
    return bound


def instance_of(layer: ir.Layer) -> Any:
    """The user's object running ``layer`` (None before it is bound, or for a layer that is
    not class-style): pycaffe's ``net.layers[i]`` of a Python layer is that object."""
    entry = _BOUND.get(id(layer))
    return entry[1].instance if entry is not None and entry[0]() is layer else None


def built_tops(net: ir.Net) -> tuple[tuple[Any, Shape, tuple[Shape, ...]], ...]:
    """For each class-style Python layer of ``net`` (a net with shapes) that is bound: (its
    :class:`_Bound`, its bottom shapes, the top shapes ``net`` was built with)."""
    out = []
    shapes = net.shapes
    for layer in net.layers:
        entry = _BOUND.get(id(layer))
        if entry is None or entry[0]() is not layer or layer.tops[0] not in shapes:
            continue
        bottoms = tuple(tuple(shapes[b]) for b in layer.bottoms)
        out.append((entry[1], bottoms, tuple(tuple(shapes[t]) for t in layer.tops)))
    return tuple(out)


def is_current(built: Sequence[tuple[Any, Shape, tuple[Shape, ...]]]) -> bool:
    """Whether each layer of ``built`` still gives its tops the shapes a net was built with
    in the pass :func:`pass_slot` names (a forward since may have reshaped them:
    :class:`TopsReshaped`)."""
    slot = pass_slot()
    return all(bound.tops_for(slot, bottoms) == tops for bound, bottoms, tops in built)


def provisional(layer: ir.Layer) -> tuple[_Bound, tuple] | None:
    """``(its instance, the key it was last bound at)`` when ``layer`` is a class-style Python
    layer whose tops there are provisional: given by ``setup``/``reshape``, not yet by a
    ``forward`` (py-faster-rcnn's anchor target layer reshapes its tops only in forward)."""
    entry = _BOUND.get(id(layer))
    if entry is None or entry[0]() is not layer:
        return None
    bound = entry[1]
    return None if bound.last in bound.confirmed else (bound, bound.last)


def forward_ran(pending: tuple[_Bound, tuple]) -> bool:
    """Whether a forward has given the tops :func:`provisional` found provisional."""
    bound, key = pending
    return key in bound.confirmed


def declare(layer: ir.Layer, bottom_shapes: Sequence[Shape]) -> list[ParamDecl]:
    """The layer's ``self.blobs`` as param declarations, initialised to their values."""
    bound = bind(layer, bottom_shapes)
    return [
        ParamDecl(blob.shape, _ArrayFiller(np.array(blob.data, np.float32)))
        for blob in bound.instance.blobs
    ]


# -- callbacks ----------------------------------------------------------------------------------


def _forward_once(bound: _Bound, inputs: list[Any], n_params: int, slot: int) -> list:
    """The layer's tops for ``inputs`` (params then bottoms) in pass ``slot`` of its
    iteration: Caffe's Layer::Forward (``reshape`` then ``forward``), or, in a pass
    :func:`retrace` runs again, what its forward of that pass gave for the same inputs (its
    attributes as that forward left them)."""
    inst, now = bound.instance, current_pass()
    if now is not None and now[1]:
        for record in bound.records:
            if record.same_inputs(now[0], slot, inputs):
                vars(inst).update(copied(record.attributes))
                return record.tops
    load_blobs(inst.blobs, inputs[:n_params])
    load_blobs(bound.bottom, inputs[n_params:])
    bound.call("reshape", inst.reshape, bound.bottom, bound.top)
    bound.call("forward", inst.forward, bound.bottom, bound.top)
    tops = [np.array(t.data, copy=True) for t in bound.top]
    if now is not None:
        if bound.records and bound.records[0].serial != now[0]:
            bound.records = []
        bound.records.append(_Record(now[0], slot, [np.array(x, copy=True) for x in inputs],
                                     tops, copied(vars(inst))))  # fmt: skip
    return tops


def _check_tops(bound: _Bound, tops: list, key: tuple[int, tuple[Shape, ...]],
                expected: tuple[Shape, ...]) -> None:  # fmt: skip
    """Tops of the shapes the program was compiled for; else the layer's tops take the new
    shapes in its pass (``key``: the pass within its iteration, the bottom shapes) and
    :class:`TopsReshaped` asks for the pass to run again."""
    got = tuple(tuple(t.shape) for t in tops)
    if got == expected:
        return
    shown = f"{[list(s) for s in got]} (compiled for {[list(s) for s in expected]})"
    bound.top_shapes[key] = got
    raise TopsReshaped(
        f"{bound.named}: its forward reshaped its tops to {shown}; pycaffe, the CLI and the "
        "solver compile the new shapes and run the pass again; a program compiled by hand "
        "takes them from the model's reshape(model.inputs)"
    )


def _run_forward(bound: _Bound, params, bottoms, expected: tuple[Shape, ...], dtype, keep: bool,
                 slot: int):  # fmt: skip
    """Host side of the forward in pass ``slot`` of an iteration: the tops of
    :func:`_forward_once`, checked, and the token of this forward (its attributes kept for its
    backward)."""
    inst = bound.instance
    try:
        with bound.lock:
            tops = _forward_once(bound, [*params, *bottoms], len(params), slot)
            sig = tuple(tuple(int(d) for d in np.shape(b)) for b in bottoms)
            bound.confirmed.add((slot, sig))
            _check_tops(bound, tops, (slot, sig), expected)
            tops = [np.asarray(t, dtype) for t in tops]
            bound.serial += 1
            bound.holds = bound.serial
            token = np.int32(bound.serial)
            if keep:
                bound.snapshots[int(token)] = copied(vars(inst))
                while len(bound.snapshots) > SNAPSHOTS_KEPT:
                    bound.snapshots.popitem(last=False)
    except BaseException as err:
        record_error(err, layer_error(err, bound.name, inst, "forward"))
        raise
    return tops, token


def _probe_forward(bound: _Bound, params, bottoms, slot: int):
    """Host side of a probe (:func:`probing`): the layer's forward (Caffe's Layer::Forward, or
    its record in a pass run again), its tops' shapes now known for its bottoms; then
    :class:`TopsReshaped`: the pass runs again with the whole net built at those shapes."""
    try:
        with bound.lock:
            tops = _forward_once(bound, [*params, *bottoms], len(params), slot)
            key = (slot, tuple(tuple(int(d) for d in np.shape(b)) for b in bottoms))
            bound.top_shapes[key] = got = tuple(tuple(np.shape(t)) for t in tops)
            bound.confirmed.add(key)
        raise TopsReshaped(
            f"{bound.named}: its forward gave its tops {[list(s) for s in got]}; the layers "
            "after it are built at those shapes and the pass runs again"
        )
    except BaseException as err:
        record_error(err, layer_error(err, bound.name, bound.instance, "forward"))
        raise


def _probe(bound: _Bound, slot: int, params, bottoms, top_avals) -> list:
    """The layer run as the last of a probe: an io_callback (never dropped by XLA, though
    nothing reads its tops) on its inputs without gradient (the probe computes none)."""
    inputs = [lax.stop_gradient(x) for x in [*params, *bottoms]]
    n = len(params)

    def call(inputs):
        return _probe_forward(bound, inputs[:n], inputs[n:], slot)

    return list(io_callback(call, top_avals, inputs, ordered=False))


def lower(layer: ir.Layer, params: Sequence[jax.Array], bottoms: Sequence[jax.Array], ctx):
    """The tops of a class-style Python layer inside a traced JAX program."""
    bound, slot = bind(layer, [b.shape for b in bottoms]), pass_slot()
    expected = bound.top_shapes[slot, tuple(tuple(int(d) for d in b.shape) for b in bottoms)]
    dtype = np.dtype(ctx.dtype)
    top_avals = [jax.ShapeDtypeStruct(s, dtype) for s in expected]
    token_aval = jax.ShapeDtypeStruct((), np.int32)
    if probing() == layer.name:
        return _probe(bound, slot, params, bottoms, top_avals)

    def host_forward(keep):
        def call(params, bottoms):
            return _run_forward(bound, params, bottoms, expected, dtype, keep, slot)

        return call

    if not bottoms and not params:
        tops, _ = io_callback(host_forward(False), (top_avals, token_aval), [], [], ordered=False)
        return list(tops)

    def primal(params, bottoms):
        return jax.pure_callback(host_forward(False), (top_avals, token_aval), params, bottoms)[0]

    need: dict[str, tuple[bool, ...]] = {}

    @jax.custom_vjp
    def run(params, bottoms):
        return primal(params, bottoms)

    def run_fwd(params, bottoms):
        need["params"] = tuple(p.perturbed for p in params)
        need["bottoms"] = tuple(b.perturbed for b in bottoms)
        params, bottoms = [p.value for p in params], [b.value for b in bottoms]
        tops, token = jax.pure_callback(
            host_forward(True), (top_avals, token_aval), params, bottoms
        )
        return tops, (token, params, bottoms, tops)

    run.defvjp(run_fwd, host_backward(bound, need, dtype), symbolic_zeros=True)
    return list(run(list(params), list(bottoms)))
