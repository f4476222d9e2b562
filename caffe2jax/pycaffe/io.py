"""pycaffe's ``caffe.io``: Datum and BlobProto ↔ numpy, image loading, ``oversample``, and
the input ``Transformer`` that deploy scripts use.

The BlobProto and Datum functions keep pycaffe's signatures: ``blobproto_to_array(blob,
return_diff=False)``, ``array_to_blobproto(arr, diff=None)`` (``shape`` form), a count that
does not fit the shape raises ``ValueError``; ``array_to_datum(arr, label=None)`` sets the
label only when one is given and takes C×H×W arrays only.

``Transformer`` reproduces pycaffe's preprocessing order: resize to the input's spatial size,
transpose, channel swap, raw scale, mean subtraction, input scale (and ``deprocess`` undoes it).
Images load as float32 H×W×C RGB in [0, 1], as pycaffe's ``load_image`` returns them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.ndimage import zoom

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.pycaffe.resize import resize
from caffe2jax.runtime.data.records import datum as _datum
from caffe2jax.runtime.data.records.datum import (
    encoded_datum,
    parse_datum,
    read_blobproto,
    write_blobproto,
)
from caffe2jax.runtime.data.transform.guards import open_image

__all__ = [
    "Transformer",
    "array_to_blobproto",
    "array_to_datum",
    "arraylist_to_blobprotovecor_str",
    "arraylist_to_blobprotovector_str",
    "blobproto_to_array",
    "blobprotovector_str_to_arraylist",
    "datum_to_array",
    "encoded_datum",
    "load_image",
    "oversample",
    "parse_datum",
    "read_blobproto",
    "resize",
    "resize_image",
    "write_blobproto",
    "zoom",
]


def blobproto_to_array(blob: caffe_pb2.BlobProto, return_diff: bool = False) -> np.ndarray:
    """A BlobProto's data (or its diff) as a float64 array in the blob's shape (legacy
    num/channels/height/width when set); a value count that does not fit raises ValueError."""
    if return_diff:
        as_data = caffe_pb2.BlobProto()
        as_data.CopyFrom(blob)
        for name in ("data", "double_data", "diff", "double_diff"):
            as_data.ClearField(name)
        as_data.double_data.extend(blob.double_diff)
        as_data.data.extend(blob.diff)
        blob = as_data
    try:
        return _datum.blobproto_to_array(blob).astype(np.float64)
    except DataError as err:
        raise BlobProtoError(str(err)) from None


class BlobProtoError(DataError, ValueError):
    """A BlobProto whose values do not fill its shape: pycaffe's ValueError, and the
    project's DataError (one line)."""


def array_to_blobproto(arr: np.ndarray, diff: np.ndarray | None = None) -> caffe_pb2.BlobProto:
    """A BlobProto (``shape`` form) holding ``arr`` as data and ``diff`` as diff."""
    arr = np.asarray(arr)
    blob = _datum.array_to_blobproto(arr, legacy=False)
    if diff is not None:
        diff = np.asarray(diff, np.float32)
        if diff.shape != arr.shape:
            raise ValueError(f"diff shape {list(diff.shape)} differs from data {list(arr.shape)}")
        blob.diff.extend(diff.ravel().tolist())
    return blob


def arraylist_to_blobprotovector_str(arraylist: Sequence[np.ndarray]) -> bytes:
    """A serialized BlobProtoVector of the arrays."""
    vec = caffe_pb2.BlobProtoVector()
    vec.blobs.extend(array_to_blobproto(arr) for arr in arraylist)
    return vec.SerializeToString()


#: the SSD-era spelling's sibling: py-faster-rcnn's caffe-fast-rcnn io.py names it so
arraylist_to_blobprotovecor_str = arraylist_to_blobprotovector_str


def blobprotovector_str_to_arraylist(value: bytes) -> list[np.ndarray]:
    """The arrays of a serialized BlobProtoVector."""
    vec = caffe_pb2.BlobProtoVector()
    vec.ParseFromString(value)
    return [blobproto_to_array(blob) for blob in vec.blobs]


