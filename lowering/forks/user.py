"""Layers brought by their user: :func:`register_layer` adds a Caffe type to the registry.

A fork is a caffe.proto plus layer sources. Its caffe.proto is a dialect
(:mod:`caffe2jax.frontend.forks.user_proto`); each of its layers is a JAX forward registered
here under the fork's type string, through :func:`caffe2jax.lowering.registry.register` like
every built-in type (form ``""``, or a fork form of a built-in type)::

    def auto_crop(bottoms, params, layer_param, ctx):
        p = layer_param.auto_crop_param           # the fork's own field, by name
        ...
        return [top]

    caffe2jax.register_layer("AutoCrop", auto_crop, counts=(2, 2, 1, 1))

``layer_param`` is the layer's LayerParameter with the loaded fork's fields readable by name;
``ctx`` the :class:`~caffe2jax.lowering.registry.Context` (``ctx.train``, ``ctx.key()``).
``param_shapes(layer_param, bottom_shapes) -> [(shape, filler), ...]`` declares its learnable
blobs in Caffe's blob order (``filler``: a FillerParameter, a dict of its fields, or None for
zeros; Caffe's fillers apply); they are trained by the solver (``param { lr_mult }`` as for any
layer) and saved and loaded through .caffemodel files under the layer's name. Gradients are
JAX's; ``backward(bottoms, params, layer_param, ctx, tops, top_diffs) -> (bottom_diffs,
param_diffs)`` replaces them (Caffe's Backward_cpu, where a fork's backward is not the
derivative of its forward; ``None`` in bottom_diffs: no gradient).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.frontend.forks.user_proto import readable_param
from caffe2jax.lowering.registry import (
    Lowering,
    ParamDecl,
    register,
    registered_forms,
    unregister,
)

Forward = Callable[[list, list, Any, Any], Sequence[jax.Array]]
Backward = Callable[..., tuple[Sequence[Any], Sequence[Any]]]
ParamShapes = Callable[[Any, Sequence[tuple[int, ...]]], Sequence[tuple[Sequence[int], Any]]]

#: (type, form) of every layer registered through :func:`register_layer` (may be replaced).
_USER: dict[tuple[str, str], Lowering] = {}
#: the built-in entries a user's registration replaced, restored by :func:`unregister_layer`
_BUILT_IN: dict[tuple[str, str], Lowering] = {}


class LayerRegistrationError(CaffeError):
    """A user layer that cannot be registered (one line)."""


def _filler(value: Any) -> caffe_pb2.FillerParameter | None:
    """A filler as caffe.proto's FillerParameter: from any schema's message or a dict."""
    if value is None or isinstance(value, caffe_pb2.FillerParameter):
        return value
    if isinstance(value, Mapping):
        return caffe_pb2.FillerParameter(**value)
    if getattr(value, "DESCRIPTOR", None) is not None:
        if value.DESCRIPTOR.full_name == "caffe.FillerParameter":
            return caffe_pb2.FillerParameter.FromString(value.SerializeToString())
    raise LayerRegistrationError(
        f"a filler must be a FillerParameter, a dict of its fields or None, got {value!r:.60}"
    )


def _declare(param_shapes: ParamShapes):
    def declare(layer, bottom_shapes) -> list[ParamDecl]:
        blobs = param_shapes(readable_param(layer.param), [tuple(s) for s in bottom_shapes])
        return [ParamDecl(tuple(int(d) for d in shape), _filler(f)) for shape, f in blobs]

    return declare


def _with_backward(fn: Forward, backward: Backward, layer_param, ctx):
    """``fn`` whose derivative is ``backward`` (Caffe's Backward_cpu, as the fork wrote it)."""

    @jax.custom_vjp
    def run(bottoms, params):
        return list(fn(bottoms, params, layer_param, ctx))

    def forward(bottoms, params):
        tops = run(bottoms, params)
        return tops, (bottoms, params, tops)

    def back(saved, top_diffs):
        bottoms, params, tops = saved
        bottom_diffs, param_diffs = backward(bottoms, params, layer_param, ctx, tops, top_diffs)
        return list(bottom_diffs), list(param_diffs)

    run.defvjp(forward, back)
    return run


def _lowering(type_name: str, fn: Forward, backward: Backward | None):
    def lower(layer, params, bottoms, ctx):
        layer_param = readable_param(layer.param)
        run = fn if backward is None else _with_backward(fn, backward, layer_param, ctx)
        args = (list(bottoms), list(params))
        tops = run(*args, layer_param, ctx) if backward is None else run(*args)
        if isinstance(tops, jax.Array):
            tops = [tops]
        return list(tops)

    lower.__name__ = lower.__qualname__ = f"user_{type_name}"
    lower.__doc__ = fn.__doc__
    return lower


def register_layer(
    type_name: str,
    fn: Forward,
    *,
    param_shapes: ParamShapes | None = None,
    backward: Backward | None = None,
    counts: tuple[int, int | None, int, int | None] | None = None,
    form: str = "",
) -> Lowering:
    """Register a JAX forward ``fn(bottoms, params, layer_param, ctx) -> tops`` for Caffe
    layer type ``type_name`` (see the module). ``counts``: (min bottoms, max bottoms, min
    tops, max tops) as Caffe's ExactNum/Min/MaxBottomBlobs check them (None: any). A type
    registered earlier through this function is replaced; so is a built-in one, with a warning
    (:func:`unregister_layer` restores it)."""
    if not isinstance(type_name, str) or not type_name:
        raise LayerRegistrationError(f"a layer type is a non-empty string, got {type_name!r:.40}")
    if not callable(fn):
        raise LayerRegistrationError(f"layer type '{type_name}': fn must be callable")
    key = (type_name, form)
    if key in _USER:
        unregister(type_name, form)
    elif key in registered_forms():
        _BUILT_IN[key] = unregister(type_name, form)  # type: ignore[assignment]
        warnings.warn(
            f"layer type '{type_name}'{f' form {form!r}' if form else ''} is built into "
            "caffe2jax; your registration replaces it (unregister_layer restores it)",
            stacklevel=2,
        )
    lowering = register(type_name, form=form, counts=counts)(_lowering(type_name, fn, backward))
    if param_shapes is not None:
        lowering.param_shapes(_declare(param_shapes))
    _USER[key] = lowering
    return lowering


def unregister_layer(type_name: str, form: str = "") -> None:
    """Drop a type registered through :func:`register_layer` (nothing else)."""
    if _USER.pop((type_name, form), None) is not None:
        unregister(type_name, form, restore=_BUILT_IN.pop((type_name, form), None))


def user_layers() -> list[tuple[str, str]]:
    """(type, form) of every layer registered through :func:`register_layer`."""
    return sorted(_USER)
