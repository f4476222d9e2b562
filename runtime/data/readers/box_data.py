"""gklz1982/caffe-yolov2's ``BoxData`` layer (gklz1982/caffe-yolov2@ebb2702:
src/caffe/layers/box_data_layer.cpp, src/caffe/data_transformer.cpp ``Transform(datum, blob,
box_labels)``, tools/convert_box_data.cpp): encoded images with their boxes from an LMDB or
LevelDB of Datum records, read in key order with wrap-around as ``Data`` reads them.

A record is a Datum with ``encoded`` set (the fork CHECKs it) and ``float_data`` holding six
values per box, **(class, difficult, x, y, w, h)**, the box's centre and size normalized to the
image. Tops: ``data`` (N, C, H, W) and one label top per ``data_param.side`` (7 when none is
given; the fork CHECKs as many sides as label tops), each (N, 150): 30 rows of (class, x, y, w,
h), the item's boxes in record order then zeros (``difficult`` is dropped; every label top
holds the same rows, ``side`` only names the grid the loss will use).

TRAIN (the fork's jitter; mirroring is switched off in its code): draw ``scale = 1 − Rand(30)/
100``, a crop ``rand_w = int(W·scale) − 1`` by ``rand_h = int(H·scale) − 1`` at ``rand_x =
Rand(W − rand_w)``, ``rand_y = Rand(H − rand_h)``; a box is kept when its centre pixel
``(int(x·W), int(y·H))`` lies in the crop (half-open), and becomes ``x' = (int(x·W) − rand_x)/
rand_w``, ``w' = int(w·W)/rand_w`` (likewise y, h; not clipped); drawn again until a box is
kept. The crop is resized back to W×H by ``cv::resize`` (bilinear), then mean and scale apply.
TEST: the image as decoded and the record's boxes as they are. Draws come from a generator
keyed by the reader's key and the item's position (worker threads and resumed runs give the
same batches); their distribution is the fork's, not its RNG stream.

Refused (one line naming the layer or record): a record not encoded, without boxes, with
``float_data`` not a multiple of 6, more than 30 boxes (the fork writes past its label), a
negative class, or no box a crop can keep (the fork would draw forever); ``crop_size`` and
``mirror`` (the fork crops and mirrors the image but not its boxes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import Planned, check_phase
from caffe2jax.runtime.data.readers import reader
from caffe2jax.runtime.data.readers.data_layer import DataLayerSource
from caffe2jax.runtime.data.records.datum import datum_to_array, parse_datum
from caffe2jax.runtime.data.records.db import Cursor
from caffe2jax.runtime.data.transform.image import resize

MAX_BOXES = 30
LABEL = MAX_BOXES * 5


def record_boxes(datum: caffe_pb2.Datum, where: str) -> np.ndarray:
    """The record's boxes as an (M, 6) float32 array of (class, difficult, x, y, w, h)."""
    if not datum.encoded:
        raise DataError(f"{where}: BoxData reads encoded images (the fork: 'For box data, "
                        "datum must be encoded')")  # fmt: skip
    values = np.asarray(datum.float_data, np.float32)
    if values.size == 0 or values.size % 6:
        raise DataError(f"{where}: float_data holds {values.size} values; BoxData needs 6 per "
                        "box (class, difficult, x, y, w, h) and at least one box")  # fmt: skip
    boxes = values.reshape(-1, 6)
    if len(boxes) > MAX_BOXES:
        raise DataError(f"{where}: {len(boxes)} boxes; BoxData's label holds {MAX_BOXES}")
    if (boxes[:, 0] < 0).any():
        raise DataError(f"{where}: a negative class label (the fork: 'class_label must >= 0')")
    return boxes


def _pixels(values: np.ndarray, size: int) -> np.ndarray:
    """``static_cast<int>(v * size)`` in float32 (truncation towards zero)."""
    return np.trunc(values * np.float32(size)).astype(np.int64)


def keepable(boxes: np.ndarray, height: int, width: int) -> bool:
    """Whether some crop the fork can draw keeps a box: every crop's union covers pixel
    centres 0 … W − 2 (and 0 … H − 2), so a box is keepable iff its centre pixel lies there."""
    x, y = _pixels(boxes[:, 2], width), _pixels(boxes[:, 3], height)
    return bool(((x >= 0) & (x < width - 1) & (y >= 0) & (y < height - 1)).any())


