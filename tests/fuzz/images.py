"""Encoded images whose headers promise what their bytes do not: sides of 0, 1, 2^16, 10^5,
2^31, negative heights, declared sizes far beyond the data, truncated streams, formats
OpenCV does not read. Each is a few hundred bytes; a reader that trusts the header allocates
gigabytes."""

from __future__ import annotations

import io
import random
import struct
import zlib

import numpy as np
from PIL import Image

from tests.fuzz.mutate import mutate_bytes

SIDES = [0, 1, 7, 8, 255, 4096, 16384, 65535, 65536, 100000, 1 << 20, (1 << 20) + 1,
         2**31 - 1, 2**31, 2**32 - 1]  # fmt: skip


def _side(rng: random.Random, limit: int) -> int:
    return min(rng.choice(SIDES), limit)


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png(rng: random.Random) -> bytes:
    width, height = _side(rng, 2**32 - 1), _side(rng, 2**32 - 1)
    depth, color = rng.choice([(8, 2), (8, 0), (16, 2), (8, 6), (1, 0), (8, 3), (16, 6)])
    header = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, rng.choice([0, 1]))
    body = zlib.compress(b"\0" * rng.choice([0, 16, 4096]))
    chunks = [_chunk(b"IHDR", header)]
    if color == 3:
        chunks.append(_chunk(b"PLTE", b"\0\0\0" * 4))
    chunks += [_chunk(b"IDAT", body), _chunk(b"IEND", b"")]
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunks)


def bmp(rng: random.Random) -> bytes:
    width = _side(rng, 2**31 - 1)
    height = _side(rng, 2**31 - 1) * rng.choice([1, -1])
    bits = rng.choice([1, 8, 24, 32])
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, bits, 0, 0, 0, 0, 0, 0)
    palette = b"\0" * (4 * 2**bits) if bits <= 8 else b""
    offset = 14 + len(info) + len(palette)
    return b"BM" + struct.pack("<IHHI", offset + 16, 0, 0, offset) + info + palette + b"\0" * 16


def jpeg(rng: random.Random) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(out, "JPEG")
    data = bytearray(out.getvalue())
    sof = data.find(b"\xff\xc0")
    if sof > 0:
        struct.pack_into(">HH", data, sof + 5, _side(rng, 65535), _side(rng, 65535))
    return bytes(data)


def ppm(rng: random.Random) -> bytes:
    kind = rng.choice([b"P5", b"P6", b"P2", b"P3", b"P4"])
    sides = b"%d %d" % (_side(rng, 2**40), _side(rng, 2**40))
    return kind + b"\n" + sides + b"\n" + rng.choice([b"255", b"65535", b"0"]) + b"\n" + b"\0" * 64


def tiff(rng: random.Random) -> bytes:
    entries = [
        (256, 4, _side(rng, 2**32 - 1)),
        (257, 4, _side(rng, 2**32 - 1)),
        (258, 3, 8),
        (259, 3, 1),
        (262, 3, 2),
        (273, 4, 8),
        (277, 3, 3),
        (278, 4, 1),
        (279, 4, 16),
    ]
    ifd = struct.pack("<H", len(entries))
    for tag, kind, value in entries:
        ifd += struct.pack("<HHI", tag, kind, 1) + struct.pack("<I", value)
    return b"II*\0" + struct.pack("<I", 8) + ifd + b"\0\0\0\0" + b"\0" * 16


def valid(rng: random.Random) -> bytes:
    side = rng.choice([1, 4, 8, 16])
    pixels = np.asarray([[rng.randrange(256)] * 3] * side * side, np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.reshape(side, side, 3)).save(out, rng.choice(["PNG", "JPEG", "BMP"]))
    return out.getvalue()


def other_format(rng: random.Random) -> bytes:
    """Formats Pillow reads and OpenCV does not (Caffe refuses them)."""
    out = io.BytesIO()
    image = Image.fromarray(np.zeros((4, 4, 3), np.uint8))
    image.save(out, rng.choice(["GIF", "TGA", "ICO", "PCX", "IM"]))
    return out.getvalue()


MAKERS = [png, png, bmp, jpeg, ppm, tiff, valid, valid, other_format]


def hostile_image(rng: random.Random) -> bytes:
    """One encoded image, sometimes with a few bytes changed after its header was set."""
    data = rng.choice(MAKERS)(rng)
    if rng.random() < 0.25:
        data = mutate_bytes(rng, data, 1)
    return data
