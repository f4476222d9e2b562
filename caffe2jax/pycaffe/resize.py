"""``skimage.transform.resize`` as pycaffe's ``caffe.io`` re-exports it (``from
skimage.transform import resize``), written on scipy.ndimage (scikit-image is not a dependency).

It reproduces scikit-image's resize since 0.19 (the release Python 3 pycaffe installs meet):
the image is taken to float (``img_as_float``: an unsigned integer image is divided by its
type's maximum, a signed one by its maximum too; floats are kept) unless ``preserve_range``;
an output shape one axis short keeps the last axis (the channels); when any axis shrinks and
``anti_aliasing`` is not turned off, a Gaussian of sigma ``max(0, (factor − 1) / 2)`` per axis
smooths first; then ``scipy.ndimage.zoom`` with ``grid_mode=True`` (pixel areas aligned: a
sample at output pixel centre ``(i + 0.5)·factor − 0.5``) samples it at ``order`` (default 1,
bilinear; 0 for a bool image); the modes map to ndimage's as skimage maps them (``reflect`` →
``mirror``, ``symmetric`` → ``reflect``, ``edge`` → ``nearest``, ``constant`` → ``grid-constant``,
``wrap`` → ``grid-wrap``); ``clip`` keeps the result in the input's range.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import ndimage

_MODES = {"constant": "grid-constant", "edge": "nearest", "symmetric": "reflect",
          "reflect": "mirror", "wrap": "grid-wrap"}  # fmt: skip


def _as_float(image: np.ndarray, preserve_range: bool) -> np.ndarray:
    """skimage's ``img_as_float`` (or, with ``preserve_range``, the values as floats)."""
    if image.dtype.kind == "f":
        return image
    if preserve_range or image.dtype == bool:
        return image.astype(np.float64)
    if image.dtype.kind == "u":
        return image.astype(np.float64) / np.iinfo(image.dtype).max
    # signed integers: [-max-1, max] onto [-1, 1] as skimage does
    info = np.iinfo(image.dtype)
    return np.maximum(image.astype(np.float64) / info.max, -1.0)


def _clip(image: np.ndarray, out: np.ndarray, mode: str, cval: float) -> None:
    """skimage's _clip_warp_output: ``out`` kept within the input's range; in ``constant``
    mode a cval outside that range stays where it was written."""
    low, high = float(np.min(image)), float(np.max(image))
    keep = out == cval if mode == "constant" and not low <= cval <= high else None
    np.clip(out, low, high, out=out)
    if keep is not None:
        out[keep] = cval


def resize(
    image: np.ndarray,
    output_shape: Sequence[int],
    order: int | None = None,
    mode: str = "reflect",
    cval: float = 0.0,
    clip: bool = True,
    preserve_range: bool = False,
    anti_aliasing: bool | None = None,
    anti_aliasing_sigma: float | Sequence[float] | None = None,
) -> np.ndarray:
    """``image`` resampled to ``output_shape`` (skimage.transform.resize's arguments)."""
    image = np.asarray(image)
    shape = tuple(int(d) for d in output_shape)
    if len(shape) == image.ndim - 1:
        shape += (image.shape[-1],)
    if len(shape) != image.ndim:
        raise ValueError(f"output_shape {list(shape)} does not fit a {image.ndim}-D image")
    if mode not in _MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(_MODES)}")
    is_bool = image.dtype == bool
    order = (0 if is_bool else 1) if order is None else int(order)
    if anti_aliasing is None:
        integer_nearest = image.dtype.kind in "iu" and order == 0
        shrinks = any(o < i for o, i in zip(shape, image.shape))
        anti_aliasing = not is_bool and not integer_nearest and shrinks
    data = source = _as_float(image, preserve_range)
    factors = np.divide(image.shape, shape)
    ndi_mode = _MODES[mode]
    if anti_aliasing:
        sigma = np.maximum(0, (factors - 1) / 2) if anti_aliasing_sigma is None else (
            np.broadcast_to(np.asarray(anti_aliasing_sigma, float), factors.shape))  # fmt: skip
        data = ndimage.gaussian_filter(data, sigma, cval=cval, mode=ndi_mode)
    out = ndimage.zoom(data, [1 / f for f in factors], order=order, mode=ndi_mode, cval=cval,
                       grid_mode=True)  # fmt: skip
    if clip and order != 0:
        _clip(source, out, mode, cval)
    return out
