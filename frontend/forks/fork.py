"""One fork of Caffe as data (:class:`Fork`): the record every fork table in this package fills.

The tables live beside it: :mod:`caffe2jax.frontend.forks.catalog` (the forks and their
priority order) and one ``catalog_<family>.py`` per family of forks added later (the face
recognition forks in :mod:`caffe2jax.frontend.forks.catalog_face`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Numbers = Mapping[str, Mapping[str, int]]


@dataclass(frozen=True, eq=False)
class Fork:
    """One fork of Caffe: where it comes from and how it numbers its schema."""

    key: str
    name: str
    source: str
    adds: Numbers = field(default_factory=dict)
    renumbers: Numbers = field(default_factory=dict)
    enums: Numbers = field(default_factory=dict)
    enum_renumbers: Numbers = field(default_factory=dict)
    #: V2 layer type strings the fork registers beyond BVLC's
    types: tuple[str, ...] = ()
    #: V1 LayerType enum names the fork adds -> the V2 type string they upgrade to
    v1_types: Mapping[str, str] = field(default_factory=dict)
    #: how its BlobProto is laid out: "bvlc" or "c3d-v1.0" (5-D, renumbered)
    blob_layout: str = "bvlc"

    def numbers(self) -> dict[str, dict[str, int]]:
        """``adds`` and ``renumbers`` together: every field whose number this fork sets."""
        out: dict[str, dict[str, int]] = {}
        for table in (self.adds, self.renumbers):
            for message, fields in table.items():
                out.setdefault(message, {}).update(fields)
        return out

    def enum_numbers(self) -> dict[str, dict[str, int]]:
        """``enums`` and ``enum_renumbers`` together."""
        out: dict[str, dict[str, int]] = {}
        for table in (self.enums, self.enum_renumbers):
            for enum, values in table.items():
                out.setdefault(enum, {}).update(values)
        return out
