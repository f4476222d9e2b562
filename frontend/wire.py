"""The protobuf wire format, read field by field from bytes (no schema needed).

Used to look at a binary Caffe file before choosing the schema (the dialect) it was written
with: layer names, types, which field numbers a layer holds, how its blobs are laid out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

VARINT, I64, LEN, I32 = 0, 1, 2, 5
_WIDTH = {I64: 8, I32: 4}


class WireFormatError(ValueError):
    """Bytes that are not a protobuf message (the message says where)."""


@dataclass(frozen=True)
class WireField:
    """One field: ``value`` for varints and fixed-width scalars; ``payload`` for LEN."""

    number: int
    wire: int
    value: int = 0
    payload: bytes = b""


def varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of the varint at ``pos``."""
    value = shift = 0
    for i in range(pos, min(len(data), pos + 10)):
        value |= (data[i] & 0x7F) << shift
        if not data[i] & 0x80:
            return value, i + 1
        shift += 7
    raise WireFormatError(f"truncated or overlong varint at byte {pos}")


def fields(data: bytes) -> Iterator[WireField]:
    """Every field of the message ``data`` holds, in order."""
    pos = 0
    while pos < len(data):
        key, pos = varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireFormatError(f"field number 0 at byte {pos}")
        if wire == VARINT:
            value, pos = varint(data, pos)
            yield WireField(number, wire, value=value)
        elif wire in _WIDTH:
            end = pos + _WIDTH[wire]
            if end > len(data):
                raise WireFormatError(f"truncated field {number} at byte {pos}")
            yield WireField(number, wire, value=int.from_bytes(data[pos:end], "little"))
            pos = end
        elif wire == LEN:
            length, pos = varint(data, pos)
            if pos + length > len(data):
                raise WireFormatError(f"field {number} claims {length} bytes at byte {pos}")
            yield WireField(number, wire, payload=data[pos : pos + length])
            pos += length
        else:
            raise WireFormatError(f"invalid wire type {wire} for field {number} at byte {pos}")
