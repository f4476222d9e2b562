"""An encoded image's size from its header, checked before anything is decoded or allocated.

A PNG, BMP, GIF, WebP or JPEG names its width and height in its first bytes; a decoder
allocates ``width × height × channels`` bytes from them before it reads a pixel. A corrupt or
hostile record that claims 100000×100000 pixels would ask for 30 GB (OpenCV refuses above
2^30 pixels with a printed error, Pillow raises a DecompressionBombError traceback).
:func:`check_image_size` reads the header and refuses an image over
:func:`max_image_pixels` with one line naming the record or file. Formats whose header is
not parsed here (TIFF, …) are sized by Pillow's lazy ``Image.open``, which reads the header
only.
"""

from __future__ import annotations

import io
import struct
import warnings

from caffe2jax.frontend import environment
from caffe2jax.frontend.errors import DataError

# 2^28 pixels: 16384 × 16384, 805 MB decoded as BGR; ImageNet's largest image is ~1e8.
DEFAULT_MAX_PIXELS = 1 << 28
_ENV = "CAFFE2JAX_MAX_IMAGE_PIXELS"
# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic): C0-CF less the
# DHT (C4), JPG (C8) and DAC (CC) markers.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def max_image_pixels() -> int:
    """The largest image decoded: ``CAFFE2JAX_MAX_IMAGE_PIXELS`` or 2^28 pixels."""
    text = environment.value(_ENV)
    try:
        return int(text) if text else DEFAULT_MAX_PIXELS
    except ValueError:
        raise DataError(f"{_ENV}={text!r} is not a number of pixels") from None


def _png(data: bytes) -> tuple[int, int] | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    return None


def _bmp(data: bytes) -> tuple[int, int] | None:
    if data[:2] != b"BM" or len(data) < 26:
        return None
    (header,) = struct.unpack("<I", data[14:18])
    if header == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes
        return struct.unpack("<HH", data[18:22])
    width, height = struct.unpack("<ii", data[18:26])
    return abs(width), abs(height)  # a negative height is a top-down bitmap


def _gif(data: bytes) -> tuple[int, int] | None:
    if data[:4] == b"GIF8" and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    return None


def _webp(data: bytes) -> tuple[int, int] | None:
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP" or len(data) < 30:
        return None
    kind = data[12:16]
    if kind == b"VP8X":
        w, h = int.from_bytes(data[24:27], "little"), int.from_bytes(data[27:30], "little")
        return w + 1, h + 1
    if kind == b"VP8L":
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8 ":
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    return None


def _jpeg(data: bytes) -> tuple[int, int] | None:
    """The frame size of the first SOF marker, walking the segments after SOI."""
    if data[:2] != b"\xff\xd8":
        return None
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # no length field
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if marker in _SOF:
            if pos + 9 > end:
                return None
            height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return width, height
        pos += 2 + length
    return None


def header_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from the header of a PNG, JPEG, BMP, GIF or WebP; None otherwise
    (another format, or a header too short to say)."""
    head = bytes(data[:32])
    for parse in (_png, _bmp, _gif, _webp):
        size = parse(head)
        if size is not None:
            return size
    return _jpeg(data) if head[:2] == b"\xff\xd8" else None


def _pil_size(data: bytes, name: str) -> tuple[int, int] | None:
    """Pillow's header-only size of another format (None when Pillow cannot tell)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                return im.size
    except Image.DecompressionBombError as err:
        raise DataError(f"{name}: image too large to decode ({err})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return None  # the decoder reports it


def check_image_size(data: bytes, name: str) -> tuple[int, int] | None:
    """The image's ``(width, height)`` when its header says; DataError naming ``name`` when
    that is over :func:`max_image_pixels` (or a side is zero)."""
    size = header_size(data)
    if size is None:
        size = _pil_size(data, name)
    if size is None:
        return None
    width, height = size
    limit = max_image_pixels()
    if width * height > limit:
        raise DataError(
            f"{name}: image header claims {width}×{height} pixels, over the limit of {limit} "
            f"(set {_ENV} to decode larger images)"
        )
    if width == 0 or height == 0:
        raise DataError(f"{name}: image header claims {width}×{height} pixels")
    return size
