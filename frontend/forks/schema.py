"""A dialect's own schema: caffe.proto renumbered as a fork numbers it, and conversions.

:func:`schema` copies caffe.proto's descriptor, gives every field and enum value the number
the dialect's forks give it (:mod:`caffe2jax.frontend.forks.catalog`), and drops the fields whose
number a fork took for something else (PSPNet has no ``input_param``: its 143 is
``interp_param``). Messages of that schema parse a fork's binary files exactly as the fork's
Caffe did. :func:`decode` then copies such a message into caffe.proto's classes *by field
name* (values, enum values by name), and :func:`encode` goes the other way.

Nothing is decoded silently with the wrong numbers: a field the dialect's schema does not
know (an unknown number, or a known number with another wire type) or a required field that
is missing makes :func:`decode` fail, naming where.
"""

from __future__ import annotations

import functools

from google.protobuf import descriptor, descriptor_pb2, descriptor_pool, message, message_factory
from google.protobuf import unknown_fields as unknown

from caffe2jax.frontend import caffe_pb2, wire
from caffe2jax.frontend.errors import PrototxtError
from caffe2jax.frontend.forks import user_proto
from caffe2jax.frontend.forks.catalog import (
    FORKS,
    FORKS_BY_KEY,
    NON_BVLC_FIELDS,
    NON_BVLC_VALUES,
    UPSAMPLE_FORKS,
    Fork,
    forks_of_type,
)
from caffe2jax.frontend.forks.dialect import (
    BVLC,
    MERGED,
    Dialect,
    DialectError,
    choose,
    get,
    renumber,
)
from caffe2jax.frontend.forks.layer_types import FORK_TYPE_PARAMS

_FD = descriptor.FieldDescriptor


def _renumber_message(msg: descriptor_pb2.DescriptorProto, path: str, dialect: Dialect) -> None:
    fields = dialect.numbers().get(path, {})
    foreign = NON_BVLC_FIELDS.get(path, frozenset()) - set(fields)
    numbering = renumber({f.name: f.number for f in msg.field if f.name not in foreign}, fields)
    kept = [f for f in msg.field if f.name in numbering]
    for f in kept:
        f.number = numbering[f.name]
    del msg.field[:]
    msg.field.extend(kept)
    for enum in msg.enum_type:
        _renumber_enum(enum, f"{path}.{enum.name}", dialect)
    for sub in msg.nested_type:
        _renumber_message(sub, f"{path}.{sub.name}", dialect)


def _renumber_enum(enum: descriptor_pb2.EnumDescriptorProto, path: str, dialect: Dialect) -> None:
    overrides = dialect.enum_numbers().get(path, {})
    foreign = NON_BVLC_VALUES.get(path, frozenset()) - set(overrides)
    if not overrides and not foreign:
        return
    numbering = renumber({v.name: v.number for v in enum.value if v.name not in foreign}, overrides)
    kept = [v for v in enum.value if v.name in numbering]
    for v in kept:
        v.number = numbering[v.name]
    del enum.value[:]
    enum.value.extend(kept)


@functools.cache
def _pool(key: str) -> descriptor_pool.DescriptorPool:
    dialect = get(key)
    proto = descriptor_pb2.FileDescriptorProto()
    caffe_pb2.DESCRIPTOR.CopyToProto(proto)
    for msg in proto.message_type:
        _renumber_message(msg, msg.name, dialect)
    _drop_dangling_defaults(proto)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return pool


def _drop_dangling_defaults(proto: descriptor_pb2.FileDescriptorProto) -> None:
    """A default naming an enum value the dialect dropped cannot stand (the fork has no
    such default either): remove it."""
    values: dict[str, set[str]] = {}

    def collect(msg, prefix):
        for enum in msg.enum_type:
            values[f"{prefix}.{msg.name}.{enum.name}"] = {v.name for v in enum.value}
        for sub in msg.nested_type:
            collect(sub, f"{prefix}.{msg.name}")

    def fix(msg):
        for f in msg.field:
            if f.type == _FD.TYPE_ENUM and f.HasField("default_value"):
                if f.default_value not in values.get(f.type_name, {f.default_value}):
                    f.ClearField("default_value")
        for sub in msg.nested_type:
            fix(sub)

    for msg in proto.message_type:
        collect(msg, ".caffe")
    for msg in proto.message_type:
        fix(msg)


def schema(dialect: str | Dialect, name: str) -> type[message.Message]:
    """The class of message ``name`` (e.g. ``"NetParameter"``) in ``dialect``'s numbering."""
    dialect = get(dialect)
    if dialect.merged:
        return getattr(caffe_pb2, name)
    pool = _pool(dialect.key)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"caffe.{name}"))


