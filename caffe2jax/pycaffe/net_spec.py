"""pycaffe's ``caffe.net_spec``: write nets in Python, get a ``NetParameter``.

``L.<Type>(*bottoms, **params)`` describes one layer and returns its top (or a tuple of tops
with ``ntop=n``; the layer itself with ``ntop=0``). ``NetSpec`` names tops by assignment
(``n.conv1 = L.Convolution(n.data, ...)``) and ``to_proto()`` writes the layers every named
top depends on, bottoms first. The rules are pycaffe's:

- A top's name is the attribute it was assigned to, else ``<Type><k>`` counted per type.
  A layer is named after its first top (so unnamed layers get the same ``<Type><k>``), or
  ``<Type><k>`` when it has none; an explicit ``name=`` parameter wins.
- ``in_place=True`` makes the tops the bottoms (``ReLU``, ``Dropout`` …).
- A keyword ending in ``param`` (``transform_param``, ``param``, ``convolution_param`` …)
  goes to that field of LayerParameter; any other keyword goes to the layer's own
  ``<type>_param`` when that message has the field, else to LayerParameter itself
  (``include``, ``loss_weight``, ``propagate_down``, ``name`` …).
- A dict fills a message field by field; a list fills a repeated field (a list of dicts
  adds one message per dict, e.g. ``param=[dict(lr_mult=1), dict(lr_mult=2)]``); a single
  value given for a repeated field becomes a one-element list.

``P.<Type>.<CONSTANT>`` reads an enum value of ``<Type>Parameter`` (``P.Pooling.MAX``).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Any

from caffe2jax.frontend import caffe_pb2

__all__ = ["Function", "Top", "NetSpec", "layers", "params", "to_proto", "assign_proto"]


def _param_fields() -> dict[str, str]:
    """Layer type name → its ``*_param`` field, read from LayerParameter's own fields (the
    field's message type is ``<Type>Parameter``): ``Convolution`` → ``convolution_param``."""
    out = {}
    for field in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        if field.name.endswith("_param") and field.message_type is not None:
            type_name = field.message_type.name
            if type_name.endswith("Parameter"):
                out[type_name[: -len("Parameter")]] = field.name
    return out


_PARAM_FIELDS = _param_fields()


def assign_proto(proto: Any, name: str, value: Any) -> None:
    """Set field ``name`` of message ``proto`` from a Python value (pycaffe's rules: dicts fill
    messages, lists fill repeated fields, a lone value for a repeated field is wrapped)."""
    target = getattr(proto, name)  # AttributeError names an unknown field
    repeated = hasattr(target, "extend")
    if repeated and not isinstance(value, list | tuple):
        value = [value]
    if isinstance(value, list | tuple):
        if value and isinstance(value[0], dict):
            for item in value:
                message = target.add()
                for key, sub in item.items():
                    assign_proto(message, key, sub)
        else:
            target.extend(value)
    elif isinstance(value, dict):
        for key, sub in value.items():
            assign_proto(target, key, sub)
    else:
        setattr(proto, name, value)


class Top:
    """One output of a layer description; what ``L.<Type>(...)`` returns."""

    def __init__(self, fn: Function, n: int):
        self.fn = fn
        self.n = n

    def to_proto(self) -> caffe_pb2.NetParameter:
        """The net of every layer this top depends on (auto-named)."""
        return to_proto(self)


class Function:
    """One layer description: its type, bottoms (Tops) and keyword parameters."""

    def __init__(self, type_name: str, inputs: tuple, params: dict[str, Any]):
        for index, bottom in enumerate(inputs):
            if not isinstance(bottom, Top):
                raise TypeError(  # pycaffe's text: "(type is <class 'tuple'>)"
                    f"{type_name} input {index} is not a Top (type is {type(bottom)})"
                )
        self.type_name = type_name
        self.inputs = tuple(inputs)
        self.params = dict(params)
        self.ntop = int(self.params.pop("ntop", 1))
        self.in_place = bool(self.params.pop("in_place", False))
        self.tops = tuple(Top(self, n) for n in range(self.ntop))


def _layer_of(top: Top | Function) -> Function:
    """The layer description behind a top (a Function stands for itself)."""
    return top.fn if isinstance(top, Top) else top


