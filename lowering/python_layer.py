"""Caffe's Python layers (``type: "Python"``), the machinery: the JAX functions users register
(the fast path, below), the forks' Python layers caffe2jax implements itself (built-ins), and
the class-style path's hooks (the ``caffe.Layer`` class itself, :mod:`caffe2jax.lowering.
python_class`). The ``Python`` type's lowering, which picks among them, is
:mod:`caffe2jax.lowering.layers.python`.

Caffe's PythonLayer imports ``python_param.module``, instantiates the class
``python_param.layer``, hands it ``param_str``, and calls its ``setup``/``reshape``/
``forward``/``backward`` methods with numpy blobs. A compiled JAX program cannot call back into
such a class, so the user registers a pure JAX equivalent under the same (module, layer)::

    from caffe2jax.lowering.python_layer import register_python_layer

    @register_python_layer("my_layers", "Scale2", param_shapes=..., backward=...)
    def scale2(bottoms, params, param_str, ctx):
        return [2 * bottoms[0]]

- ``fn(bottoms, params, param_str, ctx) -> list of tops``: the forward (Caffe's ``forward``).
  ``ctx`` carries ``phase``, ``dtype`` and ``key()`` as for any lowering.
- ``param_shapes(bottom_shapes, param_str) -> [ParamDecl | shape, ...]``: the layer's blobs
  (Caffe's ``self.blobs``), optional; a plain shape means a zero-filled blob.
- ``backward(bottoms, params, tops, top_diffs, param_str) -> (bottom_diffs, param_diffs)``:
  the hand-written backward (Caffe's ``backward``), optional. Without it, gradients are JAX's
  derivative of ``fn``. ``None`` in either list means "no diff" (zeros).

Registering the same (module, layer) again replaces the earlier function.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import importlib.util
import logging
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from caffe2jax.frontend import environment, ir
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering import python_class
from caffe2jax.lowering.python_blobs import layer_error
from caffe2jax.lowering.registry import Shape, load_families
from caffe2jax.lowering.util import fail

ForwardFn = Callable[[list, list, str, Any], Sequence[jax.Array]]
ParamShapesFn = Callable[[list[Shape], str], Sequence[Any]]
BackwardFn = Callable[[list, list, list, list, str], tuple[Sequence[Any], Sequence[Any]]]


@dataclass(frozen=True)
class PythonLayer:
    """One registered Python layer: its forward, blob declarations and optional backward."""

    module: str
    layer: str
    forward: ForwardFn
    param_shapes: ParamShapesFn | None = None
    backward: BackwardFn | None = None


_PYTHON_LAYERS: dict[tuple[str, str], PythonLayer] = {}


def register_python_layer(
    module: str,
    layer: str,
    *,
    param_shapes: ParamShapesFn | None = None,
    backward: BackwardFn | None = None,
) -> Callable[[ForwardFn], ForwardFn]:
    """Decorator: the JAX implementation of Caffe Python layer ``module.layer``."""

    def wrap(fn: ForwardFn) -> ForwardFn:
        _PYTHON_LAYERS[(module, layer)] = PythonLayer(module, layer, fn, param_shapes, backward)
        return fn

    return wrap


#: Python layers of the forks' models that caffe2jax implements itself (py-faster-rcnn's
#: rpn.proposal_layer.ProposalLayer): (module, layer, form) -> a lowering ``fn(layer, params,
#: bottoms, ctx) -> tops``. They run only when no function is registered for the layer, and
#: then by :func:`python_layer_choice`: by default when the user's module is not on sys.path
#: or fails to import (a user's own module that imports wins, as in Caffe).
_BUILTIN: dict[tuple[str, str, str], Callable] = {}

#: Python data layers of the forks' models that caffe2jax reads itself: (module, layer, form)
#: -> the data layer type that stands in for them (py-faster-rcnn's RoIDataLayer ->
#: "RoIData"), under the same rule as _BUILTIN.
_BUILTIN_DATA: dict[tuple[str, str, str], str] = {}


#: What a built-in does to the weights a trainer snapshots: (module, layer, form) -> ``fn(params)
#: -> params`` (host arrays by layer name), e.g. py-faster-rcnn's and py-R-FCN's train.py
#: un-normalising the box regressors whose targets their layers normalised
#: (lowering/forks/rcnn_targets.py, rfcn.py).
_SNAPSHOT: dict[tuple[str, str, str], Callable] = {}


def register_builtin_python_layer(module: str, layer: str, fn: Callable, *, form: str = "",
                                  snapshot: Callable | None = None) -> None:  # fmt: skip
    """Make ``fn`` caffe2jax's own implementation of the fork Python layer ``module.layer``
    (in ``form``: a fork whose layer of that name differs, frontend/forks/forms.py);
    ``snapshot``: what the fork's trainer does to the weights it snapshots when this layer is
    in the net (:func:`snapshot_weights`)."""
    _BUILTIN[(module, layer, form)] = fn
    if snapshot is not None:
        _SNAPSHOT[(module, layer, form)] = snapshot


def snapshot_weights(net: ir.Net, params: dict) -> dict:
    """``params`` as the fork's own trainer writes them to a snapshot: each built-in of
    ``net`` that runs (:func:`builtin`) and registered a ``snapshot`` step applies it once
    (py-faster-rcnn's train.py: ``bbox_pred`` un-normalised; py-R-FCN's: the RPN and R-FCN
    box regressors). Entries no step
    changes are ``params``' own objects; with no such built-in, ``params`` itself."""
    steps = []
    for layer in net.layers:
        if layer.type != "Python" or registered(layer) is not None or builtin(layer) is None:
            continue
        p = layer.param.python_param
        step = _SNAPSHOT.get((p.module, p.layer, layer.form))
        if step is not None and step not in steps:
            steps.append(step)
    for step in steps:
        params = step(params)
    return params


