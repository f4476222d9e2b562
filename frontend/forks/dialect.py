"""Dialects: which fork's numbering a Caffe file was written with, chosen once per net.

Text prototxts name their fields, so they parse the same under every fork (caffe2jax's schema
holds every fork's fields by name). Binary files (``.caffemodel``, binary nets, mean files)
carry only numbers, and forks gave the same number different meanings (LayerParameter 143 is
BVLC's ``input_param`` and PSPNet's ``interp_param``; C3D v1.0 renumbered BlobProto itself).
A :class:`Dialect` is BVLC's numbering with one or more forks' numberings laid over it
(:mod:`caffe2jax.frontend.forks.catalog` holds them); it is

* chosen from what the prototxt text uses (:func:`detect`): fork layer types, fork fields,
  V1 layer type names, py-faster-rcnn's / ENet's Python layer modules;
* or given by the user (``dialect="pspnet"``, ``"ssd+ceil_mode"``, ``"bvlc"``, or the path of
  a fork's own caffe.proto: :mod:`caffe2jax.frontend.forks.user_proto`), which always wins.

Reading weights uses only each layer's name, type and blobs (as OpenCV does), never the layer
parameters stored in the binary, so there the dialect only decides the BlobProto layout and
the meaning of V1 type numbers; :mod:`caffe2jax.frontend.forks.schema` decodes whole binary
messages with a dialect's numbers when a full binary net must be read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from google.protobuf import descriptor, message

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.frontend.forks import user_proto
from caffe2jax.frontend.forks.catalog import (
    FORKS,
    FORKS_BY_KEY,
    NON_BVLC_VALUES,
    UPSAMPLE_FORKS,
    Fork,
    fork_names,
    forks_of_type,
)
from caffe2jax.frontend.forks.catalog_ssd_derived import faceboxes_signature
from caffe2jax.frontend.forks.layer_types import PYTHON_MODULES

BVLC = "bvlc"
#: caffe.proto's own numbering (what caffe2jax writes), as a dialect.
MERGED = "caffe2jax"
_PACKAGE = "caffe."
_V1_ENUM = "V1LayerParameter.LayerType"


class DialectError(CaffeError):
    """A dialect that cannot be used: unknown name, or forks whose numbers clash."""


@dataclass(frozen=True)
class Dialect:
    """BVLC's numbering with ``forks``' laid over it, in caffe.proto's priority order.

    ``evidence`` says why it was chosen (for messages); ``conflicts`` lists clashes between
    the forks' numbers: such a dialect reads text and weights fine, but refuses to decode a
    whole binary message (the numbers would be ambiguous).
    """

    forks: tuple[Fork, ...] = ()
    evidence: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    given: bool = False
    merged: bool = False

    @property
    def key(self) -> str:
        """``"bvlc"``, ``"pspnet"``, ``"ssd+ceil_mode"``: what ``dialect=`` accepts."""
        if self.merged:
            return MERGED
        return "+".join(f.key for f in self.forks) or BVLC

    @property
    def name(self) -> str:
        """The forks' names, for messages."""
        if self.merged:
            return "caffe2jax's own numbering (frontend/caffe.proto)"
        return " + ".join(f.name for f in self.forks) or "BVLC Caffe"

    @property
    def blob_layout(self) -> str:
        """``"bvlc"`` or ``"c3d-v1.0"``: how this dialect's BlobProto is numbered."""
        layouts = {f.blob_layout for f in self.forks} - {BVLC}
        return layouts.pop() if layouts else BVLC

    def has(self, *keys: str) -> bool:
        """Whether any of the fork ``keys`` is part of this dialect."""
        return any(f.key in keys for f in self.forks)

    def numbers(self) -> dict[str, dict[str, int]]:
        """Message -> field -> the number this dialect gives it, where it differs from (or
        adds to) caffe.proto's; the first fork that numbers a field wins."""
        out: dict[str, dict[str, int]] = {}
        for fork in self.forks:
            for msg, fields in fork.numbers().items():
                for name, number in fields.items():
                    out.setdefault(msg, {}).setdefault(name, number)
        return out

    def enum_numbers(self) -> dict[str, dict[str, int]]:
        """Enum -> value name -> number, where this dialect differs from caffe.proto."""
        out: dict[str, dict[str, int]] = {}
        for fork in self.forks:
            for enum, values in fork.enum_numbers().items():
                for name, number in values.items():
                    out.setdefault(enum, {}).setdefault(name, number)
        return out

    def v1_types(self) -> dict[int, str]:
        """V1 LayerType number -> enum name, as this dialect numbers the enum."""
        enum = caffe_pb2.V1LayerParameter.LayerType.DESCRIPTOR
        overrides = self.enum_numbers().get(_V1_ENUM, {})
        if self.merged:
            return {v.number: v.name for v in enum.values}
        foreign = NON_BVLC_VALUES.get(_V1_ENUM, frozenset()) - set(overrides)
        merged = {v.name: v.number for v in enum.values if v.name not in foreign}
        return {number: name for name, number in renumber(merged, overrides).items()}

    def require_consistent(self, what: str) -> None:
        """Refuse to decode ``what`` when the forks' numbers clash."""
        if self.conflicts:
            raise DialectError(
                f"{what}: this net uses fields of {self.name}, whose binary numbers clash "
                f"({self.conflicts[0]}); pass the dialect the file was written with, e.g. "
                f"dialect='{self.forks[0].key}'"
            )


