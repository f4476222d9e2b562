"""What a data file's header may make a reader allocate: checked before it is allocated.

An encoded image (in a Datum, or a file an ImageData list names) declares its size in its
header; a few bytes can declare 100000 × 100000 pixels. Caffe decodes through OpenCV, which
refuses sides over 2^20 and more than 2^30 pixels (``CV_IO_MAX_IMAGE_*``); Pillow, which
decodes here, refuses more than twice ``Image.MAX_IMAGE_PIXELS`` (179 M pixels). An image
within both is still refused when decoding it (the pixels, their BGR and float copies) would
not fit in the memory this process may use (:func:`..parallel.memory.memory_budget`), and so
is a resize (``new_height``/``new_width``, ``--resize_*``) whose integer intermediates would
not. Each refusal is one DataError line naming the file or layer, the size and the limit.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import warnings
from collections.abc import Iterator

from PIL import Image

from caffe2jax.frontend.errors import DataError
from caffe2jax.lowering.limits import shape_problem, show_shape
from caffe2jax.runtime.host.memory import gib, memory_budget

# The formats Caffe's OpenCV decodes (imgcodecs), of those Pillow reads; Pillow's other
# plugins (EPS through Ghostscript, PSD, FITS …) are refused as OpenCV refuses them.
OPENCV_FORMATS = ("BMP", "DIB", "JPEG", "JPEG2000", "PNG", "PPM", "SUN", "TIFF", "WEBP")
MAX_SIDE = 1 << 20  # OpenCV's CV_IO_MAX_IMAGE_WIDTH / _HEIGHT
MAX_PIXELS = 1 << 30  # OpenCV's CV_IO_MAX_IMAGE_PIXELS
# Decoding holds the decoded pixels, a 3-channel copy, the C×H×W array and its float batch row.
DECODE_COPIES = 4
# A resize's bytes per output element, an upper bound on cv::resize's working rows and output
# (int64 horizontal sums and two vertical halves, as a fixed-point bilinear resize needs).
RESIZE_BYTES = 8 * 3
# Below this, an image's decoding or resize is not weighed against the memory budget (reading
# the limits costs a few file reads: per image of a 100000-image batch, a slow path).
SMALL = 64 << 20

# Pillow warns between MAX_IMAGE_PIXELS and twice that; the size is checked here instead.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


@contextlib.contextmanager
def open_image(
    data: bytes, name: str, formats: tuple[str, ...] | None = OPENCV_FORMATS
) -> Iterator[Image.Image]:
    """``Image.open`` on encoded bytes (of ``formats``; None: any Pillow reads), its declared
    size checked before any pixel is decoded (raises DataError naming ``name``)."""
    try:
        im = Image.open(io.BytesIO(data), formats=formats)
    except Image.DecompressionBombError as err:
        found = re.search(r"\((\d+) pixels\)", str(err))
        pixels = found.group(1) if found else "too many"
        raise DataError(
            f"{name}: its header declares {pixels} pixels, more than the "
            f"{2 * Image.MAX_IMAGE_PIXELS} the decoder accepts"
        ) from None
    with im:
        check_image_size(im.size, len(im.getbands()), name)
        yield im


def check_image_size(size: tuple[int, int], bands: int, name: str) -> None:
    """An image of ``size`` (width, height) must be one OpenCV would decode and whose
    decoding fits in memory."""
    width, height = size
    if width > MAX_SIDE or height > MAX_SIDE or width * height > MAX_PIXELS:
        raise DataError(
            f"{name}: its header declares {width} x {height} pixels, more than Caffe's "
            f"decoder accepts (OpenCV: sides <= {MAX_SIDE}, <= {MAX_PIXELS} pixels)"
        )
    need = width * height * max(bands, 3) * DECODE_COPIES
    if need <= SMALL:
        return
    budget = memory_budget()
    if need > budget.bytes:
        raise DataError(
            f"{name}: decoding its {width} x {height} image needs {gib(need)}, more than the "
            f"{gib(budget.bytes)} available under {budget.limit}"
        )


def check_resize(channels: int, source_height: int, height: int, width: int, name: str) -> None:
    """A ``cv::resize`` of a ``channels`` × ``source_height`` × … image to ``height`` ×
    ``width`` must fit in memory (its int64 intermediates)."""
    need = channels * (source_height + 2 * height) * width * 8
    if need <= SMALL:
        return
    budget = memory_budget()
    if need > budget.bytes:
        raise DataError(
            f"{name}: resizing to {height} x {width} needs {gib(need)}, more than the "
            f"{gib(budget.bytes)} available under {budget.limit}; lower new_height/new_width"
        )


def check_image_tops(layer: str, batch: int, channels: int, height: int, width: int) -> None:
    """ImageData's ``new_height``/``new_width``: the top they make must be a shape Caffe
    allows, and one image resized to it must fit in memory (checked before the first image
    is read)."""
    shape = (batch, channels, height, width)
    problem = shape_problem(shape)
    if problem:
        raise DataError(f"layer '{layer}': top 'data' {show_shape(shape)} {problem}")
    need = math.prod(shape[1:]) * RESIZE_BYTES
    budget = memory_budget()
    if need > budget.bytes:
        raise DataError(
            f"layer '{layer}': new_height x new_width {height} x {width} needs {gib(need)} per "
            f"image, more than the {gib(budget.bytes)} available under {budget.limit}"
        )
