"""Caffe's BlobProto on the protobuf wire, read straight from a file and written in pieces.

A caffemodel can hold hundreds of megabytes of floats. Going through ``caffe_pb2`` would parse
every float into a repeated field and copy it again into numpy; here a :class:`Scanner` walks
the wire format with seeks and ``readinto`` lands each packed ``data`` field directly in a
numpy array, one blob at a time. Writing mirrors Caffe's ``Blob<float>::ToProto``.

Reproduced from BVLC Caffe (src/caffe/blob.cpp):

* ``FromProto``: the shape is the legacy 4-D ``(num, channels, height, width)`` when any of
  those fields is present, else ``shape.dim``; values are ``double_data`` when it is non-empty,
  else ``data``, and their count must equal the shape's count.
* ``ShapeEquals``: a legacy blob fits a target of at most 4 axes whose shape, padded with
  leading 1s to 4 axes (``LegacyShape``), equals ``(num, channels, height, width)``; a modern
  blob fits only the identical shape.
* ``ToProto`` (float, no diff): packed ``data`` (field 5), then ``shape`` (field 7), which is
  absent for a 0-axis blob because Caffe only touches ``mutable_shape()`` once per axis.

C3D v1.0 renumbered BlobProto for its 5-D blobs: num 1, channels 2, **length 3, height 4,
width 5, data 6, diff 7** (BVLC: height 3, width 4, data 5, diff 6, shape 7). Read with BVLC's
numbers such a blob would lose its data (into ``diff``); :func:`read_blob` reads each layout
with its own numbers, and tells them apart from the bytes alone: C3D's field 5 (width) is a
varint, BVLC's field 5 (data) never is. A layout given by the caller's dialect that the bytes
contradict is an error, never a silent re-reading.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
from google.protobuf.message import DecodeError

from caffe2jax.frontend import caffe_pb2

VARINT, I64, LEN, I32 = 0, 1, 2, 5
_MAX_VARINT = 10


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message (the message says where)."""


def encode_varint(value: int) -> bytes:
    """Protobuf base-128 varint; negative int32/int64 values take ten bytes, as protobuf does."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def decode_varint(data: bytes | memoryview, pos: int = 0) -> tuple[int, int]:
    """(value, next position) of the varint at ``pos``."""
    value = shift = 0
    for i in range(pos, min(len(data), pos + _MAX_VARINT)):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    raise WireError(f"truncated or overlong varint at byte {pos}")


def signed(value: int) -> int:
    """Two's-complement reading of a varint that holds an int32/int64."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def tag(number: int, wire: int) -> bytes:
    return encode_varint(number << 3 | wire)


@dataclass(frozen=True)
class Field:
    """One field on the wire: ``value`` for varints and fixed-size scalars, else the payload's
    absolute ``offset`` and ``length`` in the file; ``end`` is where the next field starts."""

    number: int
    wire: int
    value: int = 0
    offset: int = 0
    length: int = 0
    end: int = 0


