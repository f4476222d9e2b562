"""The ONNX converters: one per Caffe layer type, keyed by the exact Caffe type string and the
layer's fork form (``ir.Layer.form``, frontend/forks/forms.py), as lowering's registry keys the JAX
lowerings. A Python layer is keyed ``Python:<module>.<layer>`` (the built-in ones caffe2jax
runs: py-faster-rcnn's proposal layer, ENet's spatial dropout).

A converter is ``fn(site) -> [top value, ...]``: it reads its layer, bottoms, shapes and
weights from the :class:`~caffe2jax.runtime.onnx.site.Site` and emits ONNX operators through
``site.g``. Where a layer's configuration has no ONNX form it calls ``site.refuse(why)``;
a type with no converter at all is refused by :func:`lookup`, naming what is supported.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import NetError

Converter = Callable[..., list]

_CONVERTERS: dict[tuple[str, str], Converter] = {}


class OnnxExportError(NetError):
    """A net (or one of its layers) that cannot be written as ONNX: one line, the layer named."""


def register(
    type_name: str, *, form: str | tuple[str, ...] = ""
) -> Callable[[Converter], Converter]:
    """Register the converter of Caffe type ``type_name`` in fork form ``form`` (several forms
    may share one converter)."""
    forms = (form,) if isinstance(form, str) else form

    def wrap(fn: Converter) -> Converter:
        for f in forms:
            if (type_name, f) in _CONVERTERS:
                raise ValueError(f"ONNX converter for {type_name!r} form {f!r} registered twice")
            _CONVERTERS[(type_name, f)] = fn
        return fn

    return wrap


def type_key(layer: ir.Layer) -> str:
    """The registry's type string of ``layer``: its Caffe type, or for a Python layer
    ``Python:<module>.<layer>``."""
    if layer.type != "Python":
        return layer.type
    p = layer.param.python_param
    return f"Python:{p.module}.{p.layer}"


def supported() -> list[str]:
    """Every registered type string (with its form where it has several), sorted."""
    _load()
    return sorted({t if not f else f"{t} ({f})" for t, f in _CONVERTERS})


def refusal(layer: ir.Layer, why: str) -> OnnxExportError:
    """The one-line error for a layer the export cannot write."""
    return OnnxExportError(f"{layer.where}layer '{layer.name}' (type {type_key(layer)}): {why}")


def lookup(layer: ir.Layer) -> Converter:
    """The converter for ``layer``; an unknown type or form is refused naming what is
    supported."""
    _load()
    key = (type_key(layer), layer.form)
    if key in _CONVERTERS:
        return _CONVERTERS[key]
    forms = sorted(f or '""' for t, f in _CONVERTERS if t == key[0])
    if forms:
        why = (
            f"form {layer.form or '(none)'!r} has no ONNX form; supported forms: {', '.join(forms)}"
        )
        raise refusal(layer, why)
    known = sorted({t for t, _ in _CONVERTERS})
    close = difflib.get_close_matches(key[0], known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise refusal(
        layer,
        f"no ONNX form{hint}; the {len(known)} types with one are listed by "
        "caffe2jax.runtime.onnx.supported() and in docs/onnx.md",
    )


def _load() -> None:
    """Import every converter family once so their @register calls run."""
    from caffe2jax.runtime.onnx import families  # noqa: F401
