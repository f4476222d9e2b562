"""Caffe's dataset tools: ``convert_imageset`` and ``compute_image_mean``.

``convert_imageset`` (tools/convert_imageset.cpp) reads a list of ``path label`` lines, opens
``root + path`` (plain string concatenation: give ``root`` a trailing ``/``), optionally shuffles
the list, and stores one Datum per image under the key ``"%08d_<path>"`` where the number is the
line's position in the (shuffled) list. Images are read in colour (3-channel BGR) unless
``gray``, and resized (OpenCV bilinear) when both resize sizes are non-zero. With ``encoded``
the Datum keeps a compressed image: the file's own bytes when it needs no resize and its
extension matches the encoding (guessed from the extension when ``encode_type`` is empty),
otherwise the image re-encoded. An image that cannot be read is logged and skipped (its key
number is skipped too), as Caffe does. ``check_size`` requires every raw record to have the
first one's size. An existing database is never overwritten.

``compute_image_mean`` (tools/compute_image_mean.cpp) averages every record (encoded ones
decoded natively) and writes a legacy (1, C, H, W) BlobProto; it logs the per-channel means.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.files import parse_list_file
from caffe2jax.runtime.data.records.datum import (
    array_to_datum,
    datum_to_array,
    encoded_datum,
    parse_datum,
    write_blobproto,
)
from caffe2jax.runtime.data.records.db import Writer, open_db
from caffe2jax.runtime.data.transform.image import encode_image, read_image

log = logging.getLogger(__name__)


def extension(name: str) -> str:
    """A file name's extension, lower-cased ("" without one): the encoding an encoded record
    takes when ``encode_type`` is empty, as convert_imageset's ``GetFileExtension``."""
    return name.rsplit(".", 1)[1].lower() if "." in Path(name).name else ""


def matches_encoding(name: str, encoding: str) -> bool:
    """Caffe's ``matchExt``: the file's extension is the encoding (jpeg counts as jpg)."""
    ext, enc = extension(name), encoding.lower()
    return ext == enc or (enc == "jpg" and ext == "jpeg")


def image_to_datum(
    path: str,
    label: int,
    *,
    height: int = 0,
    width: int = 0,
    is_color: bool = True,
    encoding: str = "",
) -> caffe_pb2.Datum:
    """Caffe's ``ReadImageToDatum``: a raw or (with ``encoding``) encoded Datum of an image."""
    image = read_image(path, height=height, width=width, is_color=is_color)
    if not encoding:
        return array_to_datum(image, label)
    if not height and not width and matches_encoding(path, encoding):
        return encoded_datum(Path(path).read_bytes(), label)
    return encoded_datum(encode_image(image, encoding), label)


def convert_imageset(
    root: str | Path,
    listfile: str | Path,
    db_path: str | Path,
    *,
    resize_height: int = 0,
    resize_width: int = 0,
    gray: bool = False,
    shuffle: bool = False,
    encoded: bool = False,
    encode_type: str = "",
    backend: str = "lmdb",
    check_size: bool = False,
    seed: int | None = None,
) -> int:
    """Convert the images of ``listfile`` into a new database at ``db_path``; returns the
    number of records written. ``seed`` fixes the ``shuffle`` order."""
    entries = parse_list_file(Path(listfile))
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(entries))
        entries = [entries[i] for i in order]
    expected_size = None
    with Writer(db_path, backend) as writer:
        for line_id, entry in enumerate(entries):
            encoding = encode_type
            if encoded and not encoding:
                encoding = extension(entry.path)
                if not encoding:
                    raise DataError(
                        f"{listfile}:{entry.line}: cannot guess the encoding of {entry.path!r}"
                    )
            try:
                datum = image_to_datum(
                    f"{root}{entry.path}",
                    entry.label,
                    height=resize_height,
                    width=resize_width,
                    is_color=not gray,
                    encoding=encoding,
                )
            except DataError as err:
                log.warning("skipping %s:%d: %s", listfile, entry.line, err)
                continue
            if check_size and not datum.encoded:
                size = datum.channels * datum.height * datum.width
                expected_size = expected_size or size
                if len(datum.data) != expected_size:
                    raise DataError(
                        f"{listfile}:{entry.line}: {entry.path} has {len(datum.data)} bytes of "
                        f"data, the first image {expected_size} (check_size)"
                    )
            writer.put(f"{line_id:08d}_{entry.path}", datum.SerializeToString())
            if writer.count % 1000 == 0:
                log.info("Processed %d files.", writer.count)
    log.info("Processed %d files.", writer.count)
    return writer.count


def compute_image_mean(
    db_path: str | Path, out_binaryproto: str | Path | None = None, backend: str = "lmdb"
) -> np.ndarray:
    """The mean image of a database as a float32 (1, C, H, W) array, written as a legacy
    BlobProto to ``out_binaryproto`` when given. Sums are exact (Caffe's float32 sums are, up to
    2^24) and divided in float32, as Caffe does."""
    db = open_db(db_path, backend)
    total: np.ndarray | None = None
    count = 0
    try:
        for key, value in db.items():
            where = f"{db.path}: record {key.decode(errors='replace')!r}"
            array = datum_to_array(parse_datum(value, where=where), mode="native", where=where)
            if total is None:
                total = np.zeros(array.shape, np.float64)
            elif array.shape != total.shape:
                raise DataError(f"{where}: shape {array.shape}, the first record {total.shape}")
            total += array
            count += 1
            if count % 10000 == 0:
                log.info("Processed %d files.", count)
    finally:
        db.close()
    if total is None:
        raise DataError(f"{db_path}: database is empty")
    mean = (total.astype(np.float32) / np.float32(count))[None]
    if out_binaryproto is not None:
        write_blobproto(out_binaryproto, mean, legacy=True)
    for channel, value in enumerate(mean[0].mean(axis=(1, 2), dtype=np.float64)):
        log.info("mean_value channel [%d]: %g", channel, value)
    return mean
