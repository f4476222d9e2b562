"""SSD's ``convert_annoset`` tool (weiliu89/caffe tools/convert_annoset.cpp, util/io.cpp):
images and their box annotations into an LMDB/LevelDB of AnnotatedDatum records.

The list file holds whitespace-separated ``image_path annotation_path`` pairs (both read from
``root`` + path). Per pair, as the fork's ``ReadRichImageToAnnotatedDatum``:

* the image is read in colour (gray with ``gray``), resized as ``ReadImageToCVMat`` does
  (``min_dim``/``max_dim``: one scale keeping the aspect ratio, else both ``resize_height``
  and ``resize_width``), stored raw or encoded (the file's own bytes when nothing was resized
  and the extension is the encoding);
* an annotation file that does not exist gives a record without boxes;
* ``xml`` (VOC): ``annotation/size/width|height`` (the image's own size when absent), then
  each ``object``: its ``name`` through the label map (an unknown name is an error, as the
  fork's LOG(FATAL)), ``difficult`` (``1`` is true; it applies to the ``bndbox`` after it, as
  the fork reads the children in order), ``bndbox`` xmin/ymin/xmax/ymax read as integers and
  divided by the width/height;
* ``txt``: ``label xmin ymin xmax ymax`` per line (pixels, divided by the image size).

Boxes outside the image are kept, with a warning. Records are keyed ``"%08d_<image path>"``
by list position; an image that cannot be read is skipped with a warning. ``json`` (the
fork's COCO reader) is not supported. An existing database is never overwritten.
"""

from __future__ import annotations

import logging
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.records.annotated_datum import (
    Boxes,
    annotated_datum,
    name_to_label,
    read_label_map,
)
from caffe2jax.runtime.data.records.datum import array_to_datum, encoded_datum
from caffe2jax.runtime.data.records.db import Writer
from caffe2jax.runtime.data.transform.guards import MAX_PIXELS, MAX_SIDE, check_image_size
from caffe2jax.runtime.data.transform.image import encode_image, read_image, resize
from caffe2jax.runtime.tools.imageset import extension, matches_encoding

log = logging.getLogger(__name__)
LABEL_TYPES = ("xml", "txt")


def read_list(path: Path) -> list[tuple[str, str, int]]:
    """The ``(image, annotation, line)`` pairs of a list file (``infile >> a >> b``)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as err:
        raise DataError(f"{path}: cannot read list file ({err.strerror})") from None
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words:
            continue
        if "\x00" in line:  # no file name holds one (open() would raise ValueError)
            raise DataError(f"{path}:{number}: a NUL byte in the line")
        if len(words) != 2:
            raise DataError(f"{path}:{number}: expected 'image_path annotation_path', got "
                            f"{line.strip()!r}")  # fmt: skip
        pairs.append((words[0], words[1], number))
    if not pairs:
        raise DataError(f"{path}: list file is empty")
    return pairs


def _warn_outside(where: str, box: tuple[float, ...], width: int, height: int) -> None:
    xmin, ymin, xmax, ymax = box
    if min(box) < 0 or xmin > width or xmax > width or ymin > height or ymax > height:
        log.warning("%s: bounding box exceeds image boundary.", where)
    if xmin > xmax or ymin > ymax:
        log.warning("%s: bounding box irregular.", where)


def _int(node: ET.Element | None, where: str) -> int:
    text = (node.text or "").strip() if node is not None else "0"
    try:
        return int(text)
    except ValueError:
        raise DataError(f"{where}: {text!r} is not an integer") from None


def _xml_size(root: ET.Element, path: Path, height: int, width: int) -> tuple[int, int]:
    size = root.find("size")
    if size is not None and size.find("width") is not None and size.find("height") is not None:
        xml_h, xml_w = (
            _int(size.find("height"), f"{path}: size"),
            _int(size.find("width"), f"{path}: size"),
        )
        if xml_h != height:
            log.warning("%s: inconsistent image height.", path)
        if xml_w != width:
            log.warning("%s: inconsistent image width.", path)
        height, width = xml_h, xml_w
    if width <= 0 or height <= 0:
        raise DataError(f"{path}: no valid image width/height")
    return height, width


def read_xml_boxes(path: Path, height: int, width: int, names: dict[str, int]) -> Boxes:
    """The fork's ``ReadXMLToAnnotatedDatum`` (VOC/ILSVRC XML); ``height``/``width``: the
    image's size, used when the file has no ``size``."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as err:
        raise DataError(f"{path}: cannot read annotation XML ({err})") from None
    if root.tag != "annotation":
        raise DataError(f"{path}: root element is <{root.tag}>, not <annotation>")
    height, width = _xml_size(root, path, height, width)
    coords, labels, difficult = [], [], []
    for obj in root.findall("object"):
        label, hard = None, False
        for child in obj:
            if child.tag == "name":
                name = (child.text or "").strip()
                if name not in names:
                    raise DataError(f"{path}: unknown name {name!r} (not in the label map)")
                label = names[name]
            elif child.tag == "difficult":
                hard = (child.text or "").strip() == "1"
            elif child.tag == "bndbox":
                if label is None:
                    raise DataError(f"{path}: an object's bndbox comes before its name")
                box = tuple(_int(child.find(k), f"{path}: bndbox {k}")
                            for k in ("xmin", "ymin", "xmax", "ymax"))  # fmt: skip
                _warn_outside(str(path), box, width, height)
                coords.append((box[0] / width, box[1] / height, box[2] / width, box[3] / height))
                labels.append(label)
                difficult.append(hard)
    return Boxes.of(coords, labels, difficult) if coords else Boxes.empty()