class Scanner:
    """Walks protobuf messages inside a seekable binary file without reading payloads."""

    def __init__(self, handle: BinaryIO, size: int):
        self.handle = handle
        self.size = size

    def read(self, offset: int, length: int) -> bytes:
        self.handle.seek(offset)
        data = self.handle.read(length)
        if len(data) != length:
            raise WireError(f"truncated: {length} bytes expected at byte {offset}")
        return data

    def _varint(self, pos: int, end: int) -> tuple[int, int]:
        self.handle.seek(pos)
        head = self.handle.read(min(_MAX_VARINT, end - pos))
        value, used = decode_varint(head)
        return value, pos + used

    def fields(self, start: int, end: int) -> list[Field]:
        """Every field of the message occupying bytes ``[start, end)``, in file order."""
        out = []
        pos = start
        while pos < end:
            key, pos = self._varint(pos, end)
            number, wire = key >> 3, key & 7
            if number == 0:
                raise WireError(f"field number 0 at byte {pos}")
            if wire == VARINT:
                value, pos = self._varint(pos, end)
                out.append(Field(number, wire, value=value, end=pos))
            elif wire in (I64, I32):
                width = 8 if wire == I64 else 4
                if pos + width > end:
                    raise WireError(f"truncated: {width}-byte field {number} at byte {pos}")
                value = int.from_bytes(self.read(pos, width), "little")
                pos += width
                out.append(Field(number, wire, value=value, end=pos))
            elif wire == LEN:
                length, pos = self._varint(pos, end)
                if pos + length > end:
                    raise WireError(
                        f"truncated: field {number} claims {length} bytes at byte {pos}, "
                        f"only {end - pos} remain"
                    )
                out.append(Field(number, wire, offset=pos, length=length, end=pos + length))
                pos += length
            else:
                raise WireError(f"invalid wire type {wire} for field {number} at byte {pos}")
        return out

    def text(self, field: Field) -> str:
        return self.read(field.offset, field.length).decode("utf-8", errors="replace")

    def floats(self, field: Field, dtype: str) -> np.ndarray:
        """A packed float/double payload read straight into a new numpy array."""
        width = np.dtype(dtype).itemsize
        if field.length % width:
            raise WireError(f"packed field {field.number} of {field.length} bytes is not {dtype}")
        out = aligned_empty(field.length // width, dtype)
        self.handle.seek(field.offset)
        if self.handle.readinto(memoryview(out).cast("B")) != field.length:
            raise WireError(f"truncated: packed field at byte {field.offset}")
        return out


def aligned_empty(count: int, dtype: str | np.dtype, align: int = 64) -> np.ndarray:
    """An uninitialized 1-D array whose data starts on an ``align``-byte boundary: XLA's CPU
    client adopts such a buffer in ``jax.device_put`` instead of copying it."""
    dtype = np.dtype(dtype)
    raw = np.empty(count * dtype.itemsize + align, dtype=np.uint8)
    start = -raw.ctypes.data % align
    return raw[start : start + count * dtype.itemsize].view(dtype)


BVLC_LAYOUT, C3D_V10_LAYOUT = "bvlc", "c3d-v1.0"


class LayoutError(WireError):
    """A BlobProto whose bytes are laid out in another dialect than the one asked for."""

    def __init__(self, found: str, expected: str):
        self.found, self.expected = found, expected
        super().__init__(
            f"it is a {_LAYOUT_NAMES[found]} BlobProto, not a {_LAYOUT_NAMES[expected]} one "
            f"(pass dialect='{found}')"
        )


_LAYOUT_NAMES = {BVLC_LAYOUT: "BVLC", C3D_V10_LAYOUT: "C3D v1.0 (5-D)"}


@dataclass
class RawBlob:
    """A BlobProto as stored: its dims, whether they are legacy, and its values (1-D).

    Legacy dims are BVLC's 4 (num, channels, height, width) or C3D v1.0's 5 (num, channels,
    length, height, width)."""

    dims: tuple[int, ...]
    legacy: bool
    values: np.ndarray

    @property
    def count(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64)) if self.dims else 1

    def shape_equals(self, target: Sequence[int]) -> bool:
        """Caffe's Blob::ShapeEquals(proto) for a target blob of shape ``target``."""
        target = tuple(int(d) for d in target)
        if self.legacy:
            axes = len(self.dims)
            return len(target) <= axes and (1,) * (axes - len(target)) + target == self.dims
        return target == self.dims


_LEGACY_FIELDS = (1, 2, 3, 4)  # num, channels, height, width
_C3D_LEGACY = (1, 2, 3, 4, 5)  # num, channels, length, height, width


def blob_layout(scan: Scanner, start: int, end: int) -> str:
    """``"c3d-v1.0"`` when the BlobProto at ``[start, end)`` has a varint field 5 (C3D's
    width; BVLC's 5 is always the packed or fixed32 ``data``), else ``"bvlc"`` (also for
    bytes that do not parse: reading them as BVLC's then names the fault)."""
    try:
        fields = scan.fields(start, end)
    except WireError:
        return BVLC_LAYOUT
    for field in fields:
        if field.number == 5:
            return C3D_V10_LAYOUT if field.wire == VARINT else BVLC_LAYOUT
    return BVLC_LAYOUT


def read_blob(scan: Scanner, start: int, end: int, layout: str | None = None) -> RawBlob:
    """Parse the BlobProto at ``[start, end)`` of the file (Caffe's Blob::FromProto reading),
    in ``layout`` (``"bvlc"`` or ``"c3d-v1.0"``; ``None``: the one its bytes have). A blob
    whose bytes have another layout than ``layout`` raises :class:`LayoutError`."""
    found = blob_layout(scan, start, end)
    if layout is not None and found != layout:
        raise LayoutError(found, layout)
    if found == C3D_V10_LAYOUT:
        return _read_c3d_v10(scan, start, end)
    return _read_bvlc(scan, start, end)