class _Emitter:
    """Turns Functions into LayerParameters, bottoms first, naming tops and layers."""

    def __init__(self, names: dict[Any, str] | None = None):
        self.names: dict[Any, str] = dict(names or {})
        self.counts: Counter[str] = Counter()
        self.layers: OrderedDict[Function, caffe_pb2.LayerParameter] = OrderedDict()

    def _auto(self, type_name: str) -> str:
        self.counts[type_name] += 1
        return f"{type_name}{self.counts[type_name]}"

    def top_name(self, top: Top) -> str:
        if top not in self.names:
            self.names[top] = self._auto(top.fn.type_name)
        return self.names[top]

    def layer_name(self, fn: Function) -> str:
        if fn not in self.names:
            self.names[fn] = self.top_name(fn.tops[0]) if fn.tops else self._auto(fn.type_name)
        return self.names[fn]

    def emit(self, fn: Function) -> None:
        if fn in self.layers:
            return
        bottoms = []
        for bottom in fn.inputs:
            self.emit(bottom.fn)
            bottoms.append(self.layers[bottom.fn].top[bottom.n])
        layer = caffe_pb2.LayerParameter(type=fn.type_name)
        layer.bottom.extend(bottoms)
        layer.top.extend(bottoms if fn.in_place else [self.top_name(t) for t in fn.tops])
        layer.name = self.layer_name(fn)
        for key, value in fn.params.items():
            try:
                _assign_layer_param(layer, fn.type_name, key, value)
            except AttributeError as err:
                raise AttributeError(
                    f"{fn.type_name} layer '{layer.name}': no field '{err.args[0]}' for "
                    f"keyword {key}={value!r} (a type without a parameter message of its own "
                    "takes them inside one, e.g. Deconvolution's convolution_param=dict(...))"
                ) from None
        self.layers[fn] = layer

    def net(self) -> caffe_pb2.NetParameter:
        out = caffe_pb2.NetParameter()
        out.layer.extend(self.layers.values())
        return out


def _assign_layer_param(layer: caffe_pb2.LayerParameter, type_name: str, key: str, value):
    """A ``*param`` keyword goes to LayerParameter; others to the type's own parameter
    message when it has that field, else to LayerParameter."""
    if not key.endswith("param") and type_name in _PARAM_FIELDS:
        own = getattr(layer, _PARAM_FIELDS[type_name])
        if key in own.DESCRIPTOR.fields_by_name:
            assign_proto(own, key, value)
            return
    assign_proto(layer, key, value)


def to_proto(*tops: Top | Function) -> caffe_pb2.NetParameter:
    """The net of every layer the given tops depend on, every name automatic."""
    emitter = _Emitter()
    for top in tops:
        emitter.emit(_layer_of(top))
    return emitter.net()


class NetSpec:
    """Named tops: ``n.name = top`` (or ``n['name'] = top``); ``to_proto()`` writes the net."""

    def __init__(self) -> None:
        object.__setattr__(self, "tops", OrderedDict())

    def __setattr__(self, name: str, value: Top | Function) -> None:
        self.tops[name] = value

    def __getattr__(self, name: str) -> Top | Function:
        try:
            return self.__dict__["tops"][name]
        except KeyError:
            raise AttributeError(f"NetSpec has no top named '{name}'") from None

    def __setitem__(self, key: str, value: Top | Function) -> None:
        self.tops[key] = value

    def __getitem__(self, key: str) -> Top | Function:
        return self.tops[key]

    def __delitem__(self, key: str) -> None:
        del self.tops[key]

    def keys(self) -> list[str]:
        return list(self.tops)

    def vals(self) -> list[Top | Function]:
        return list(self.tops.values())

    def update(self, name: str, params: dict[str, Any]) -> None:
        """Add or change keyword parameters of the layer behind top ``name``."""
        _layer_of(self.tops[name]).params.update(params)

    def to_proto(self) -> caffe_pb2.NetParameter:
        emitter = _Emitter({top: name for name, top in self.tops.items()})
        for top in self.tops.values():
            emitter.emit(_layer_of(top))
        return emitter.net()


class Layers:
    """``L.<Type>(*bottoms, **params)``: a layer description of Caffe type ``<Type>``."""

    def __getattr__(self, type_name: str):
        if type_name.startswith("__"):
            raise AttributeError(type_name)

        def layer(*bottoms: Top, **kwargs: Any):
            fn = Function(type_name, bottoms, kwargs)
            if fn.ntop == 0:
                return fn
            if fn.ntop == 1:
                return fn.tops[0]
            return fn.tops

        return layer


class _EnumValues:
    def __init__(self, message: str):
        self._message = message

    def __getattr__(self, name: str) -> int:
        try:
            cls = getattr(caffe_pb2, self._message + "Parameter")
        except AttributeError:
            raise AttributeError(f"caffe.proto has no message {self._message}Parameter") from None
        return getattr(cls, name)


class Parameters:
    """``P.<Type>.<NAME>``: the enum value ``<Type>Parameter.<NAME>`` (``P.Pooling.MAX``)."""

    def __getattr__(self, name: str) -> _EnumValues:
        if name.startswith("__"):
            raise AttributeError(name)
        return _EnumValues(name)


layers = Layers()
params = Parameters()
