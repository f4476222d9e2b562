"""The forks' development set (../shared/forks/models) and a protobuf wire encoder for
building fork binary files by hand, with each fork's own field numbers.

The development set is required: a missing directory is a test failure, never a skip. Its
prototxts are read in place, never copied into the repository.
"""

from __future__ import annotations

import json
import struct

from tests.golden import ROOT

FORK_MODELS = (ROOT / ".." / "shared" / "forks" / "models").resolve()

#: Template variables of the DeepLab prototxts (DeepLab's run scripts fill them with sed).
DEFINES = {"NUM_LABELS": "21"}


def manifest() -> list[dict]:
    """The development set's manifest.json entries (fails when the set is missing)."""
    path = FORK_MODELS / "manifest.json"
    if not path.exists():
        raise FileNotFoundError(
            f"fork development set missing: {path} (expected ../shared/forks beside the project)"
        )
    return json.loads(path.read_text())["files"]


def model_names() -> list[str]:
    """The file names of every prototxt in the development set."""
    return sorted(entry["name"] for entry in manifest())


# ---------------------------------------------------------------------------------------------
# Protobuf wire format, by hand


def varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def v(number: int, value: int) -> bytes:
    """A varint field (int32, uint32, bool, enum)."""
    return key(number, 0) + varint(value)


def f32(number: int, value: float) -> bytes:
    """A fixed32 float field."""
    return key(number, 5) + struct.pack("<f", value)


def ld(number: int, payload: bytes) -> bytes:
    """A length-delimited field (string, bytes, sub-message, packed repeated)."""
    return key(number, 2) + varint(len(payload)) + payload


def s(number: int, text: str) -> bytes:
    return ld(number, text.encode())


def packed_floats(number: int, values) -> bytes:
    return ld(number, struct.pack(f"<{len(values)}f", *values))


def packed_varints(number: int, values) -> bytes:
    return ld(number, b"".join(varint(x) for x in values))


def bvlc_blob(shape, values) -> bytes:
    """BVLC's BlobProto: packed data (5), shape (7)."""
    return packed_floats(5, values) + ld(7, packed_varints(1, shape))


def c3d_blob(dims, values) -> bytes:
    """C3D v1.0's BlobProto: num 1, channels 2, length 3, height 4, width 5, data 6."""
    return b"".join(v(i + 1, d) for i, d in enumerate(dims)) + packed_floats(6, values)


def v2_layer(name: str, kind: str, *fields: bytes, bottoms=(), tops=()) -> bytes:
    """A NetParameter.layer (100) entry: LayerParameter name 1, type 2, bottom 3, top 4."""
    body = s(1, name) + s(2, kind)
    body += b"".join(s(3, b) for b in bottoms) + b"".join(s(4, t) for t in tops)
    return ld(100, body + b"".join(fields))


def v1_layer(name: str, kind: int, *fields: bytes) -> bytes:
    """A NetParameter.layers (2) entry: V1LayerParameter name 4, type 5 (enum)."""
    return ld(2, s(4, name) + v(5, kind) + b"".join(fields))