def read_txt_boxes(path: Path, height: int, width: int) -> Boxes:
    """The fork's ``ReadTxtToAnnotatedDatum``: ``label xmin ymin xmax ymax`` per line, in
    pixels; reading stops at the first entry that does not parse, as ``infile >>`` does."""
    try:
        words = path.read_text(encoding="utf-8", errors="replace").split()
    except OSError as err:
        raise DataError(f"{path}: cannot read annotation file ({err.strerror})") from None
    coords, labels = [], []
    for at in range(0, len(words) - 4, 5):
        try:
            label = int(words[at])
            box = tuple(float(w) for w in words[at + 1 : at + 5])
        except ValueError:
            log.warning("%s: stops at word %d (%r is not 'label xmin ymin xmax ymax')", path,
                        at + 1, " ".join(words[at : at + 5]))  # fmt: skip
            break
        if not all(math.isfinite(v) for v in box):
            raise DataError(f"{path}: box {box} is not finite")
        if not -(2**31) <= label < 2**31:  # the fork reads it into an int
            raise DataError(f"{path}: label {label} does not fit in an int")
        _warn_outside(str(path), box, width, height)
        coords.append((box[0] / width, box[1] / height, box[2] / width, box[3] / height))
        labels.append(label)
    return Boxes.of(coords, labels) if coords else Boxes.empty()


def read_scaled_image(path: str, *, height: int, width: int, min_dim: int, max_dim: int,
                      is_color: bool) -> np.ndarray:  # fmt: skip
    """The fork's ``ReadImageToCVMat``: with ``min_dim``/``max_dim``, one scale factor that
    lifts the short side to ``min_dim`` then caps the long side at ``max_dim``; else both
    ``height``/``width`` resize. Returns uint8 C×H×W."""
    if min_dim <= 0 and max_dim <= 0:
        return read_image(path, height=height, width=width, is_color=is_color)
    image = read_image(path, is_color=is_color)
    short, long = min(image.shape[1:]), max(image.shape[1:])
    scale = np.float32(1)
    if min_dim > 0 and short < min_dim:
        scale = np.float32(min_dim) / np.float32(short)
    if max_dim > 0 and int(scale * np.float32(long)) > max_dim:
        scale = np.float32(max_dim) / np.float32(long)
    if scale == 1:
        return image
    new_h = int(round(float(image.shape[1]) * float(scale)))  # cv::resize's Size from fx/fy
    new_w = int(round(float(image.shape[2]) * float(scale)))
    if min(new_h, new_w) < 1:  # cv::resize asserts on an empty size
        raise DataError(f"{path}: scaling {image.shape[1]}×{image.shape[2]} by "
                        f"{float(scale):g} (min_dim {min_dim}, max_dim {max_dim}) leaves "
                        f"{new_h}×{new_w}")  # fmt: skip
    check_image_size((new_w, new_h), image.shape[0], f"{path} scaled to {new_h}×{new_w}")
    return resize(image, new_h, new_w)


