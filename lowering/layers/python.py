"""Caffe's PythonLayer (``type: "Python"``, python_layer.hpp): the JAX function registered for
the layer's (module, layer) when there is one (the fast path), else caffe2jax's built-in for a
fork's Python layer, else the ``caffe.Layer`` class itself run through host callbacks
(:mod:`caffe2jax.lowering.python_class`). Registering and finding them:
:mod:`caffe2jax.lowering.python_layer`.

A registered function's ``backward``, when given, is Caffe's ``backward()``: a custom_vjp puts
exactly that into JAX's reverse mode (it need not be the forward's derivative); without one
the gradient is JAX's derivative of the forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from caffe2jax.frontend import ir
from caffe2jax.lowering import python_class
from caffe2jax.lowering.python_layer import PythonLayer, builtin, class_style, registered
from caffe2jax.lowering.registry import ParamDecl, register
from caffe2jax.lowering.util import fail


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


@register("Python")
def python_layer(layer, params, bottoms, ctx):
    """Caffe's PythonLayer: the JAX function registered for (module, layer) when there is
    one (the fast path), else the class ``module.layer`` run through host callbacks."""
    entry = registered(layer)
    if entry is None:
        own = builtin(layer)
        if own is not None:
            return own(layer, params, bottoms, ctx)
        return class_style(layer, python_class.lower, params, bottoms, ctx)
    param_str = layer.param.python_param.param_str
    if entry.backward is None:
        return _tops(layer, entry.forward(list(bottoms), list(params), param_str, ctx))
    return _with_backward(layer, entry, param_str, ctx)(list(params), list(bottoms))


@python_layer.param_shapes
def _(layer, bottom_shapes):
    entry = registered(layer)
    if entry is None:
        if builtin(layer) is not None:
            return []
        return class_style(layer, python_class.declare, bottom_shapes)
    if entry.param_shapes is None:
        return []
    shapes = [tuple(s) for s in bottom_shapes]
    declared = entry.param_shapes(shapes, layer.param.python_param.param_str)
    return [_as_decl(layer, item) for item in declared]
