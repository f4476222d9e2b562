"""Caffe's Python layers (``type: "Python"``): user-registered JAX functions (the fast path,
below) or, when none is registered, the ``caffe.Layer`` class itself (see
:mod:`caffe2jax.lowering.python_class`).

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

import dataclasses
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from caffe2jax.frontend import ir
from caffe2jax.lowering import python_class
from caffe2jax.lowering.registry import ParamDecl, Shape, register
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
#: rpn.proposal_layer.ProposalLayer): (module, layer) -> a lowering ``fn(layer, params,
#: bottoms, ctx) -> tops``. They run only when no function is registered for the layer and
#: its module is not importable from sys.path (a user's own module wins, as in Caffe).
_BUILTIN: dict[tuple[str, str], Callable] = {}


def register_builtin_python_layer(module: str, layer: str, fn: Callable) -> None:
    """Make ``fn`` caffe2jax's own implementation of the fork Python layer ``module.layer``."""
    _BUILTIN[(module, layer)] = fn


#: Python data layers of the forks' models that caffe2jax reads itself: (module, layer) ->
#: the data layer type of lowering.data.DATA_LAYERS that stands in for them (py-faster-rcnn's
#: RoIDataLayer -> "RoIData"), under the same rule as _BUILTIN.
_BUILTIN_DATA: dict[tuple[str, str], str] = {("roi_data_layer.layer", "RoIDataLayer"): "RoIData"}


