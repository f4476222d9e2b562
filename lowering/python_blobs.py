"""The host side a class-style Python layer shares with its callers: pycaffe's ``caffe.Layer``
base class, its numpy ``bottom``/``top`` blobs and ``self.blobs`` (see
:mod:`caffe2jax.lowering.python_class`), and the passes its forward runs in: the errors it
raises, named in one line, and :func:`retrace`, which runs a pass again at the shapes a forward
gave its tops (Caffe lets a layer reshape its tops in ``Forward``)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend.errors import CaffeError, NetError
from caffe2jax.frontend.phase import TRAIN

T = TypeVar("T")
SNAPSHOTS_KEPT = 64  # forwards of a layer whose attributes are kept for their backward


class HostBlob:
    """A numpy blob handed to a Python layer: ``data``, ``diff``, ``shape``, ``count``,
    ``num``/``channels``/``height``/``width`` and ``reshape(*shape)`` as pycaffe's Blob.

    These are host buffers for one callback, not views of the net's blobs (those are
    :class:`caffe2jax.Blob`)."""

    def __init__(self, shape: Sequence[int] = (), dtype: Any = np.float32):
        self._dtype = np.dtype(dtype)
        self.reshape(*shape)

    def reshape(self, *shape: int) -> None:
        """Caffe's Blob::Reshape: the same shape keeps the contents; a new one starts from
        zeros."""
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        shape = tuple(int(d) for d in shape)
        if getattr(self, "data", None) is not None and self.data.shape == shape:
            return
        self.data = np.zeros(shape, self._dtype)
        self.diff = np.zeros_like(self.data)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def count(self) -> int:
        return int(self.data.size)

    def _legacy(self, axis: int) -> int:
        return self.data.shape[axis] if self.data.ndim > axis else 1

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))


def copied(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attributes with numpy arrays copied (what a layer's backward may read of its forward)."""
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in attributes.items()}


def load_blobs(blobs: Sequence[HostBlob], values: Sequence[Any]) -> None:
    """``values`` into ``blobs`` (reshaped where they differ), diffs zeroed."""
    for blob, value in zip(blobs, values):
        value = np.asarray(value)
        if blob.shape != value.shape:
            blob.reshape(*value.shape)
        blob.data[...] = value
        blob.diff[...] = 0


class BlobVec(list):
    """pycaffe's ``layer.blobs``: a list of blobs with ``add_blob(*shape)``."""

    def add_blob(self, *shape: int) -> None:
        self.append(HostBlob(shape))


class Layer:
    """pycaffe's ``caffe.Layer``: subclass it and define ``setup``, ``reshape``, ``forward``
    and (when a bottom or blob needs a gradient) ``backward``."""

    def __init__(self, param: Any = None):
        self.layer_param = param
        self.param_str = param.python_param.param_str if param is not None else ""
        self.phase = TRAIN  # Caffe's Phase enum: == 0, str() 'TRAIN'
        self.blobs = BlobVec()

    @property
    def type(self) -> str:
        return "Python"

    def setup(self, bottom: list[HostBlob], top: list[HostBlob]) -> None:
        """Called once, when the net is built."""

    def reshape(self, bottom: list[HostBlob], top: list[HostBlob]) -> None:
        """Give the tops their shapes (called before every forward, as Caffe does)."""


# -- errors -------------------------------------------------------------------------------------