def _read_c3d_v10(scan: Scanner, start: int, end: int) -> RawBlob:
    """C3D v1.0's BlobProto: five legacy dims (1-5), packed float data (6), diff (7)."""
    dims = dict.fromkeys(_C3D_LEGACY, 0)
    chunks: list[np.ndarray] = []
    for field in scan.fields(start, end):
        if field.number in _C3D_LEGACY and field.wire == VARINT:
            dims[field.number] = signed(field.value)
        elif field.number == 6 and field.wire == LEN:
            chunks.append(scan.floats(field, "<f4"))
        elif field.number == 6:
            raise WireError(f"C3D v1.0 BlobProto with unpacked data at byte {start}")
    values = chunks[0] if len(chunks) == 1 else np.concatenate(chunks or [np.empty(0, "<f4")])
    return RawBlob(tuple(dims.values()), True, values)


def _read_bvlc(scan: Scanner, start: int, end: int) -> RawBlob:
    legacy = {}
    dims: list[int] = []
    data: list[np.ndarray] = []
    double: list[np.ndarray] = []
    for field in scan.fields(start, end):
        if field.number in _LEGACY_FIELDS and field.wire == VARINT:
            legacy[field.number] = signed(field.value)
        elif field.number == 7 and field.wire == LEN:  # repeats merge, as protobuf's do
            dims += _shape_dims(scan, field)
        elif field.number in (5, 8) and field.wire == LEN:
            (data if field.number == 5 else double).append(
                scan.floats(field, "<f4" if field.number == 5 else "<f8")
            )
        elif field.number in (5, 8):
            return _read_unpacked(scan, start, end)
    if legacy:
        shape = tuple(legacy.get(n, 0) for n in _LEGACY_FIELDS)
    else:
        shape = tuple(dims)
    chunks = double if any(len(c) for c in double) else data
    values = chunks[0] if len(chunks) == 1 else np.concatenate(chunks or [np.empty(0, "<f4")])
    return RawBlob(shape, bool(legacy), values)


def _shape_dims(scan: Scanner, field: Field) -> list[int]:
    dims = []
    for dim in scan.fields(field.offset, field.offset + field.length):
        if dim.number != 1:
            continue
        if dim.wire == VARINT:
            dims.append(signed(dim.value))
        elif dim.wire == LEN:
            packed = scan.read(dim.offset, dim.length)
            pos = 0
            while pos < len(packed):
                value, pos = decode_varint(packed, pos)
                dims.append(signed(value))
    return dims


def _read_unpacked(scan: Scanner, start: int, end: int) -> RawBlob:
    """Values written one field each (legal protobuf, never written by Caffe): let protobuf
    parse this one blob."""
    proto = caffe_pb2.BlobProto()
    try:
        proto.ParseFromString(scan.read(start, end - start))
    except DecodeError as err:
        raise WireError(f"corrupt BlobProto at byte {start} ({err})") from None
    legacy = any(proto.HasField(f) for f in ("num", "channels", "height", "width"))
    dims = (proto.num, proto.channels, proto.height, proto.width) if legacy else proto.shape.dim
    if len(proto.double_data):
        values = np.asarray(proto.double_data, dtype="<f8")
    else:
        values = np.asarray(proto.data, dtype="<f4")
    return RawBlob(tuple(int(d) for d in dims), legacy, values)


def blob_body_size(shape: Sequence[int]) -> int:
    """Bytes of the BlobProto body Caffe writes for a float blob of ``shape``."""
    return len(_shape_field(shape)) + _data_header_size(shape) + 4 * _count(shape)


def blob_pieces(array: np.ndarray) -> list[bytes | memoryview]:
    """Caffe's Blob<float>::ToProto(write_diff=false) body, as pieces to write in order."""
    values = np.asarray(array, dtype="<f4", order="C")  # ascontiguousarray makes 0-d 1-d
    pieces: list[bytes | memoryview] = []
    if values.size:
        pieces += [tag(5, LEN) + encode_varint(values.nbytes), memoryview(values).cast("B")]
    pieces.append(_shape_field(values.shape))
    return pieces


def _count(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


def _data_header_size(shape: Sequence[int]) -> int:
    count = _count(shape)
    return len(tag(5, LEN) + encode_varint(4 * count)) if count else 0


def _shape_field(shape: Sequence[int]) -> bytes:
    if not len(shape):
        return b""
    dims = b"".join(encode_varint(int(d)) for d in shape)
    body = tag(1, LEN) + encode_varint(len(dims)) + dims
    return tag(7, LEN) + encode_varint(len(body)) + body