def _builtin(layer: ir.Layer, table: dict | None = None) -> Any:
    """caffe2jax's own implementation of ``layer``'s Python class (from ``table``, default the
    lowerings), when it has one and the user's sys.path has no such module."""
    p = layer.param.python_param
    fn = (_BUILTIN if table is None else table).get((p.module, p.layer))
    if fn is None:
        return None
    try:
        found = importlib.util.find_spec(p.module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else fn


def unregister_python_layer(module: str, layer: str) -> None:
    """Forget the implementation of ``module.layer`` (no error when none is registered)."""
    _PYTHON_LAYERS.pop((module, layer), None)


def registered_python_layers() -> list[str]:
    """``module.layer`` of every registered Python layer, sorted."""
    return sorted(f"{m}.{name}" for m, name in _PYTHON_LAYERS)


def _registered(layer: ir.Layer) -> PythonLayer | None:
    """The JAX function registered for ``layer``'s python_param, None when there is none (the
    layer is then a class-style ``caffe.Layer`` imported from sys.path)."""
    p = layer.param.python_param
    if not p.module or not p.layer:
        raise fail(layer, "python_param needs both 'module' and 'layer'")
    return _PYTHON_LAYERS.get((p.module, p.layer))


def _class_style(layer: ir.Layer, call: Callable, *args):
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


def _as_decl(layer: ir.Layer, item: Any) -> ParamDecl:
    if isinstance(item, ParamDecl):
        return item
    try:
        return ParamDecl(tuple(int(d) for d in item))
    except TypeError:
        raise fail(layer, f"param_shapes must return ParamDecl or shapes; got {item!r}") from None


def _diffs(layer: ir.Layer, what: str, diffs: Any, like: Sequence[jax.Array]) -> list:
    """The user's diffs as a list matching ``like`` (None → zeros), shapes checked."""
    diffs = [None] * len(like) if diffs is None else list(diffs)
    if len(diffs) != len(like):
        raise fail(layer, f"backward returned {len(diffs)} {what} diff(s), expected {len(like)}")
    out = []
    for i, (d, x) in enumerate(zip(diffs, like)):
        if d is None:
            out.append(jnp.zeros_like(x))
            continue
        d = jnp.asarray(d, x.dtype)
        if d.shape != x.shape:
            raise fail(
                layer, f"backward's {what} diff {i} has shape {list(d.shape)}, not {list(x.shape)}"
            )
        out.append(d)
    return out


def _tops(layer: ir.Layer, tops: Any) -> list:
    """The forward's result as a list of tops (a bare array is a mistake worth naming)."""
    if not isinstance(tops, (list, tuple)):
        raise fail(
            layer,
            f"the Python layer's forward must return a list of tops, got {type(tops).__name__}",
        )
    return list(tops)


def _with_backward(layer: ir.Layer, entry: PythonLayer, param_str: str, ctx) -> Callable:
    """``(params, bottoms) -> tops`` whose VJP is the user's hand-written backward."""

    def forward(params, bottoms):
        return _tops(layer, entry.forward(list(bottoms), list(params), param_str, ctx))

    # Caffe runs the layer's own backward(), which need not be forward's derivative; a
    # custom_vjp puts exactly that backward into JAX's reverse mode.
    @jax.custom_vjp
    def run(params, bottoms):
        return forward(params, bottoms)

    def run_fwd(params, bottoms):
        tops = forward(params, bottoms)
        return tops, (params, bottoms, tops)

    def run_bwd(res, top_diffs):
        params, bottoms, tops = res
        bottom_diffs, param_diffs = entry.backward(
            list(bottoms), list(params), list(tops), list(top_diffs), param_str
        )
        return (
            _diffs(layer, "param", param_diffs, params),
            _diffs(layer, "bottom", bottom_diffs, bottoms),
        )

    run.defvjp(run_fwd, run_bwd)
    return run


def _as_data_layer(layer: ir.Layer, type_name: str) -> ir.Layer:
    """``layer`` as caffe2jax's data layer ``type_name`` (same name, tops and param_str)."""
    param = type(layer.param)()
    param.CopyFrom(layer.param)
    param.type = type_name
    return dataclasses.replace(layer, type=type_name, param=param)


def host_data_layers(net: ir.Net) -> tuple[ir.Net, list[python_class.HostDataLayer]]:
    """The class-style Python layers of ``net`` that have neither bottoms nor blobs (data
    layers such as a file reader, or a top a script fills by hand) as
    :class:`~caffe2jax.lowering.python_class.HostDataLayer` s, and ``net`` with each of them
    an ``Input`` layer: the runtime runs them on the host before each forward, as Caffe runs
    a data layer, and feeds their tops. Layers with a registered JAX function stay."""
    hosts, layers = [], []
    for layer in net.layers:
        host = None
        builtin = None
        if layer.type == "Python" and not layer.bottoms and _registered(layer) is None:
            builtin = _builtin(layer, _BUILTIN_DATA)
        if builtin is not None:
            layers.append(_as_data_layer(layer, builtin))
            continue
        if layer.type == "Python" and not layer.bottoms and _registered(layer) is None:
            host = _class_style(layer, lambda layer: python_class.host_data_layer(layer))
        if host is None:
            layers.append(layer)
            continue
        hosts.append(host)
        layers.append(dataclasses.replace(layer, type="Input"))
    if not hosts and all(a is b for a, b in zip(layers, net.layers)):
        return net, []
    return dataclasses.replace(net, layers=tuple(layers)), hosts


@register("Python")
def python_layer(layer, params, bottoms, ctx):
    """Caffe's PythonLayer: the JAX function registered for (module, layer) when there is
    one (the fast path), else the class ``module.layer`` run through host callbacks."""
    entry = _registered(layer)
    if entry is None:
        builtin = _builtin(layer)
        if builtin is not None:
            return builtin(layer, params, bottoms, ctx)
        return _class_style(layer, python_class.lower, params, bottoms, ctx)
    param_str = layer.param.python_param.param_str
    if entry.backward is None:
        return _tops(layer, entry.forward(list(bottoms), list(params), param_str, ctx))
    return _with_backward(layer, entry, param_str, ctx)(list(params), list(bottoms))


@python_layer.param_shapes
def _(layer, bottom_shapes):
    entry = _registered(layer)
    if entry is None:
        if _builtin(layer) is not None:
            return []
        return _class_style(layer, python_class.declare, bottom_shapes)
    if entry.param_shapes is None:
        return []
    shapes = [tuple(s) for s in bottom_shapes]
    declared = entry.param_shapes(shapes, layer.param.python_param.param_str)
    return [_as_decl(layer, item) for item in declared]