def decode(data: bytes, name: str, dialect: str | Dialect, where: str = "<bytes>"):
    """Parse binary ``data`` as message ``name`` written in ``dialect``'s numbering and return
    it as caffe.proto's message (fields matched by name)."""
    dialect = get(dialect)
    dialect.require_consistent(where)
    cls = schema(dialect, name)
    try:
        raw = cls.FromString(data)
    except message.DecodeError as err:
        raise PrototxtError(
            f"{where}: not a binary {name} in dialect {dialect.key} ({err})"
        ) from None
    out = getattr(caffe_pb2, name)()
    _copy(raw, out, dialect, where, name)
    return out


def encode(msg: message.Message, dialect: str | Dialect) -> bytes:
    """``msg`` (a caffe.proto message) serialized with ``dialect``'s numbers."""
    dialect = get(dialect)
    dialect.require_consistent("encoding")
    out = schema(dialect, msg.DESCRIPTOR.name)()
    _copy(msg, out, dialect, "<message>", msg.DESCRIPTOR.name)
    return out.SerializeToString()


def _copy(src: message.Message, dst: message.Message, dialect: Dialect, where: str, path: str):
    """Copy ``src`` into ``dst`` (the same message in another numbering) field by name."""
    stray = unknown.UnknownFieldSet(src)
    if len(stray):
        field = stray[0]
        raise DialectError(
            f"{where}: {path} holds field number {field.field_number} (wire type "
            f"{field.wire_type}), which dialect {dialect.key} ({dialect.name}) does not have: "
            "the file was written by another fork of Caffe; pass its dialect"
        )
    targets = dst.DESCRIPTOR.fields_by_name
    for field, value in src.ListFields():
        target = targets.get(field.name)
        if target is None:
            raise DialectError(
                f"{where}: {path}.{field.name} has no number in dialect {dialect.key} "
                f"({dialect.name})"
            )
        _copy_field(field, target, value, dst, dialect, where, f"{path}.{field.name}")


def _copy_field(field, target, value, dst, dialect, where, path) -> None:
    if field.type == _FD.TYPE_MESSAGE:
        if field.is_repeated:
            for item in value:
                _copy(item, getattr(dst, field.name).add(), dialect, where, path)
        else:
            _copy(value, getattr(dst, field.name), dialect, where, path)
        return
    if field.type == _FD.TYPE_ENUM:
        names = [field.enum_type.values_by_number[v].name for v in _items(field, value)]
        value = [target.enum_type.values_by_name[n].number for n in names]
        value = value if field.is_repeated else value[0]
    if field.is_repeated:
        getattr(dst, field.name).extend(value)
    else:
        setattr(dst, field.name, value)


def _items(field, value) -> list:
    return list(value) if field.is_repeated else [value]


# ---------------------------------------------------------------------------------------------
# Choosing the dialect of a binary net from its own bytes

_V1_ENUM = "V1LayerParameter.LayerType"


@functools.cache
def _bvlc_layer_numbers() -> frozenset[int]:
    return frozenset(f.number for f in schema(BVLC, "LayerParameter").DESCRIPTOR.fields)


def _bvlc_v1_numbers() -> set[int]:
    foreign = NON_BVLC_VALUES.get(_V1_ENUM, frozenset())
    return {n for name, n in caffe_pb2.V1LayerParameter.LayerType.items() if name not in foreign}


def _layer_numbers(fork: Fork) -> set[int]:
    return set(fork.numbers().get("LayerParameter", {}).values())


def c3d_v10_blob(payload: bytes) -> bool:
    """A C3D v1.0 BlobProto: its field 5 (width) is a varint; BVLC's 5 (data) never is."""
    return any(f.number == 5 and f.wire == wire.VARINT for f in wire.fields(payload))


_STRUCTURAL = frozenset(range(1, 12)) | {100, 101}  # name, type, bottom, ..., transform, loss


def _v2_features(payload: bytes) -> list[tuple[str, tuple[Fork, ...]]]:
    """The forks a V2 layer points to: those registering its type whose numbering fits the
    parameter numbers it holds, the ones that number them as their own first."""
    items = list(wire.fields(payload))
    kind = next((f.payload.decode("utf-8", "replace") for f in items if f.number == 2), "")
    bottoms = sum(f.number == 3 for f in items)
    present = {f.number for f in items} - _STRUCTURAL
    candidates = forks_of_type(kind)
    if kind == "Upsample":
        candidates = tuple(FORKS_BY_KEY[k] for k in UPSAMPLE_FORKS[bottoms == 2])
    bvlc = _bvlc_layer_numbers()
    fits = [f for f in candidates if present <= bvlc | _layer_numbers(f)]
    fits.sort(key=lambda f: -len(present & _layer_numbers(f)))
    if candidates:
        return [(f"layer type {kind}", tuple(fits) or candidates)]
    extra = present - bvlc
    if extra:
        owners = tuple(f for f in FORKS if extra <= _layer_numbers(f))
        return [(f"LayerParameter field(s) {sorted(extra)} on a {kind} layer", owners)]
    return []