def register_builtin_python_data_layer(module: str, layer: str, type_name: str) -> None:
    """Read the fork Python data layer ``module.layer`` as caffe2jax's data layer
    ``type_name`` (registered with ``feed="pipeline"``)."""
    _BUILTIN_DATA[(module, layer, "")] = type_name


def builtin_python_layers() -> list[tuple[tuple[str, str, str], Any]]:
    """Every built-in: ((module, layer, form), its lowering, or the data layer type standing in
    for it), sorted."""
    load_families()
    return sorted({**_BUILTIN, **_BUILTIN_DATA}.items(), key=lambda item: item[0])


PYTHON_LAYERS_ENV = "CAFFE2JAX_PYTHON_LAYERS"
#: ``auto``: the user's module when it imports, the built-in when it is missing or fails to
#: import; ``builtin``: the built-in wherever there is one; ``user``: never a built-in.
CHOICES = ("auto", "builtin", "user")
_chosen: contextvars.ContextVar[str | None] = contextvars.ContextVar("python_layers", default=None)
_RESOLVED: dict[tuple[int, bool], tuple[weakref.ref, Any]] = {}
log = logging.getLogger("caffe2jax")


def _checked(choice: str, where: str) -> str:
    if choice not in CHOICES:
        raise NetError(f"{where}: {choice!r} is not one of {', '.join(CHOICES)}")
    return choice


@contextlib.contextmanager
def python_layers(choice: str | None) -> Iterator[None]:
    """Within the block, nets compiled pick the fork Python layers' implementation by
    ``choice`` (one of :data:`CHOICES`; None: what is in effect already, an enclosing block's
    or ``$CAFFE2JAX_PYTHON_LAYERS``, default ``auto``). This argument wins over the variable.
    A layer keeps the choice its net was compiled with (reshapes and recompiles included)."""
    if choice is not None:
        choice = _checked(choice, "python_layers")
    token = _chosen.set(choice or _chosen.get())
    try:
        yield
    finally:
        _chosen.reset(token)


def python_layer_choice() -> str:
    """The choice in effect: :func:`python_layers`' argument, else the variable, else auto."""
    choice = _chosen.get()
    if choice is not None:
        return choice
    return _checked(environment.value(PYTHON_LAYERS_ENV) or "auto", PYTHON_LAYERS_ENV)


def _imports(module: str) -> bool:
    """Whether the user's ``module`` imports from sys.path; a failure is logged (the
    built-in then stands in for it)."""
    try:
        if importlib.util.find_spec(module) is None:
            return False
        importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - any failure of the user's import
        missing = isinstance(err, ModuleNotFoundError) and err.name is not None
        if not (missing and (module == err.name or module.startswith(f"{err.name}."))):
            log.warning("Python module '%s' failed to import (%s: %s); using caffe2jax's "
                        "built-in layer", module, type(err).__name__, err)  # fmt: skip
        return False
    return True


def _resolve(layer: ir.Layer, data: bool) -> Any:
    load_families()
    p = layer.param.python_param
    table: dict = _BUILTIN_DATA if data else _BUILTIN
    fn = table.get((p.module, p.layer, layer.form)) or table.get((p.module, p.layer, ""))
    choice = python_layer_choice()
    if fn is None or choice == "user":
        return None
    return fn if choice == "builtin" or not _imports(p.module) else None


def builtin(layer: ir.Layer, data: bool = False) -> Any:
    """caffe2jax's own implementation of ``layer``'s Python class for its form (or, with
    ``data``, the data layer type standing in for it) when :func:`python_layer_choice` picks
    it; decided once per layer, so every compile of its net runs the same code."""
    key = (id(layer), data)
    entry = _RESOLVED.get(key)
    if entry is not None and entry[0]() is layer:
        return entry[1]
    found = _resolve(layer, data)
    _RESOLVED[key] = (weakref.ref(layer, lambda _: _RESOLVED.pop(key, None)), found)
    return found


