"""Caffe's Datum records and BlobProto (``.binaryproto``) files as numpy arrays.

A Datum holds one item of an LMDB/LevelDB data set: ``channels``, ``height``, ``width``, an
integer ``label`` and the pixels, either as raw uint8 bytes in C×H×W order (``data``), as
``float_data`` (used only when ``data`` is empty, as Caffe's DataTransformer does), or, with
``encoded`` set, as a whole JPEG/PNG file in ``data`` (then channels/height/width are unset and
the image is decoded to BGR, see :mod:`.image`). ``boost`` is the MyCaffe extension that marks
a record for image boosting (see :mod:`.sampling`).

A BlobProto gives its dimensions either as the legacy ``num/channels/height/width`` (what
``compute_image_mean`` writes) or as ``shape``; values are ``data`` (float) or ``double_data``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.transform.image import decode_image
from caffe2jax.runtime.formats.atomic import atomic_write


def parse_datum(value: bytes, *, where: str = "Datum") -> caffe_pb2.Datum:
    """Parse a serialised Datum; ``where`` names the file and record in the error."""
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(value)
    except DecodeError as err:
        raise DataError(f"{where}: corrupt Datum ({err})") from err
    return datum


def datum_to_array(
    datum: caffe_pb2.Datum, *, mode: str = "native", where: str = "Datum"
) -> np.ndarray:
    """The pixels of a Datum as C×H×W: uint8 for ``data`` and encoded images, float32 for
    ``float_data``. ``mode`` ("native", "color", "gray") applies to encoded images only:
    Caffe decodes natively unless ``force_color``/``force_gray`` is set."""
    if datum.encoded:
        return decode_image(datum.data, mode, name=where)
    shape = (datum.channels, datum.height, datum.width)
    count = int(np.prod(shape))
    if min(shape) <= 0:
        raise DataError(f"{where}: Datum has no shape (channels/height/width {shape})")
    if datum.data:
        if len(datum.data) != count:
            raise DataError(
                f"{where}: Datum data holds {len(datum.data)} bytes, {shape} needs {count}"
            )
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(shape)
    if len(datum.float_data) != count:
        raise DataError(
            f"{where}: Datum float_data holds {len(datum.float_data)} values, {shape} needs {count}"
        )
    return np.asarray(datum.float_data, dtype=np.float32).reshape(shape)


def array_to_datum(array: np.ndarray, label: int = 0, *, boost: int = 0) -> caffe_pb2.Datum:
    """A Datum from a C×H×W (or H×W) array: uint8 goes to ``data`` (Caffe's ``CVMatToDatum``),
    anything else to ``float_data`` as float32."""
    arr = np.asarray(array)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise ValueError(f"a Datum holds a C×H×W array, got shape {arr.shape}")
    datum = caffe_pb2.Datum(channels=arr.shape[0], height=arr.shape[1], width=arr.shape[2])
    datum.label = int(label)
    if arr.dtype == np.uint8:
        datum.data = np.ascontiguousarray(arr).tobytes()
    else:
        datum.float_data.extend(arr.astype(np.float32).ravel().tolist())
    if boost:
        datum.boost = int(boost)
    return datum


def encoded_datum(data: bytes, label: int = 0, *, boost: int = 0) -> caffe_pb2.Datum:
    """Caffe's ``ReadFileToDatum``: the encoded file's bytes as they are, ``encoded`` set."""
    datum = caffe_pb2.Datum(data=data, label=int(label), encoded=True)
    if boost:
        datum.boost = int(boost)
    return datum


def blobproto_to_array(blob: caffe_pb2.BlobProto, *, where: str = "BlobProto") -> np.ndarray:
    """A BlobProto's values (``double_data`` if present, else ``data``) as float32 in its
    shape: the legacy 4-D num/channels/height/width when any of them is set, else ``shape``."""
    legacy = blob.HasField("num") or blob.HasField("channels")
    legacy = legacy or blob.HasField("height") or blob.HasField("width")
    if legacy:
        shape: tuple[int, ...] = (blob.num, blob.channels, blob.height, blob.width)
    else:
        shape = tuple(int(d) for d in blob.shape.dim)
    if any(d < 0 for d in shape):  # Blob::Reshape: CHECK_GE(shape[i], 0)
        raise DataError(f"{where}: blob shape {list(shape)[:8]} has a negative dimension")
    values = blob.double_data if len(blob.double_data) else blob.data
    count = int(np.prod(shape)) if shape else 1
    if len(values) != count:
        raise DataError(f"{where}: blob of shape {shape} holds {len(values)} values, not {count}")
    return np.asarray(values, dtype=np.float32).reshape(shape)


def array_to_blobproto(array: np.ndarray, *, legacy: bool | None = None) -> caffe_pb2.BlobProto:
    """A BlobProto holding ``array`` as float ``data``. ``legacy`` writes num/channels/height/
    width (arrays of up to 4 axes, padded with leading 1s like Caffe's LegacyShape); the default
    is legacy for 4-D arrays (the mean-file convention) and ``shape`` otherwise."""
    arr = np.asarray(array, dtype=np.float32)
    if legacy is None:
        legacy = arr.ndim == 4
    blob = caffe_pb2.BlobProto()
    if legacy:
        if arr.ndim > 4:
            raise ValueError(f"the legacy BlobProto form holds at most 4 axes, not {arr.ndim}")
        blob.num, blob.channels, blob.height, blob.width = (1,) * (4 - arr.ndim) + arr.shape
    else:
        blob.shape.dim.extend(arr.shape)
    blob.data.extend(arr.ravel().tolist())
    return blob


def read_blobproto(path: str | Path) -> np.ndarray:
    """Read a ``.binaryproto`` file (e.g. a mean file) as a float32 array in its own shape
    (mean files are (1, C, H, W))."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise DataError(f"{path}: cannot read BlobProto ({err.strerror})") from err
    blob = caffe_pb2.BlobProto()
    try:
        blob.ParseFromString(data)
    except DecodeError as err:
        raise DataError(f"{path}: not a BlobProto ({err})") from err
    return blobproto_to_array(blob, where=str(path))


def write_blobproto(path: str | Path, array: np.ndarray, *, legacy: bool | None = None) -> None:
    """Write ``array`` as a ``.binaryproto`` file, atomically (see :func:`array_to_blobproto`
    for ``legacy``)."""
    atomic_write(path, array_to_blobproto(array, legacy=legacy).SerializeToString())
