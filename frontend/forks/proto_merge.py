"""A fork's caffe.proto laid over caffe2jax's schema: the classes its prototxts parse with.

Text prototxts name their fields, so a fork's prototxt parses with caffe2jax's schema
(frontend/caffe.proto) plus the fields and messages only the fork has. :func:`extend` copies
caffe.proto's descriptor and adds, message by message (matched by full name), every field,
nested message, enum and enum value of the fork's file that caffe.proto lacks by name. An
added field keeps the fork's number where caffe.proto leaves it free, else it takes a free
number above :data:`FIRST_FREE` (the number only matters inside one process: messages of
this schema are carried in caffe.proto's classes as unknown fields). A field both schemas
have by name must agree in kind (label, type, message type), else the text would mean
different things: :class:`MergeError` with the fork's file:line.

:func:`collisions` lists, one line each, the numbers of the fork's file that a built-in
dialect (BVLC or a fork of :mod:`caffe2jax.frontend.forks.catalog`) uses for another field,
as :mod:`caffe2jax.frontend.forks.dialect` records clashes between built-in forks.
"""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf import descriptor_pb2

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.frontend.forks.catalog import FORKS, NON_BVLC_FIELDS

#: Numbers handed to a fork's field whose own number caffe.proto already uses (below 2^29).
FIRST_FREE = 500_000_000
# SourceCodeInfo paths: FileDescriptorProto.message_type / enum_type, DescriptorProto.field /
# nested_type / enum_type
_MESSAGE, _FILE_ENUM, _FIELD, _NESTED, _ENUM = 4, 5, 2, 3, 4
_PACKAGE = ".caffe."


class MergeError(CaffeError):
    """A fork's caffe.proto that cannot be laid over caffe2jax's schema."""


def line_of(proto: descriptor_pb2.FileDescriptorProto, path: tuple[int, ...]) -> int:
    """The 1-based line of the element at ``path`` (descriptor.proto's SourceCodeInfo), 0 if
    protoc recorded none."""
    for location in proto.source_code_info.location:
        if tuple(location.path) == path:
            return location.span[0] + 1
    return 0


def base_schema() -> descriptor_pb2.FileDescriptorProto:
    """caffe.proto's own descriptor, as a proto to edit."""
    proto = descriptor_pb2.FileDescriptorProto()
    caffe_pb2.DESCRIPTOR.CopyToProto(proto)
    return proto


def _same_kind(a: descriptor_pb2.FieldDescriptorProto, b) -> bool:
    return a.type == b.type and a.type_name == b.type_name and a.label == b.label


def _describe(field: descriptor_pb2.FieldDescriptorProto) -> str:
    label = descriptor_pb2.FieldDescriptorProto.Label.Name(field.label)[6:].lower()
    kind = field.type_name.removeprefix(_PACKAGE) or (
        descriptor_pb2.FieldDescriptorProto.Type.Name(field.type)[5:].lower()
    )
    return f"{label} {kind}"


class _Merge:
    """One fork file merged into a copy of caffe.proto (``base``)."""

    def __init__(self, fork: descriptor_pb2.FileDescriptorProto, where: str) -> None:
        self.fork, self.where = fork, where
        self.base = base_schema()

    def fail(self, path: tuple[int, ...], text: str) -> MergeError:
        line = line_of(self.fork, path)
        return MergeError(f"{self.where}:{line or '?'}: {text}")

    def run(self) -> descriptor_pb2.FileDescriptorProto:
        names = {m.name: m for m in self.base.message_type}
        for i, msg in enumerate(self.fork.message_type):
            self.message(msg, names.get(msg.name), self.base.message_type, (_MESSAGE, i))
        known = {e.name: e for e in self.base.enum_type}
        for i, enum in enumerate(self.fork.enum_type):
            self.enum(enum, known.get(enum.name), self.base.enum_type, (_FILE_ENUM, i))
        return self.base

    def message(self, msg, ours, siblings, path: tuple[int, ...]) -> None:
        """Merge fork message ``msg`` into ``ours`` (caffe.proto's, None: added whole)."""
        if ours is None:
            added = siblings.add()
            added.CopyFrom(msg)
            for f in added.field:
                f.ClearField("oneof_index")
            del added.oneof_decl[:]
            return
        self.fields(msg, ours, path)
        nested = {m.name: m for m in ours.nested_type}
        for i, sub in enumerate(msg.nested_type):
            self.message(sub, nested.get(sub.name), ours.nested_type, (*path, _NESTED, i))
        enums = {e.name: e for e in ours.enum_type}
        for i, enum in enumerate(msg.enum_type):
            self.enum(enum, enums.get(enum.name), ours.enum_type, (*path, _ENUM, i))

    def fields(self, msg, ours, path: tuple[int, ...]) -> None:
        by_name = {f.name: f for f in ours.field}
        taken = {f.number for f in ours.field}
        for i, field in enumerate(msg.field):
            mine = by_name.get(field.name)
            if mine is not None:
                if not _same_kind(field, mine):
                    raise self.fail(
                        (*path, _FIELD, i),
                        f"{ours.name}.{field.name} is {_describe(field)} here but "
                        f"{_describe(mine)} in caffe2jax's caffe.proto; rename it in the fork",
                    )
                continue
            added = ours.field.add()
            added.CopyFrom(field)
            added.ClearField("oneof_index")
            if added.number in taken:
                added.number = max([FIRST_FREE - 1, *taken]) + 1
            taken.add(added.number)

    def enum(self, enum, ours, siblings, path: tuple[int, ...]) -> None:
        if ours is None:
            siblings.add().CopyFrom(enum)
            return
        names = {v.name for v in ours.value}
        taken = {v.number for v in ours.value}
        for value in enum.value:
            if value.name in names:
                continue
            added = ours.value.add()
            added.CopyFrom(value)
            if added.number in taken:
                added.number = max(taken) + 1
            taken.add(added.number)