class PythonLayerError(NetError):
    """A Python layer's own code failed (in ``setup``, ``reshape``, ``forward`` or
    ``backward``): one line naming the layer, its module and class, and the Python error; the
    user's exception is its ``__cause__``. Raised as a subclass of the user's exception type
    too where Python allows it, so a script's ``except KeyError`` still catches it."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def layer_error(err: BaseException, layer: str, instance: Any, where: str) -> BaseException:
    """``err`` (raised by a Python layer's ``where`` method) as a :class:`PythonLayerError`
    naming the layer ``layer``, its module and class; caffe2jax's own errors stay as they
    are."""
    if isinstance(err, CaffeError) or not isinstance(err, Exception):
        return err
    kind = type(instance)
    message = (f"Python layer '{layer}' ({kind.__module__}.{kind.__qualname__}) {where}: "
               f"{type(err).__name__}: {err}")  # fmt: skip
    try:
        both = type(type(err).__name__, (PythonLayerError, type(err)),
                    {"__module__": type(err).__module__})  # fmt: skip
        wrapped = both.__new__(both)
        CaffeError.__init__(wrapped, message)
        wrapped.__dict__.update(getattr(err, "__dict__", {}))
    except TypeError:  # a type Python cannot mix in (instance layout, final classes)
        wrapped = PythonLayerError(message)
    wrapped.__cause__ = err
    return wrapped.with_traceback(err.__traceback__)


_errors_lock = threading.Lock()
_last_error: tuple[BaseException, BaseException] | None = None


def record_error(err: BaseException, wrapped: BaseException) -> None:
    """Remember what a callback raised (``err``) and what its caller is to see (``wrapped``)."""
    global _last_error
    with _errors_lock:
        _last_error = (err, wrapped)


def _take_error(message: str) -> BaseException | None:
    """The recorded error if ``message`` (a JaxRuntimeError's) is about it."""
    global _last_error
    with _errors_lock:
        entry, _last_error = _last_error, None
    if entry is not None and f"{type(entry[0]).__name__}: {entry[0]}".strip() in message:
        return entry[1]
    return None


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Re-raise what a Python layer's code raised inside a compiled call (JAX reports it as a
    JaxRuntimeError) as its :class:`PythonLayerError`, the user's traceback kept."""
    try:
        yield
    except (jax.errors.JaxRuntimeError, ValueError) as err:  # a first call's comes as ValueError
        if isinstance(err, CaffeError):
            raise
        original = _take_error(str(err))
        if original is None:
            raise
        raise original.with_traceback(original.__traceback__) from original.__cause__


def settle(net: Any, tree: Any) -> Any:
    """Wait for ``tree``'s arrays when ``net`` has Python layers. A GPU returns from a compiled
    call before it has run, so a layer's exception would otherwise surface at whichever later
    read waits first; waiting inside :func:`user_errors` raises it from the call that ran it."""
    if any(layer.type == "Python" for layer in net.layers):
        jax.block_until_ready(tree)
    return tree


# -- passes -------------------------------------------------------------------------------------


class TopsReshaped(NetError):
    """A Python layer's forward gave its tops other shapes than the program running it was
    compiled for. Inside :func:`retrace` the pass runs again at the new shapes; elsewhere
    (a program the user jitted) it is this one-line error."""


@dataclass
class _Passes:
    serial: int = 0  # the pass :func:`retrace` runs now (records of older ones are stale)
    depth: int = 0
    replay: bool = False  # running a pass again: layers that ran already give back their tops


class _Reported(logging.Filter):
    """JAX logs every failed callback with its traceback; a Python layer's errors reach the
    caller whole (:func:`user_errors`; a :class:`TopsReshaped` is no failure: the pass runs
    again), so their records are dropped (no traceback on the CLI's stderr)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], CaffeError))


logging.getLogger("jax._src.callback").addFilter(_Reported())
_passes = _Passes()
_passes_lock = threading.Lock()
MAX_RETRACES = 8


_slot: contextvars.ContextVar[int] = contextvars.ContextVar("caffe2jax_pass_slot", default=0)


@contextlib.contextmanager
def in_pass(index: int) -> Iterator[None]:
    """Trace pass ``index`` of a Caffe iteration (one of its iter_size ForwardBackward
    calls): its Python layers' tops take the shapes their forward gave in that pass, so passes
    of one iteration may give different counts (py-R-FCN's OHEM proposals at iter_size 2)."""
    token = _slot.set(int(index))
    try:
        yield
    finally:
        _slot.reset(token)


_probe: contextvars.ContextVar[str | None] = contextvars.ContextVar("caffe2jax_probe", default=None)


@contextlib.contextmanager
def probe_ending(layer: str) -> Iterator[None]:
    """Trace a probe ending at class-style Python layer ``layer``: a pass built only up to it
    because its tops are provisional (its ``setup``/``reshape`` gave them; its ``forward``
    gives the real ones, as Caffe's layers after it see them). The layer runs its forward and
    the pass runs again with the whole net (:class:`TopsReshaped`)."""
    token = _probe.set(layer)
    try:
        yield
    finally:
        _probe.reset(token)


def probing() -> str | None:
    """The layer a probe traced now ends at (:func:`probe_ending`), else None."""
    return _probe.get()


def pass_slot() -> int:
    """The index (within its iteration) of the pass traced now: 0 outside :func:`in_pass`."""
    return _slot.get()


def current_pass() -> tuple[int, bool] | None:
    """``(serial, replay)`` of the pass :func:`retrace` runs now, None outside one."""
    with _passes_lock:
        return (_passes.serial, _passes.replay) if _passes.depth else None


def retrace(run: Callable[[], T], *, again: bool = False) -> T:
    """``run()`` (which picks the program for the current shapes each time it is called),
    again while a Python layer's forward gives its tops new shapes (:class:`TopsReshaped`):
    Caffe's layers after it see the new shapes. Each layer's forward runs once per pass: in
    a run again, a Python layer given the same inputs returns what it computed (its
    attributes as that forward left them), so a random draw or a counter is not repeated.
    User errors come out as :func:`user_errors` makes them. ``again``: ``run`` computes the
    last pass again (a blob read later, a backward after it): its layers give back what they
    gave then."""
    with _passes_lock:
        if not _passes.depth:
            _passes.serial += 0 if again else 1
            _passes.replay = again
        _passes.depth += 1
    try:
        for attempt in range(MAX_RETRACES):
            try:
                with user_errors():
                    return run()
            except TopsReshaped:
                if attempt == MAX_RETRACES - 1:
                    raise
                with _passes_lock:
                    _passes.replay = True
        raise AssertionError("unreachable")
    finally:
        with _passes_lock:
            _passes.depth -= 1


# -- backward -----------------------------------------------------------------------------------


def run_backward(bound: Any, token, params, bottoms, tops, top_diffs, need, dtype):
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
                vars(inst).update(copied(saved))
                bound.holds = int(token)
            load_blobs(inst.blobs, params)
            load_blobs(bound.bottom, bottoms)
            load_blobs(bound.top, tops)
            for blob, diff in zip(bound.top, top_diffs):
                blob.diff[...] = np.asarray(diff).reshape(blob.shape)
            bound.call("backward", inst.backward, bound.top, list(need), bound.bottom)
            return (
                [np.asarray(b.diff, dtype) for b in inst.blobs],
                [np.asarray(b.diff, dtype) for b in bound.bottom],
            )
    except BaseException as err:
        record_error(err, layer_error(err, bound.name, inst, "backward"))
        raise


def host_backward(bound: Any, need: dict[str, tuple[bool, ...]], dtype: np.dtype):
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
            return run_backward(bound, token, params, bottoms, tops, top_diffs, flags, dtype)

        avals = ([jax.ShapeDtypeStruct(p.shape, dtype) for p in params],
                 [jax.ShapeDtypeStruct(b.shape, dtype) for b in bottoms])  # fmt: skip
        param_diffs, bottom_diffs = jax.pure_callback(
            call, avals, token, params, bottoms, tops, top_diffs
        )
        return list(param_diffs), list(bottom_diffs)

    return run_bwd