def _v1_features(payload: bytes) -> list[tuple[str, tuple[Fork, ...]]]:
    out = []
    for f in wire.fields(payload):
        if f.number == 5 and f.wire == wire.VARINT and f.value not in _bvlc_v1_numbers():
            owners = tuple(
                fork for fork in FORKS if f.value in fork.enums.get(_V1_ENUM, {}).values()
            )
            out.append((f"V1 layer type number {f.value}", owners))
        elif f.number == 6 and f.wire == wire.LEN and c3d_v10_blob(f.payload):
            out.append(("5-D blobs (C3D v1.0's BlobProto)", (FORKS_BY_KEY["c3d-v1.0"],)))
    return out


@functools.cache
def _merged_only_numbers() -> frozenset[int]:
    """LayerParameter numbers only caffe.proto uses (fork fields it moved): a file holding one
    was written by caffe2jax."""
    ours = {f.number for f in caffe_pb2.LayerParameter.DESCRIPTOR.fields}
    theirs = set(_bvlc_layer_numbers()).union(*(_layer_numbers(f) for f in FORKS))
    return frozenset(ours - theirs)


def detect_binary(data: bytes) -> Dialect:
    """The dialect a binary NetParameter's own bytes point to: fork layer types (narrowed by
    the LayerParameter numbers each holds), V1 type numbers BVLC lacks, C3D v1.0's blobs;
    caffe2jax's own numbering when a layer holds a number only caffe.proto uses."""
    features: list[tuple[str, tuple[Fork, ...]]] = []
    try:
        for f in wire.fields(data):
            if f.number == 100 and f.wire == wire.LEN:
                numbers = {g.number for g in wire.fields(f.payload)}
                if numbers & _merged_only_numbers():
                    return get(MERGED)
                features += _v2_features(f.payload)
            elif f.number == 2 and f.wire == wire.LEN:
                features += _v1_features(f.payload)
    except wire.WireFormatError:
        return get(None)  # decoding reports what is wrong with the bytes
    return choose(features)


def decode_net(data: bytes, dialect: str | Dialect | None = None, where: str = "<bytes>"):
    """A binary NetParameter as caffe.proto's message, decoded with ``dialect``'s numbers
    (``None``: the dialect its own bytes point to, see :func:`detect_binary`)."""
    chosen = get(dialect) if dialect is not None else detect_binary(data)
    fork = next((f for f in chosen.forks if isinstance(f, user_proto.UserFork)), None)
    if fork is not None:  # a fork brought as its caffe.proto: its own schema decodes
        chosen.require_consistent(where)
        return user_proto.decode_net(data, fork, where)
    net = decode(data, "NetParameter", chosen, where)
    if not chosen.given and not chosen.has("ceil_mode") and not chosen.merged:
        _refuse_ambiguous_round_mode(net, chosen, where)
    for layer in net.layer:
        _check_params(layer, chosen, where)
    return net


def _check_params(layer: caffe_pb2.LayerParameter, dialect: Dialect, where: str) -> None:
    """A fork layer holding another layer type's parameter was decoded with the wrong fork's
    numbers (ENet's Upsample 147 {scale} reads as R-FCN's ROIPooling 147 {pooled_h})."""
    allowed = FORK_TYPE_PARAMS.get(layer.type)
    if allowed is None:
        return
    for field, _ in layer.ListFields():
        name = field.name
        if name.endswith("_param") and name not in (*allowed, "transform_param", "loss_param"):
            raise DialectError(
                f"{where}: layer '{layer.name}' (type {layer.type}) decodes with {name} in "
                f"dialect {dialect.key} ({dialect.name}), which a {layer.type} layer does not "
                "read: the file was written by another fork of Caffe; pass its dialect"
            )


def _refuse_ambiguous_round_mode(net, chosen: Dialect, where: str) -> None:
    """PoolingParameter field 13 is BVLC's round_mode and the ceil_mode patch's ceil_mode with
    the opposite meaning, same wire type: nothing in the bytes tells them apart."""
    for layer in [*net.layer, *net.layers]:
        if layer.pooling_param.HasField("round_mode"):
            combined = f"{chosen.key}+ceil_mode" if chosen.forks else "ceil_mode"
            raise DialectError(
                f"{where}: pooling layer '{layer.name}' stores field 13, which BVLC reads as "
                "round_mode and the ceil_mode patch as ceil_mode (the opposite meaning); pass "
                f"dialect='{chosen.key}' or dialect='{combined}'"
            )