def array_to_datum(arr: np.ndarray, label: int | None = None) -> caffe_pb2.Datum:
    """A Datum from a C×H×W array (uint8 → ``data`` bytes, else ``float_data``); the label
    is set only when given."""
    arr = np.asarray(arr)
    if arr.ndim != 3:
        raise ValueError(f"Incorrect array shape: a Datum holds C×H×W, got {list(arr.shape)}")
    datum = _datum.array_to_datum(arr, 0 if label is None else label)
    if label is None:
        datum.ClearField("label")
    return datum


def datum_to_array(datum: caffe_pb2.Datum) -> np.ndarray:
    """A Datum's values as C×H×W: uint8 from ``data``, float64 from ``float_data`` (pycaffe's
    types); an encoded image is decoded (uint8)."""
    array = _datum.datum_to_array(datum)
    return array if array.dtype == np.uint8 else array.astype(np.float64)


def oversample(images: Sequence[np.ndarray], crop_dims: Sequence[int]) -> np.ndarray:
    """The four corner crops and the center crop of each H×W×K image, then the same five
    mirrored left-right: 10·N crops of ``crop_dims`` (height, width), image by image."""
    images = [np.asarray(im) for im in images]
    height, width = images[0].shape[:2]
    ch, cw = int(crop_dims[0]), int(crop_dims[1])
    starts = [(y, x) for y in (0, height - ch) for x in (0, width - cw)]
    starts.append((int(height / 2.0 - ch / 2.0), int(width / 2.0 - cw / 2.0)))
    crops = []
    for im in images:
        five = [im[y : y + ch, x : x + cw, :] for y, x in starts]
        crops += five + [crop[:, ::-1, :] for crop in five]
    return np.stack(crops).astype(np.float32)


#: skimage's rgb2gray weights (ITU-R BT.709), what ``load_image(color=False)`` uses
GRAY_WEIGHTS = np.array([0.2125, 0.7154, 0.0721])


def _pixels(image: Any, color: bool) -> np.ndarray:
    """skimage's ``img_as_float(imread(f, as_gray=not color))`` for a PIL image (float64)."""
    if image.mode in ("L", "I;16", "I", "F") or (image.mode == "1"):
        raw = np.asarray(image)
        top = {"L": 255.0, "1": 1.0, "I;16": 65535.0, "I": 2147483647.0}.get(image.mode, 1.0)
        return raw.astype(np.float64) / top
    if color:
        return np.asarray(image.convert("RGB"), np.float64) / 255.0
    rgba = np.asarray(image.convert("RGBA"), np.float64) / 255.0
    alpha = rgba[:, :, 3:]
    rgb = rgba[:, :, :3] * alpha + (1.0 - alpha)  # rgba2rgb: on a white background
    return rgb @ GRAY_WEIGHTS


def load_image(filename: str | os.PathLike, color: bool = True) -> np.ndarray:
    """pycaffe's load_image: float32 in [0, 1], H×W×3 RGB (a gray file tiled, an alpha channel
    dropped) or, with ``color=False``, H×W×1 gray (skimage's luminance, alpha over white)."""
    try:
        data = Path(filename).read_bytes()
        with open_image(data, str(filename), formats=None) as image:  # its size checked first
            pixels = _pixels(image, color)
    except (OSError, ValueError) as err:
        raise DataError(f"{filename}: cannot read image ({err})") from None
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
        if color:
            pixels = np.tile(pixels, (1, 1, 3))
    return pixels.astype(np.float32)


def resize_image(image: np.ndarray, new_dims: Sequence[int], interp_order: int = 1) -> np.ndarray:
    """pycaffe's resize_image: an H×W×K image to ``new_dims`` (height, width) at spline order
    ``interp_order``, as float32. One or three channels go through :func:`resize` (skimage's)
    on the image scaled to [0, 1] and back (a constant image stays constant); other channel
    counts through ``scipy.ndimage.zoom``."""
    image = np.asarray(image)
    height, width = int(new_dims[0]), int(new_dims[1])
    if image.shape[-1] in (1, 3):
        low, high = image.min(), image.max()
        if high <= low:
            return np.full((height, width, image.shape[-1]), low, np.float32)
        unit = (image - low) / (high - low)
        out = resize(unit, (height, width), order=interp_order) * (high - low) + low
    else:
        scale = tuple(np.array((height, width), float) / np.array(image.shape[:2]))
        out = zoom(image, (*scale, 1), order=interp_order)
    return out.astype(np.float32)