def renumber(merged: dict[str, int], overrides: dict[str, int]) -> dict[str, int]:
    """Name -> number after ``overrides``: a name whose merged number an override takes is
    dropped (the fork has no such field or value)."""
    taken = set(overrides.values())
    return {
        name: overrides.get(name, number)
        for name, number in merged.items()
        if name in overrides or number not in taken
    }


def dialect_names() -> list[str]:
    """The fork keys ``dialect=`` accepts (combine several with ``+``), and ``"bvlc"``."""
    return [BVLC, *FORKS_BY_KEY, MERGED]


def get(spec: str | Dialect | None, default: Dialect | None = None) -> Dialect:
    """A Dialect from a user's ``dialect=`` value (``None``: ``default``, else BVLC)."""
    if isinstance(spec, Dialect):
        return spec
    if spec is None or spec == "":
        return default or Dialect()
    parts = [k.strip() for k in str(spec).split("+") if k.strip()]
    keys = [k if user_proto.is_proto(k) else k.lower() for k in parts]
    if keys == [MERGED]:
        return Dialect(given=True, merged=True)
    unknown = [k for k in keys if k not in FORKS_BY_KEY and k != BVLC and not k.endswith(".proto")]
    if unknown:
        raise DialectError(
            f"unknown dialect {unknown[0]!r}; use one of {', '.join(dialect_names())} or the "
            "path of a fork's caffe.proto (several joined by '+')"
        )
    forks = [user_proto.load(k) if user_proto.is_proto(k) else FORKS_BY_KEY[k] for k in keys
             if k != BVLC]  # fmt: skip
    return compose(forks, given=True)


def compose(forks: Iterable[Fork], evidence=(), given: bool = False) -> Dialect:
    """The dialect of ``forks`` (in priority order: a user's fork first, then the built-in
    ones in caffe.proto's order), with its number clashes worked out."""
    forks = list(forks)
    keys = {f.key for f in forks}
    users = tuple(dict.fromkeys(f for f in forks if isinstance(f, user_proto.UserFork)))
    ordered = users + tuple(f for f in FORKS if f.key in keys)
    return Dialect(ordered, tuple(evidence), tuple(_conflicts(ordered)), given)


def _conflicts(forks: tuple[Fork, ...]) -> Iterator[str]:
    for i, a in enumerate(forks):
        for b in forks[i + 1 :]:
            yield from _pair_conflicts(a, b)


def _pair_conflicts(a: Fork, b: Fork) -> Iterator[str]:
    an, bn = a.numbers(), b.numbers()
    for msg in sorted(set(an) & set(bn)):
        by_number = {number: name for name, number in an[msg].items()}
        for name, number in bn[msg].items():
            if name in an[msg] and an[msg][name] != number:
                yield f"{msg}.{name} is {an[msg][name]} in {a.name}, {number} in {b.name}"
            elif by_number.get(number, name) != name:
                yield (
                    f"{msg} field {number} is {by_number[number]} in {a.name}, {name} in {b.name}"
                )
    if BVLC not in (a.blob_layout, b.blob_layout) or a.blob_layout == b.blob_layout:
        return
    yield f"BlobProto is laid out differently in {a.name} and {b.name}"