def check_sizes(resize_height: int, resize_width: int, min_dim: int, max_dim: int) -> None:
    """Sizes no image can be resized to (OpenCV's limits: sides <= 2^20, <= 2^30 pixels),
    refused before any image is read: ``--min_dim`` lifts the short side, so the image has at
    least ``min_dim²`` pixels."""
    if max(resize_height, resize_width, min_dim, max_dim) > MAX_SIDE:
        raise DataError(f"--resize_height/--resize_width/--min_dim/--max_dim must be at most "
                        f"{MAX_SIDE} (OpenCV's largest side)")  # fmt: skip
    if resize_height * resize_width > MAX_PIXELS or min_dim * min_dim > MAX_PIXELS:
        raise DataError(f"--resize_height × --resize_width (or --min_dim²) is more than the "
                        f"{MAX_PIXELS} pixels OpenCV makes an image of; lower them")  # fmt: skip


def _datum(image: np.ndarray, path: str, encoding: str, resized: bool) -> caffe_pb2.Datum:
    if not encoding:
        return array_to_datum(image)
    if not resized and matches_encoding(path, encoding):
        datum = encoded_datum(Path(path).read_bytes())
    else:
        datum = encoded_datum(encode_image(image, encoding))
    datum.channels, datum.height, datum.width = image.shape
    return datum


def _boxes(label_path: Path, label_type: str, size: tuple[int, int],
           names: dict[str, int]) -> Boxes:  # fmt: skip
    if not label_path.exists():
        return Boxes.empty()
    if label_type == "xml":
        return read_xml_boxes(label_path, *size, names)
    return read_txt_boxes(label_path, *size)


def convert_annoset(
    root: str | Path,
    listfile: str | Path,
    db_path: str | Path,
    *,
    label_type: str = "xml",
    label_map_file: str | Path | None = None,
    check_label: bool = False,
    resize_height: int = 0,
    resize_width: int = 0,
    min_dim: int = 0,
    max_dim: int = 0,
    gray: bool = False,
    shuffle: bool = False,
    encoded: bool = False,
    encode_type: str = "",
    backend: str = "lmdb",
    check_size: bool = False,
    seed: int | None = None,
) -> int:
    """Convert the (image, annotation) pairs of ``listfile`` into a new database of BBOX
    AnnotatedDatum records at ``db_path``; returns the number written (see the module doc).
    ``seed`` fixes the ``shuffle`` order."""
    if label_type not in LABEL_TYPES:
        raise DataError(f"label_type {label_type!r} is not supported ({', '.join(LABEL_TYPES)})")
    names: dict[str, int] = {}
    if label_type == "xml":
        if not label_map_file:
            raise DataError("label_type xml needs a label map file (--label_map_file)")
        names = name_to_label(read_label_map(label_map_file), strict=check_label,
                              where=str(label_map_file))  # fmt: skip
    check_sizes(resize_height, resize_width, min_dim, max_dim)
    pairs = read_list(Path(listfile))
    if shuffle:
        pairs = [pairs[i] for i in np.random.default_rng(seed).permutation(len(pairs))]
    if encode_type and not encoded:
        log.info("encode_type specified, assuming encoded=true.")
    resized = bool(min_dim > 0 or max_dim > 0 or (resize_height > 0 and resize_width > 0))
    expected = None
    with Writer(db_path, backend) as writer:
        for line_id, (image_path, label_path, number) in enumerate(pairs):
            encoding = encode_type or (extension(image_path) if encoded else "")
            if encoded and not encoding:
                raise DataError(f"{listfile}:{number}: cannot guess the encoding of "
                                f"{image_path!r}")  # fmt: skip
            path = f"{root}{image_path}"
            try:
                original = read_image(path, is_color=not gray)
                image = read_scaled_image(path, height=resize_height, width=resize_width,
                                          min_dim=min_dim, max_dim=max_dim,
                                          is_color=not gray) if resized else original  # fmt: skip
            except DataError as err:
                log.warning("Failed to read %s (%s:%d): %s", image_path, listfile, number, err)
                continue
            boxes = _boxes(Path(f"{root}{label_path}"), label_type, original.shape[1:], names)
            datum = _datum(image, path, encoding, resized)
            if check_size:
                size = int(np.prod(image.shape))
                expected = expected or size
                if size != expected:
                    raise DataError(f"{listfile}:{number}: {image_path} has {size} values, "
                                    f"the first image {expected} (check_size)")  # fmt: skip
            record = annotated_datum(datum, boxes)
            writer.put(f"{line_id:08d}_{image_path}", record.SerializeToString())
            if writer.count % 1000 == 0:
                log.info("Processed %d files.", writer.count)
    log.info("Processed %d files.", writer.count)
    return writer.count