class Transformer:
    """pycaffe's input Transformer: ``preprocess(name, image)`` turns an H×W×K image into the
    net's C×H×W layout (``set_transpose``, ``set_channel_swap``, ``set_raw_scale``,
    ``set_mean``, ``set_input_scale``); ``deprocess`` inverts it."""

    def __init__(self, inputs: dict[str, Sequence[int]]):
        self.inputs = {name: tuple(int(d) for d in shape) for name, shape in inputs.items()}
        self.transpose: dict[str, tuple[int, ...]] = {}
        self.channel_swap: dict[str, tuple[int, ...]] = {}
        self.raw_scale: dict[str, float] = {}
        self.mean: dict[str, np.ndarray] = {}
        self.input_scale: dict[str, float] = {}

    def _check(self, name: str) -> tuple[int, ...]:
        if name not in self.inputs:
            raise DataError(f"{name} is not one of the net inputs: {', '.join(self.inputs)}")
        return self.inputs[name]

    def set_transpose(self, name: str, order: Sequence[int]) -> None:
        shape = self._check(name)
        if len(order) != len(shape) - 1:
            raise DataError(f"transpose order for {name} must have {len(shape) - 1} axes")
        self.transpose[name] = tuple(order)

    def set_channel_swap(self, name: str, order: Sequence[int]) -> None:
        shape = self._check(name)
        if len(order) != shape[1]:
            raise DataError(f"channel swap for {name} needs {shape[1]} channels, got {len(order)}")
        self.channel_swap[name] = tuple(order)

    def set_raw_scale(self, name: str, scale: float) -> None:
        self._check(name)
        self.raw_scale[name] = float(scale)

    def set_input_scale(self, name: str, scale: float) -> None:
        self._check(name)
        self.input_scale[name] = float(scale)

    def set_mean(self, name: str, mean: np.ndarray) -> None:
        """A per-channel mean (K,) or an element-wise K×H×W (or H×W) mean, in the net's
        channel order; an element-wise mean of another size is resized to the input's, as
        pycaffe does (e.g. the 256×256 ImageNet mean for a 227×227 input)."""
        shape = self._check(name)
        mean = np.asarray(mean, np.float32)
        if mean.ndim == 2:
            mean = mean[None]
        if mean.ndim == 1:
            if mean.shape[0] != shape[1]:
                raise DataError(f"mean for {name} needs {shape[1]} channels, got {mean.shape[0]}")
            mean = mean[:, None, None]
        elif mean.ndim != 3 or mean.shape[0] != shape[1]:
            raise DataError(f"mean for {name} must be {list(shape[1:])}, got {list(mean.shape)}")
        elif mean.shape[1:] != tuple(shape[2:]):
            low, high = float(mean.min()), float(mean.max())
            span = (high - low) or 1.0
            unit = resize_image(((mean - low) / span).transpose(1, 2, 0), shape[2:])
            mean = unit.transpose(2, 0, 1) * span + low
        self.mean[name] = mean

    def preprocess(self, name: str, data: np.ndarray) -> np.ndarray:
        """H×W×K image → the net's K×H×W input (pycaffe's order of operations)."""
        shape = self._check(name)
        out = np.asarray(data, np.float32)
        if out.shape[:2] != tuple(shape[2:]):
            out = resize_image(out, shape[2:])
        if name in self.transpose:
            out = out.transpose(self.transpose[name])
        if name in self.channel_swap:
            out = out[list(self.channel_swap[name]), :, :]
        if name in self.raw_scale:
            out = out * self.raw_scale[name]
        if name in self.mean:
            out = out - self.mean[name]
        if name in self.input_scale:
            out = out * self.input_scale[name]
        return out.astype(np.float32)

    def deprocess(self, name: str, data: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`preprocess` (without the resize)."""
        self._check(name)
        out = np.asarray(data, np.float32).squeeze()
        if out.ndim == 2:
            out = out[None]
        if name in self.input_scale:
            out = out / self.input_scale[name]
        if name in self.mean:
            out = out + self.mean[name]
        if name in self.raw_scale:
            out = out / self.raw_scale[name]
        if name in self.channel_swap:
            out = out[np.argsort(self.channel_swap[name]), :, :]
        if name in self.transpose:
            out = out.transpose(np.argsort(self.transpose[name]))
        return out