def unregister_python_layer(module: str, layer: str) -> None:
    """Forget the implementation of ``module.layer`` (no error when none is registered)."""
    _PYTHON_LAYERS.pop((module, layer), None)


def registered_python_layers() -> list[str]:
    """``module.layer`` of every registered Python layer, sorted."""
    return sorted(f"{m}.{name}" for m, name in _PYTHON_LAYERS)


def registered(layer: ir.Layer) -> PythonLayer | None:
    """The JAX function registered for ``layer``'s python_param, None when there is none (the
    layer is then a class-style ``caffe.Layer`` imported from sys.path)."""
    p = layer.param.python_param
    if not p.module or not p.layer:
        raise fail(layer, "python_param needs both 'module' and 'layer'")
    return _PYTHON_LAYERS.get((p.module, p.layer))


def class_style(layer: ir.Layer, call: Callable, *args):
    """Run ``call`` of the class-style path; a module missing from sys.path is one clear line."""
    p = layer.param.python_param
    try:
        return call(layer, *args)
    except ModuleNotFoundError as err:
        if err.name != p.module.split(".")[0] and err.name != p.module:
            raise  # the user's module imports something missing: their own error
        raise fail(
            layer,
            f"Python layer '{p.module}.{p.layer}': module '{p.module}' is not on sys.path "
            "(Caffe imports it the same way: add its folder to sys.path or PYTHONPATH), and "
            "no JAX function is registered for it with "
            f"register_python_layer('{p.module}', '{p.layer}')",
        ) from None


def _as_data_layer(layer: ir.Layer, type_name: str) -> ir.Layer:
    """``layer`` as caffe2jax's data layer ``type_name`` (same name, tops and param_str)."""
    param = type(layer.param)()
    param.CopyFrom(layer.param)
    param.type = type_name
    return dataclasses.replace(layer, type=type_name, param=param)


class HostDataLayer:
    """A class-style Python layer with neither bottoms nor blobs (a data layer), run on the
    host as Caffe runs it in each forward, before the compiled program: ``reshape`` then
    ``forward``; its tops enter the program as inputs, so their shapes may change from one
    forward to the next (the program for each shape is compiled once).

    ``tops`` are the blobs handed to the layer: :class:`HostBlob` s, or the net's own blobs
    (pycaffe's ``net.blobs``, :meth:`use_tops`), so a top keeps what a script wrote into it
    until the layer writes it, as in Caffe."""

    def __init__(self, layer: ir.Layer, bound: Any):
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
        for where in ("reshape", "forward"):
            try:
                getattr(self.instance, where)([], self.tops)
            except Exception as err:  # noqa: BLE001 - the user's code: named, its cause kept
                raise layer_error(err, self.name, self.instance, where) from err
        return {name: np.array(top.data, copy=True)
                for name, top in zip(self.layer.top_names, self.tops)}  # fmt: skip


def _host_data_layer(layer: ir.Layer) -> HostDataLayer | None:
    """``layer`` (a class-style Python layer without bottoms), set up as Caffe's Net::Init
    does (``setup`` and ``reshape``), as a :class:`HostDataLayer`; None when its ``setup``
    added blobs (then it stays a layer of the compiled program, with the same instance)."""
    bound = python_class.bind(layer, [])
    return None if len(bound.instance.blobs) else HostDataLayer(layer, bound)


def host_data_layers(net: ir.Net) -> tuple[ir.Net, list[HostDataLayer]]:
    """The class-style Python layers of ``net`` that have neither bottoms nor blobs (data
    layers such as a file reader, or a top a script fills by hand) as
    :class:`HostDataLayer` s, and ``net`` with each of them
    an ``Input`` layer: the runtime runs them on the host before each forward, as Caffe runs
    a data layer, and feeds their tops. Layers with a registered JAX function stay."""
    hosts, layers = [], []
    for layer in net.layers:
        host = None
        stands_in = None
        if layer.type == "Python" and not layer.bottoms and registered(layer) is None:
            stands_in = builtin(layer, data=True)
        if stands_in is not None:
            layers.append(_as_data_layer(layer, stands_in))
            continue
        if layer.type == "Python" and not layer.bottoms and registered(layer) is None:
            host = class_style(layer, _host_data_layer)
        if host is None:
            layers.append(layer)
            continue
        hosts.append(host)
        layers.append(dataclasses.replace(layer, type="Input"))
    if not hosts and all(a is b for a, b in zip(layers, net.layers)):
        return net, []
    return dataclasses.replace(net, layers=tuple(layers)), hosts