# ---------------------------------------------------------------------------------------------
# Choosing a dialect from a prototxt


def _evidence_index() -> dict[tuple[str, str], tuple[Fork, ...]]:
    index: dict[tuple[str, str], list[Fork]] = {}
    for fork in FORKS:
        for msg, fields in fork.adds.items():
            for name in fields:
                index.setdefault((msg, name), []).append(fork)
    return {key: tuple(forks) for key, forks in index.items()}


_EVIDENCE = _evidence_index()
_MESSAGE = descriptor.FieldDescriptor.TYPE_MESSAGE


def _set_fields(msg: message.Message) -> Iterator[tuple[str, str]]:
    """(message name, field name) of every field set anywhere in ``msg``."""
    owner = msg.DESCRIPTOR.full_name.removeprefix(_PACKAGE)
    for field, value in msg.ListFields():
        yield owner, field.name
        if field.type == _MESSAGE:
            for sub in value if field.is_repeated else (value,):
                yield from _set_fields(sub)


def _type_candidates(layer: caffe_pb2.LayerParameter) -> tuple[Fork, ...]:
    """The forks a V2 layer's type points to, best guess first."""
    if layer.type == "Upsample":
        return tuple(FORKS_BY_KEY[k] for k in UPSAMPLE_FORKS[len(layer.bottom) == 2])
    if layer.type == "BN":  # its bn_param fields tell SegNet's from PSPNet's; none: no guess
        return ()
    if layer.type == "PriorBox" and faceboxes_signature(layer.prior_box_param.min_size):
        return (FORKS_BY_KEY["faceboxes"],)  # the layer FaceBoxes densifies (21 priors)
    if layer.type == "Python":
        module = layer.python_param.module
        return tuple(FORKS_BY_KEY[k] for k in PYTHON_MODULES.get(module, ()))
    return forks_of_type(layer.type)


def _features(net: caffe_pb2.NetParameter) -> Iterator[tuple[str, tuple[Fork, ...]]]:
    """(what was seen, the forks it points to) for every fork feature of ``net``."""
    for owner, name in _set_fields(net):
        forks = _EVIDENCE.get((owner, name))
        if forks:
            yield f"{owner}.{name}", forks
    for layer in net.layer:
        forks = _type_candidates(layer)
        if forks:
            yield f"layer type {layer.type}", forks
    v1_names = caffe_pb2.V1LayerParameter.LayerType
    for layer in net.layers:
        name = v1_names.Name(layer.type) if layer.HasField("type") else ""
        forks = tuple(f for f in FORKS if name in f.v1_types)
        if forks:
            yield f"V1 layer type {name}", forks


def detect(net: caffe_pb2.NetParameter) -> Dialect:
    """The dialect a parsed (not yet upgraded) net's text points to; BVLC when nothing does."""
    return choose(_features(net))


def choose(features: Iterable[tuple[str, tuple[Fork, ...]]]) -> Dialect:
    """The forks that explain ``features`` ((what was seen, candidate forks) pairs).

    Features with fewer candidate forks decide first; a feature some chosen fork already
    explains adds nothing; otherwise its first candidate is chosen. Forks whose numbers clash
    (e.g. SSD's and CRNN's 200-203) are kept, with the clash recorded.
    """
    chosen: list[Fork] = []
    evidence: list[str] = []
    for what, forks in sorted(features, key=lambda item: len(item[1])):
        if not forks or any(f in chosen for f in forks):
            continue
        chosen.append(forks[0])
        evidence.append(f"{what} ({fork_names(forks)})")
    return compose(chosen, evidence)


def describe(dialect: Dialect) -> str:
    """One line: the dialect and why it was chosen."""
    if dialect.given:
        return f"dialect {dialect.key} ({dialect.name}), as given"
    if not dialect.forks:
        return "dialect bvlc (no fork layer or field in the prototxt)"
    return f"dialect {dialect.key} ({dialect.name}), from {'; '.join(dialect.evidence[:3])}"
