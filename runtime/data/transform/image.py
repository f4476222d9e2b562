"""Image decoding, encoding and resizing the way Caffe does it through OpenCV.

Caffe holds images as OpenCV does: 8-bit, channels in **BGR** order, and hands them to the net
as C×H×W. Decoding uses OpenCV itself (``cv2.imdecode``, the call Caffe makes; it releases the
GIL, so the pipeline's worker threads decode in parallel) when ``opencv-python-headless`` is
installed, else Pillow, reproducing ``cv::imdecode``; ``CAFFE2JAX_IMAGE_DECODER=pil|cv2``
chooses. Both give the same pixels for JPEG (libjpeg-turbo's default IDCT) and PNG:

* ``native`` (``IMREAD_ANYCOLOR``, Caffe's ``DecodeDatumToCVMatNative``): gray stays 1 channel,
  everything else becomes 3-channel BGR; alpha is dropped, never blended.
* ``color`` (``IMREAD_COLOR``): always 3-channel BGR, gray replicated.
* ``gray`` (``IMREAD_GRAYSCALE``): 1 channel. JPEGs are decoded to luma by libjpeg as OpenCV
  does; other images use OpenCV's ``BGR2GRAY`` fixed-point weights. Expect at most ±1 against
  OpenCV where its decoders convert internally (Pillow fallback).
* 16-bit images are reduced to 8 bits by dropping the low byte, as OpenCV's decoders do.
* A JPEG's EXIF orientation is applied, as OpenCV ≥ 3.1 (and Caffe built on it) does.

Every image's header is checked before it is decoded (:mod:`.image_header`): one over the
pixel limit is refused with one line naming it.

``resize`` (``INTER_LINEAR``, Caffe's ``ReadImageToCVMat`` with ``new_height``/``new_width``)
and ``resize_nearest`` (``INTER_NEAREST``, the forks' label maps) are ``cv2.resize`` itself,
whichever library decodes. OpenCV 4 and 5 both work: only ``imdecode``, ``resize`` and their
flags are called, never ``cv2.dnn`` (tests/runtime/data/test_image.py).
"""

from __future__ import annotations

import functools
import io
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from caffe2jax.frontend import environment
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.transform.guards import check_resize
from caffe2jax.runtime.data.transform.image_header import check_image_size

MODES = ("native", "color", "gray")
_GRAY_MODES = {"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}
_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "bmp": "BMP", "tif": "TIFF"}


def _to_uint8(arr: np.ndarray) -> np.ndarray:
    """Deep images to 8 bits as OpenCV does (16-bit: high byte)."""
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if np.issubdtype(arr.dtype, np.integer):
        return np.clip(arr.astype(np.int64) >> 8, 0, 255).astype(np.uint8)
    return np.clip(np.rint(arr), 0, 255).astype(np.uint8)


def bgr_to_gray(bgr: np.ndarray) -> np.ndarray:
    """OpenCV 4's ``cvtColor(BGR2GRAY)`` on uint8 C×H×W: (9798 R + 19235 G + 3735 B + 2^14) >> 15
    (OpenCV 2/3 used 14-bit weights, which differ by at most 1)."""
    b, g, r = (bgr[i].astype(np.int32) for i in range(3))
    return ((r * 9798 + g * 19235 + b * 3735 + (1 << 14)) >> 15).astype(np.uint8)[None]


def _pil_to_chw(im: Image.Image, mode: str) -> np.ndarray:
    """A loaded Pillow image as uint8 C×H×W BGR (or 1-channel gray) for ``mode``."""
    if im.mode in _GRAY_MODES:
        gray = _to_uint8(np.asarray(im.convert("L") if im.mode in ("LA", "La") else im))
        if gray.ndim == 3:  # some Pillow modes keep a trailing channel axis
            gray = gray[..., 0]
        chw = gray[None]
        return np.repeat(chw, 3, axis=0) if mode == "color" else chw
    rgb = np.asarray(im.convert("RGB"), dtype=np.uint8)
    bgr = np.ascontiguousarray(rgb[..., ::-1].transpose(2, 0, 1))
    return bgr_to_gray(bgr) if mode == "gray" else bgr


@functools.cache
def _cv2():
    """OpenCV's module when it decodes (installed, not turned off), else None."""
    choice = environment.value("CAFFE2JAX_IMAGE_DECODER").lower()
    if choice not in ("", "cv2", "pil"):
        raise DataError(f"CAFFE2JAX_IMAGE_DECODER={choice!r}: use cv2 or pil")
    if choice == "pil":
        return None
    try:
        import cv2
    except ImportError:
        if choice == "cv2":
            raise DataError("CAFFE2JAX_IMAGE_DECODER=cv2 needs opencv-python-headless") from None
        return None
    return cv2


def decoder_name() -> str:
    """The library images are decoded with: "cv2" or "pil"."""
    return "pil" if _cv2() is None else "cv2"