def extend(fork: descriptor_pb2.FileDescriptorProto, where: str):
    """caffe.proto with ``fork``'s own fields, messages and enums added (see the module)."""
    return _Merge(fork, where).run()


def complete(fork: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """``fork`` with the top-level messages and enums it lacks taken from caffe.proto (a
    reduced fork file still decodes a whole NetParameter: its own messages at its numbers)."""
    out = descriptor_pb2.FileDescriptorProto()
    out.CopyFrom(fork)
    base = base_schema()
    have = {m.name for m in out.message_type} | {e.name for e in out.enum_type}
    out.message_type.extend(m for m in base.message_type if m.name not in have)
    out.enum_type.extend(e for e in base.enum_type if e.name not in have)
    return out


# ---------------------------------------------------------------------------------------------
# The fork's numbers, and where a built-in dialect uses them differently


def numbers(fork: descriptor_pb2.FileDescriptorProto) -> dict[str, dict[str, int]]:
    """Message (nested ones ``"Outer.Inner"``) -> field -> the fork's number."""
    out: dict[str, dict[str, int]] = {}

    def walk(msg, prefix: str) -> None:
        name = f"{prefix}{msg.name}"
        out[name] = {f.name: f.number for f in msg.field}
        for sub in msg.nested_type:
            walk(sub, f"{name}.")

    for msg in fork.message_type:
        walk(msg, "")
    return out


def bvlc_numbers() -> dict[str, dict[str, int]]:
    """BVLC Caffe's numbers: caffe.proto's, less the forks' fields."""
    out: dict[str, dict[str, int]] = {}

    def walk(msg, prefix: str) -> None:
        name = f"{prefix}{msg.name}"
        foreign = NON_BVLC_FIELDS.get(name, frozenset())
        out[name] = {f.name: f.number for f in msg.fields if f.name not in foreign}
        for sub in msg.nested_types:
            walk(sub, f"{name}.")

    for msg in caffe_pb2.DESCRIPTOR.message_types_by_name.values():
        walk(msg, "")
    return out


def _builtin() -> Iterator[tuple[str, dict[str, dict[str, int]]]]:
    yield "BVLC Caffe", bvlc_numbers()
    for fork in FORKS:
        yield fork.name, fork.numbers()


def _field_paths(fork: descriptor_pb2.FileDescriptorProto) -> dict[tuple[str, str], tuple]:
    paths: dict[tuple[str, str], tuple] = {}

    def walk(msg, prefix: str, path: tuple) -> None:
        name = f"{prefix}{msg.name}"
        for i, f in enumerate(msg.field):
            paths[(name, f.name)] = (*path, _FIELD, i)
        for j, sub in enumerate(msg.nested_type):
            walk(sub, f"{name}.", (*path, _NESTED, j))

    for i, msg in enumerate(fork.message_type):
        walk(msg, "", (_MESSAGE, i))
    return paths


def _clashes(msg: str, name: str, number: int) -> Iterator[str]:
    for dialect, theirs in _builtin():
        fields = theirs.get(msg, {})
        other = next((n for n, k in fields.items() if k == number), None)
        if other is not None and other != name:
            yield f"{other} in {dialect}"
        elif name in fields and fields[name] != number:
            yield f"{fields[name]} in {dialect}"


def collisions(fork: descriptor_pb2.FileDescriptorProto, where: str) -> list[str]:
    """One line per field of ``fork`` whose number a built-in dialect gives another field, or
    which a built-in dialect numbers differently: ``x.proto:15: LayerParameter field 147
    (auto_crop_param here) is upsample_param in ENet, roi_pooling_param in R-FCN``."""
    out = []
    for (msg, name), path in _field_paths(fork).items():
        number = numbers(fork)[msg][name]
        clashes = list(dict.fromkeys(_clashes(msg, name, number)))
        if clashes:
            line = line_of(fork, path) or "?"
            out.append(f"{where}:{line}: {msg} field {number} ({name} here) is "
                       f"{', '.join(clashes)}")  # fmt: skip
    return out
