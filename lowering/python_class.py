"""Class-style Python layers: Caffe's PythonLayer running a ``caffe.Layer`` subclass.

As Caffe does, ``python_param.module`` is imported from ``sys.path`` and the class
``python_param.layer`` is instantiated with the LayerParameter; ``self.param_str`` (also as
``self.param_str_``, old pycaffe's name, which py-faster-rcnn's layers read),
``self.phase`` (Caffe's Phase enum: ``TRAIN == 0``, ``str()`` ``'TRAIN'``) and ``self.blobs``
are set before ``setup(bottom, top)``,
then ``reshape(bottom, top)`` fixes the top shapes. This happens when the net is compiled
(once per input shape): shapes in a compiled program cannot change later, so a ``reshape``
that changes a top's shape during training is refused with the layer's name.

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
``JaxRuntimeError`` from the compiled call; :func:`user_errors` turns that back into the
user's own exception (type, message and traceback).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.phase import Phase
from caffe2jax.lowering.python_blobs import BlobVec, HostBlob
from caffe2jax.lowering.registry import ParamDecl, Shape

SNAPSHOTS_KEPT = 64


@dataclass
class _ArrayFiller:
    """A filler whose "constant" is the array the layer's setup left in a blob (duck-types
    FillerParameter for lowering.fillers: ``constant`` broadcasts ``value``)."""

    value: np.ndarray
    type: str = "constant"
    sparse: int = -1


# -- exceptions ---------------------------------------------------------------------------------

_errors_lock = threading.Lock()
_last_error: BaseException | None = None


def _record(err: BaseException) -> None:
    global _last_error
    with _errors_lock:
        _last_error = err


def _take_error(message: str) -> BaseException | None:
    """The recorded user exception if ``message`` (a JaxRuntimeError's) is about it."""
    global _last_error
    with _errors_lock:
        err, _last_error = _last_error, None
    if err is not None and f"{type(err).__name__}: {err}".strip() in message:
        return err
    return None


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Re-raise the exception a Python layer's own code raised inside a compiled call with
    its own type, message and traceback (JAX reports it as a JaxRuntimeError)."""
    try:
        yield
    except jax.errors.JaxRuntimeError as err:
        original = _take_error(str(err))
        if original is None:
            raise
        raise original.with_traceback(original.__traceback__) from None


def settle(net: ir.Net, tree: Any) -> Any:
    """Wait for ``tree``'s arrays when ``net`` has Python layers. A GPU returns from a compiled
    call before it has run, so a layer's exception would otherwise surface at whichever later
    read waits first; waiting inside :func:`user_errors` raises it from the call that ran it."""
    if any(layer.type == "Python" for layer in net.layers):
        jax.block_until_ready(tree)
    return tree


# -- one instance per compiled layer ------------------------------------------------------------


@dataclass
class _Bound:
    """A layer's instance and its host blobs; callbacks of one layer run one at a time."""

    instance: Any
    name: str
    bottom: list[HostBlob]
    top: list[HostBlob]
    top_shapes: dict[tuple[Shape, ...], tuple[Shape, ...]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    serial: int = 0
    holds: int = 0  # the forward whose attributes the instance holds now
    snapshots: OrderedDict = field(default_factory=OrderedDict)

    def fail(self, problem: str) -> NetError:
        return NetError(f"Python layer '{self.name}': {problem}")


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
    ``bottom_shapes``. User exceptions from ``setup``/``reshape`` propagate unchanged."""
    entry = _BOUND.get(id(layer))
    bound = entry[1] if entry is not None and entry[0]() is layer else None
    shapes = tuple(tuple(int(d) for d in s) for s in bottom_shapes)
    if bound is None:
        instance = _make_instance(layer)
        bound = _Bound(instance, layer.name, [HostBlob(s) for s in shapes],
                       [HostBlob() for _ in layer.tops])  # fmt: skip
        instance.setup(bound.bottom, bound.top)
        key = id(layer)
        _BOUND[key] = (weakref.ref(layer, _forget(key)), bound)
    if shapes not in bound.top_shapes:
        for blob, shape in zip(bound.bottom, shapes):
            if blob.shape != shape:
                blob.reshape(*shape)
        bound.instance.reshape(bound.bottom, bound.top)
        bound.top_shapes[shapes] = tuple(t.shape for t in bound.top)
    return bound


def instance_of(layer: ir.Layer) -> Any:
    """The user's object running ``layer`` (None before it is bound, or for a layer that is
    not class-style): pycaffe's ``net.layers[i]`` of a Python layer is that object."""
    entry = _BOUND.get(id(layer))
    return entry[1].instance if entry is not None and entry[0]() is layer else None


def declare(layer: ir.Layer, bottom_shapes: Sequence[Shape]) -> list[ParamDecl]:
    """The layer's ``self.blobs`` as param declarations, initialised to their values."""
    bound = bind(layer, bottom_shapes)
    return [
        ParamDecl(blob.shape, _ArrayFiller(np.array(blob.data, np.float32)))
        for blob in bound.instance.blobs
    ]


class HostDataLayer:
    """A class-style Python layer with neither bottoms nor blobs (a data layer), run on the
    host as Caffe runs it in each forward, before the compiled program: ``reshape`` then
    ``forward``; its tops enter the program as inputs, so their shapes may change from one
    forward to the next (the program for each shape is compiled once).

    ``tops`` are the blobs handed to the layer: :class:`HostBlob` s, or the net's own blobs
    (pycaffe's ``net.blobs``, :meth:`use_tops`), so a top keeps what a script wrote into it
    until the layer writes it, as in Caffe."""

    def __init__(self, layer: ir.Layer, bound: _Bound):
        self.layer = layer
        self.instance = bound.instance
        self.tops: list[Any] = list(bound.top)

    @property
    def name(self) -> str:
        return self.layer.name

    def shapes(self) -> dict[str, Shape]:
        """The tops' current shapes by blob name."""
        return {name: tuple(top.shape) for name, top in zip(self.layer.top_names, self.tops)}

    def use_tops(self, tops: Sequence[Any]) -> None:
        """Hand the layer these blobs as its tops from now on (their shapes taken from the
        current tops)."""
        for new, old in zip(tops, self.tops):
            if tuple(new.shape) != tuple(old.shape):
                new.reshape(*old.shape)
        self.tops = list(tops)

    def forward(self) -> dict[str, np.ndarray]:
        """Caffe's Layer::Forward of a data layer: ``reshape`` then ``forward``; a copy of
        each top by blob name."""
        self.instance.reshape([], self.tops)
        self.instance.forward([], self.tops)
        return {name: np.array(top.data, copy=True)
                for name, top in zip(self.layer.top_names, self.tops)}  # fmt: skip


def host_data_layer(layer: ir.Layer) -> HostDataLayer | None:
    """``layer`` (a class-style Python layer without bottoms), set up as Caffe's Net::Init
    does (``setup`` and ``reshape``), as a :class:`HostDataLayer`; None when its ``setup``
    added blobs (then it stays a layer of the compiled program, with the same instance)."""
    bound = bind(layer, [])
    return None if len(bound.instance.blobs) else HostDataLayer(layer, bound)


# -- callbacks ----------------------------------------------------------------------------------


def _copied(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attributes with numpy arrays copied (what a layer's backward may read of its forward)."""
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in attributes.items()}


def _load(blobs: Sequence[HostBlob], values: Sequence[Any]) -> None:
    for blob, value in zip(blobs, values):
        value = np.asarray(value)
        if blob.shape != value.shape:
            blob.reshape(*value.shape)
        blob.data[...] = value
        blob.diff[...] = 0


def _run_forward(bound: _Bound, params, bottoms, expected: tuple[Shape, ...], dtype, keep: bool):
    """Host side of the forward: load params and bottoms, reshape, forward, read tops."""
    inst = bound.instance
    try:
        with bound.lock:
            _load(inst.blobs, params)
            _load(bound.bottom, bottoms)
            inst.reshape(bound.bottom, bound.top)
            got = tuple(t.shape for t in bound.top)
            if got != expected:
                raise bound.fail(
                    f"reshape gave top shapes {[list(s) for s in got]} but the net was "
                    f"compiled for {[list(s) for s in expected]}; top shapes must stay fixed"
                )
            inst.forward(bound.bottom, bound.top)
            tops = [np.asarray(t.data, dtype).reshape(s) for t, s in zip(bound.top, expected)]
            bound.serial += 1
            bound.holds = bound.serial
            token = np.int32(bound.serial)
            if keep:
                bound.snapshots[int(token)] = _copied(vars(inst))
                while len(bound.snapshots) > SNAPSHOTS_KEPT:
                    bound.snapshots.popitem(last=False)
    except BaseException as err:
        _record(err)
        raise
    return tops, token


def _run_backward(bound: _Bound, token, params, bottoms, tops, top_diffs, need, dtype):
    """Host side of the backward: the state of forward ``token``, then ``backward``."""
    inst = bound.instance
    try:
        with bound.lock:
            saved = bound.snapshots.pop(int(token), None)
            if int(token) != bound.holds:
                if saved is None:
                    raise bound.fail(
                        f"backward came after more than {SNAPSHOTS_KEPT} later forwards; the "
                        "state its own forward left is no longer kept"
                    )
                vars(inst).update(_copied(saved))
                bound.holds = int(token)
            _load(inst.blobs, params)
            _load(bound.bottom, bottoms)
            _load(bound.top, tops)
            for blob, diff in zip(bound.top, top_diffs):
                blob.diff[...] = np.asarray(diff).reshape(blob.shape)
            inst.backward(bound.top, list(need), bound.bottom)
            return (
                [np.asarray(b.diff, dtype) for b in inst.blobs],
                [np.asarray(b.diff, dtype) for b in bound.bottom],
            )
    except BaseException as err:
        _record(err)
        raise


def _host_backward(bound: _Bound, need: dict[str, tuple[bool, ...]], dtype: np.dtype):
    """The custom VJP's backward: the layer's own ``backward`` through a host callback."""

    def run_bwd(res, top_diffs):
        token, params, bottoms, tops = res
        if not hasattr(bound.instance, "backward"):
            raise bound.fail("a bottom or blob needs a gradient but the class has no backward()")
        top_diffs = [
            jnp.zeros(t.shape, t.dtype) if isinstance(d, jax.custom_derivatives.SymbolicZero) else d
            for d, t in zip(top_diffs, tops)
        ]
        flags = need["bottoms"]

        def call(token, params, bottoms, tops, top_diffs):
            return _run_backward(bound, token, params, bottoms, tops, top_diffs, flags, dtype)

        avals = ([jax.ShapeDtypeStruct(p.shape, dtype) for p in params],
                 [jax.ShapeDtypeStruct(b.shape, dtype) for b in bottoms])  # fmt: skip
        param_diffs, bottom_diffs = jax.pure_callback(
            call, avals, token, params, bottoms, tops, top_diffs
        )
        return list(param_diffs), list(bottom_diffs)

    return run_bwd


def lower(layer: ir.Layer, params: Sequence[jax.Array], bottoms: Sequence[jax.Array], ctx):
    """The tops of a class-style Python layer inside a traced JAX program."""
    bound = bind(layer, [b.shape for b in bottoms])
    expected = bound.top_shapes[tuple(tuple(b.shape) for b in bottoms)]
    dtype = np.dtype(ctx.dtype)
    top_avals = [jax.ShapeDtypeStruct(s, dtype) for s in expected]
    token_aval = jax.ShapeDtypeStruct((), np.int32)

    def host_forward(keep):
        def call(params, bottoms):
            return _run_forward(bound, params, bottoms, expected, dtype, keep)

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

    run.defvjp(run_fwd, _host_backward(bound, need, dtype), symbolic_zeros=True)
    return list(run(list(params), list(bottoms)))