def jitter(boxes: np.ndarray, height: int, width: int, rng: np.random.Generator):
    """The fork's random crop: ((rand_x, rand_y, rand_w, rand_h), kept (K, 5) rows of class,
    x, y, w, h); call only when :func:`keepable`."""
    ox, oy = _pixels(boxes[:, 2], width), _pixels(boxes[:, 3], height)
    ow, oh = _pixels(boxes[:, 4], width), _pixels(boxes[:, 5], height)
    while True:
        scale = np.float32(1.0 - int(rng.integers(0, 30)) / 100.0)
        rand_w = int(np.float32(width) * scale) - 1
        rand_h = int(np.float32(height) * scale) - 1
        rand_x = int(rng.integers(0, width - rand_w))
        rand_y = int(rng.integers(0, height - rand_h))
        keep = (ox >= rand_x) & (ox < rand_x + rand_w) & (oy >= rand_y) & (oy < rand_y + rand_h)
        if keep.any():
            break
    rows = np.stack([boxes[keep, 0],
                     (ox[keep] - rand_x).astype(np.float32) / np.float32(rand_w),
                     (oy[keep] - rand_y).astype(np.float32) / np.float32(rand_h),
                     ow[keep].astype(np.float32) / np.float32(rand_w),
                     oh[keep].astype(np.float32) / np.float32(rand_h)], axis=1)  # fmt: skip
    return (rand_x, rand_y, rand_w, rand_h), rows.astype(np.float32)


def label_rows(rows: np.ndarray) -> np.ndarray:
    """transform_label: the (150,) label, (class, x, y, w, h) per box then zeros."""
    out = np.zeros(LABEL, np.float32)
    out[: rows.size] = rows.reshape(-1)
    return out


@reader("BoxData")
class BoxDataSource(DataLayerSource):
    """gklz1982's ``BoxData`` layer (see the module doc)."""

    def __init__(
        self,
        layer: caffe_pb2.LayerParameter,
        phase: str,
        *,
        base_dir: Path | None = None,
        seed: int | None = None,
    ) -> None:
        where = f"layer {layer.name!r} (BoxData)"
        sides = list(layer.data_param.side) or [7]
        if len(layer.top) != len(sides) + 1:
            raise DataError(f"{where}: {len(layer.top)} tops for {len(sides)} data_param.side; "
                            "BoxData has the data top and one label top per side")  # fmt: skip
        t = layer.transform_param
        if t.crop_size or t.mirror:
            raise DataError(f"{where}: transform_param crop_size/mirror are not supported (the "
                            "fork crops and mirrors the image but not its boxes)")  # fmt: skip
        self.sides = sides
        self.train = check_phase(phase) == "TRAIN"
        trimmed = caffe_pb2.LayerParameter()
        trimmed.CopyFrom(layer)
        del trimmed.top[2:]  # the Data layer's checks: data and one label
        super().__init__(trimmed, phase, base_dir=base_dir, seed=seed)

    def _setup(self, param: caffe_pb2.DataParameter, phase: str, rng: np.random.Generator) -> None:
        """The data shape from the first record (InferBlobShape), the label tops (N, 150)."""
        first = next(self.db.items(), None)
        if first is None:
            raise DataError(f"{self.db.path}: database is empty")
        self.item_shape = self._image(*first)[0].shape
        out = self.transformer.output_shape(self.item_shape, self._where(first))
        labels = [(self.batch_size, LABEL)] * len(self.sides)
        self._shapes = [(self.batch_size, *out), *labels]
        self.sampler = None
        self.cursor = Cursor(self.db)

    def _image(self, key: bytes, value: bytes) -> tuple[np.ndarray, np.ndarray]:
        where = self._where((key, value))
        datum = parse_datum(value, where=where)
        boxes = record_boxes(datum, where)
        return datum_to_array(datum, mode=self.transformer.decode_mode, where=where), boxes

    def item(self, record: tuple[bytes, bytes], position: int) -> tuple[np.ndarray, np.ndarray]:
        """One record as the fork's Transform gives it: the (jittered, in TRAIN) image and its
        (150,) label."""
        image, boxes = self._image(*record)
        where = self._where(record)
        if image.shape != self.item_shape:
            raise DataError(f"{where}: shape {image.shape} differs from the first item's "
                            f"{self.item_shape} (a batch has one shape)")  # fmt: skip
        if not self.train:
            return image, label_rows(boxes[:, [0, 2, 3, 4, 5]])
        _, height, width = image.shape
        if not keepable(boxes, height, width):
            raise DataError(f"{where}: no box centre lies in the pixels 0…W−2, 0…H−2: no "
                            "crop keeps a box (the fork would draw forever)")  # fmt: skip
        rng = np.random.default_rng([self.key, int(position)])
        (x, y, w, h), rows = jitter(boxes, height, width, rng)
        return resize(image[:, y : y + h, x : x + w], height, width), label_rows(rows)

    def fill(self, planned: Planned, rows: range, out: list[np.ndarray]) -> float:
        """Decode, jitter and transform the items ``rows`` into their rows of every top."""
        for row in rows:
            image, label = self.item(planned.records[row], int(planned.positions[row]))
            for top in out[1:]:
                top[row] = label
            self.transformer.transform_into(image, False, 0, 0, out[0][row])
        return 0.0

    def _item(self, record: object) -> tuple[np.ndarray, float]:
        raise NotImplementedError("BoxData fills its rows itself")


__all__ = ["BoxDataSource", "jitter", "keepable", "label_rows", "record_boxes"]
