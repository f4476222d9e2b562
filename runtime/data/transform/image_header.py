"""An encoded image's size from its header, checked before anything is decoded or allocated.

An encoded image names its width and height in its header; a decoder
allocates ``width × height × channels`` bytes from them before it reads a pixel. A corrupt or
hostile record that claims 100000×100000 pixels would ask for 30 GB (OpenCV refuses above
2^30 pixels with a printed error, Pillow raises a DecompressionBombError traceback).
:func:`check_image_size` reads the header and refuses an image over
:func:`max_image_pixels` with one line naming the record or file. The size comes from the
``imagesize`` library (header bytes only, no limit of its own, unlike Pillow's lazy
``Image.open``, which refuses above 179 M pixels before telling the size); formats it does not
know (Sun raster, …) are sized by Pillow's lazy ``Image.open``.
"""

from __future__ import annotations

import io
import warnings

import imagesize

from caffe2jax.frontend import environment
from caffe2jax.frontend.errors import DataError

# 2^28 pixels: 16384 × 16384, 805 MB decoded as BGR; ImageNet's largest image is ~1e8.
DEFAULT_MAX_PIXELS = 1 << 28
_ENV = "CAFFE2JAX_MAX_IMAGE_PIXELS"


def max_image_pixels() -> int:
    """The largest image decoded: ``CAFFE2JAX_MAX_IMAGE_PIXELS`` or 2^28 pixels."""
    text = environment.value(_ENV)
    try:
        return int(text) if text else DEFAULT_MAX_PIXELS
    except ValueError:
        raise DataError(f"{_ENV}={text!r} is not a number of pixels") from None


def header_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from the header of a PNG, JPEG, BMP, GIF, WebP, TIFF, JPEG 2000 or
    Netpbm image (the ``imagesize`` library: it reads the header only, whatever size it
    claims); None otherwise (another format, or a header too short to say)."""
    width, height = imagesize.get(io.BytesIO(data), exif_rotation=False)
    return None if width < 0 or height < 0 else (width, height)


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