def _decode_cv2(cv2, data: bytes, mode: str, name: str) -> np.ndarray:
    flag = {"native": cv2.IMREAD_ANYCOLOR, "color": cv2.IMREAD_COLOR,
            "gray": cv2.IMREAD_GRAYSCALE}[mode]  # fmt: skip
    try:
        hwc = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    except cv2.error as err:
        raise DataError(f"{name}: could not decode image ({str(err).strip()[:120]})") from None
    if hwc is None:
        raise DataError(f"{name}: could not decode image (not an image OpenCV reads)")
    return hwc[None] if hwc.ndim == 2 else hwc.transpose(2, 0, 1)


def _decode_pil(data: bytes, mode: str, name: str) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                if mode == "gray" and im.format == "JPEG":
                    im.draft("L", im.size)  # libjpeg decodes straight to luma, as OpenCV does
                im.load()
                if im.format == "JPEG" and im.getexif().get(0x0112, 1) != 1:
                    im = ImageOps.exif_transpose(im)
                return _pil_to_chw(im, mode)
    except Image.DecompressionBombError as err:
        raise DataError(f"{name}: image too large to decode ({err})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise DataError(f"{name}: could not decode image ({err})") from err


def decode_image(data: bytes, mode: str = "native", *, name: str = "image") -> np.ndarray:
    """Decode an encoded image (JPEG, PNG, BMP, …) like ``cv::imdecode``; see the module doc
    for ``mode``. Returns uint8 C×H×W (a view of OpenCV's H×W×C array: not contiguous);
    raises DataError naming ``name`` when it cannot, or when its header claims more pixels
    than the limit (checked before anything is allocated)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    check_image_size(data, name)
    cv2 = _cv2()
    return _decode_pil(data, mode, name) if cv2 is None else _decode_cv2(cv2, data, mode, name)


def read_image(
    path: str | Path, *, height: int = 0, width: int = 0, is_color: bool = True
) -> np.ndarray:
    """Caffe's ``ReadImageToCVMat``: read a file in colour or gray, then resize when both
    ``height`` and ``width`` are non-zero. Raises DataError when it cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise DataError(f"{path}: could not open or find file ({err.strerror})") from err
    img = decode_image(data, "color" if is_color else "gray", name=str(path))
    if height > 0 and width > 0:
        check_resize(img.shape[0], img.shape[1], height, width, str(path))
        img = resize(img, height, width)
    return img


def opencv():
    """OpenCV's module (a dependency: resizing is ``cv::resize`` itself, whichever library
    decodes); DataError when it cannot be imported. Only ``imdecode``, ``resize`` and their
    flags are used: calls OpenCV 4 and 5 share, no ``cv2.dnn``."""
    try:
        import cv2
    except ImportError as err:
        raise DataError(f"resizing images needs opencv-python-headless ({err})") from None
    return cv2


def _cv_resize(chw: np.ndarray, height: int, width: int, interpolation: str) -> np.ndarray:
    cv2 = opencv()
    flag = getattr(cv2, interpolation)
    hwc = cv2.resize(np.ascontiguousarray(chw.transpose(1, 2, 0)), (width, height),
                     interpolation=flag)  # fmt: skip
    return hwc[None] if hwc.ndim == 2 else hwc.transpose(2, 0, 1)


def resize(chw: np.ndarray, height: int, width: int) -> np.ndarray:
    """``cv::resize(img, Size(width, height), 0, 0, INTER_LINEAR)`` (Caffe's
    ``ReadImageToCVMat`` with ``new_height``/``new_width``, ``convert_imageset --resize_*``),
    by OpenCV itself. Returns uint8 C×H×W."""
    if chw.shape[1:] == (height, width):
        return chw.copy()
    return _cv_resize(chw, height, width, "INTER_LINEAR")


def resize_nearest(chw: np.ndarray, height: int, width: int) -> np.ndarray:
    """``cv::resize(..., INTER_NEAREST)`` on C×H×W (the forks' label maps: no class is
    blended), by OpenCV itself."""
    if chw.shape[1:] == (height, width):
        return chw.copy()
    return _cv_resize(chw, height, width, "INTER_NEAREST")


def encode_image(chw: np.ndarray, ext: str) -> bytes:
    """``cv::imencode('.'+ext, …)`` for a uint8 C×H×W BGR or gray image (JPEG quality 95,
    OpenCV's default)."""
    fmt = _FORMATS.get(ext.lower())
    if fmt is None:
        raise DataError(f"cannot encode images as {ext!r} (supported: {', '.join(_FORMATS)})")
    hwc = np.ascontiguousarray(chw.transpose(1, 2, 0))
    im = Image.fromarray(hwc[..., 0] if hwc.shape[2] == 1 else hwc[..., ::-1].copy())
    out = io.BytesIO()
    im.save(out, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return out.getvalue()
