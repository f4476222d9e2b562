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

import numpy as np
from PIL import Image

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.records import datum as _datum
from caffe2jax.runtime.data.records.datum import (
    datum_to_array,
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
    "arraylist_to_blobprotovector_str",
    "blobproto_to_array",
    "blobprotovector_str_to_arraylist",
    "datum_to_array",
    "encoded_datum",
    "load_image",
    "oversample",
    "parse_datum",
    "read_blobproto",
    "resize_image",
    "write_blobproto",
]


def blobproto_to_array(blob: caffe_pb2.BlobProto, return_diff: bool = False) -> np.ndarray:
    """A BlobProto's data (or its diff) as an array in the blob's shape (legacy
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
        return _datum.blobproto_to_array(blob)
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


def load_image(filename: str | os.PathLike, color: bool = True) -> np.ndarray:
    """An image as float32 H×W×3 RGB (or H×W×1 gray with ``color=False``) in [0, 1]."""
    try:
        data = Path(filename).read_bytes()
        with open_image(data, str(filename), formats=None) as image:  # its size checked first
            pixels = np.asarray(image.convert("RGB" if color else "L"), np.float32) / 255.0
    except (OSError, ValueError) as err:
        raise DataError(f"{filename}: cannot read image ({err})") from None
    return pixels if color else pixels[:, :, None]


def resize_image(image: np.ndarray, new_dims: Sequence[int], interp_order: int = 1) -> np.ndarray:
    """Resize an H×W×K float image to ``new_dims`` (height, width); bilinear by default,
    nearest with ``interp_order=0``. Values keep their range."""
    height, width = int(new_dims[0]), int(new_dims[1])
    if image.shape[:2] == (height, width):
        return image.astype(np.float32)
    method = Image.NEAREST if interp_order == 0 else Image.BILINEAR
    channels = [
        np.asarray(
            Image.fromarray(image[:, :, k].astype(np.float32), mode="F").resize(
                (width, height), method
            )
        )
        for k in range(image.shape[2])
    ]
    return np.stack(channels, axis=2).astype(np.float32)


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
