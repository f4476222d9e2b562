"""What the fork's Python 2 generator scripts take from ``from caffe.model_libs import *``
and need under Python 3: ``xrange`` and a ``caffe_pb2`` whose message constructors accept an
integral float for an integer field.

The SSD generators (``ssd_pascal.py``, ``ssd_coco.py``…) are Python 2 scripts: ``5000 / 8``
was the integer 625 there and is 625.0 under Python 3, which protobuf refuses for
``SolverParameter(test_iter=[...])``. The ``caffe_pb2`` a star import gives answers every name
of caffe2jax's generated module (the same classes and enums: ``isinstance`` and enum values
behave as the module's); only calling a message class converts a float with no fractional part
to the int Python 2 would have given, and refuses a fractional one with the field's name.
``caffe.proto.caffe_pb2`` itself is untouched."""

from __future__ import annotations

import types
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from caffe2jax.frontend import caffe_pb2 as _pb2
from caffe2jax.frontend.errors import CaffeError

#: Python 2's range as a list-free iterator (the generators' ``for ratio in xrange(...)``)
xrange = range

_INTEGERS = {
    FieldDescriptor.CPPTYPE_INT32,
    FieldDescriptor.CPPTYPE_INT64,
    FieldDescriptor.CPPTYPE_UINT32,
    FieldDescriptor.CPPTYPE_UINT64,
}


def _integral(field: FieldDescriptor, value: Any) -> Any:
    """``value`` for an integer field: an integral float as its int; a fractional one refused."""
    if not isinstance(value, float):
        return value
    if not value.is_integer():
        raise CaffeError(
            f"{field.containing_type.name}.{field.name} is an integer field; got {value!r} "
            "(Python 2's / gave an int here: write // or int(...))"
        )
    return int(value)


def _as_python2(descriptor: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """Constructor keywords with integral floats of integer fields made ints, nested dicts
    (message fields) and lists (repeated fields) included."""
    out = {}
    for name, value in fields.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:  # protobuf names the unknown field itself
            out[name] = value
            continue
        many = isinstance(value, list | tuple)
        items = list(value) if many else [value]
        if field.message_type is not None:
            items = [
                _as_python2(field.message_type, v) if isinstance(v, dict) else v for v in items
            ]
        elif field.cpp_type in _INTEGERS:
            items = [_integral(field, v) for v in items]
        out[name] = items if many else items[0]
    return out


class _Python2Message(type):
    """A message class of caffe_pb2 as the Python 2 scripts call it (see the module's text)."""

    def __call__(cls, *args: Any, **fields: Any) -> Message:
        message = cls.message_class
        return message(*args, **_as_python2(message.DESCRIPTOR, fields))

    def __getattr__(cls, name: str) -> Any:
        return getattr(cls.message_class, name)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls.message_class)


class _Python2Protos(types.ModuleType):
    """caffe_pb2's names; its message classes called as :class:`_Python2Message` does."""

    def __getattr__(self, name: str) -> Any:
        value = getattr(_pb2, name)
        if isinstance(value, type) and issubclass(value, Message):
            value = _Python2Message(name, (), {"message_class": value})
            setattr(self, name, value)
        return value

    def __dir__(self) -> list[str]:
        return dir(_pb2)


caffe_pb2 = _Python2Protos("caffe_pb2", _pb2.__doc__)
