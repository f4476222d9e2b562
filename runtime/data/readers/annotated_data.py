"""SSD's ``AnnotatedData`` layer (weiliu89/caffe layers/annotated_data_layer.cpp): images and
their boxes from an LMDB/LevelDB of AnnotatedDatum records (:mod:`.annotated_datum`), read in
key order with wrap-around as the ``Data`` layer reads Datums, each item transformed with its
boxes by :mod:`.annotated_transform` (distort, expand, batch samplers, resize, crop, mirror,
mean and scale, in the fork's order).

Tops: ``data`` (N, C, H, W) and ``label`` (1, 1, R, 8), one row per box of the batch,
``[item_id, group_label, instance_id, xmin, ymin, xmax, ymax, difficult]``, items in order and
each item's boxes in its record's order, as the fork writes them. **Bucketed shapes**: the
fork sizes the label top per batch (the boxes that survived); a compiled step needs fixed
shapes, so a batch's R is its box count rounded up to a bucket (:func:`bucket_rows`: a power
of two, at least 8, at most G) and the rows after the real ones are padding, every value -1
(``item_id`` -1: no box; a batch without any box is all padding, where the fork writes one
such row). A step compiles once per bucket met (a handful: log2(G/8) + 2 at most), and a
batch pays for its own boxes, not the largest record's (MultiBoxLoss ignores the padding
rows: the loss and its gradients are the same bits at any R). G, the declared top shape
(``top_shapes``), is the most boxes any batch can hold: the sum of the ``batch_size``
largest box counts of the database's records (each counted as often as a batch can repeat it
when the database holds fewer records than a batch), so R ≤ G ≤ batch_size × the largest
record's count. Transforms only ever drop boxes, so no batch overflows G; it is scanned once
(box counts only) when the layer opens. Where one shape is needed across batches (several
devices: one program for every device's batch; iter_size passes: one step),
:meth:`AnnotatedDataSource.pad_to` pads a batch's label to it.

With one top, or a database whose records have no annotation type, the fork's label is the
Datum's; caffe2jax requires the label top and BBOX records. ``annotated_data_param.anno_type``
overrides the records' type, as in the fork; ``label_map_file`` is not read by the layer (the
fork only keeps its name).

Random choices (beyond the fork, whose draws follow one RNG stream): each item's come from a
generator seeded with the reader's key and the item's position in the stream, so the
pipeline's worker threads and a resumed run (the reader's state: records read, position,
key) give the same batches byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import Planned, check_phase, check_tops
from caffe2jax.runtime.data.readers import reader
from caffe2jax.runtime.data.readers.data_layer import DataLayerSource
from caffe2jax.runtime.data.records.annotated_datum import (
    ROW,
    Boxes,
    boxes_of,
    parse_annotated_datum,
)
from caffe2jax.runtime.data.records.datum import datum_to_array
from caffe2jax.runtime.data.records.db import Cursor
from caffe2jax.runtime.data.transform.annotated import AnnotatedTransformer
from caffe2jax.runtime.data.transform.image_header import header_size

BBOX = caffe_pb2.AnnotatedDatum.BBOX
SMALLEST_BUCKET = 8  # label rows of the smallest bucket


def max_rows(counts: list[int], batch_size: int) -> int:
    """The most boxes a batch of ``batch_size`` consecutive records (with wrap-around) can
    hold: the largest counts, each used as often as a batch can repeat its record."""
    if not counts:
        return 1
    repeats = -(-batch_size // len(counts))
    total, left = 0, batch_size
    for count in sorted(counts, reverse=True):  # never the repeated list (batch_size 2^31 − 1)
        take = min(repeats, left)
        total, left = total + take * count, left - take
    return max(1, total)


def bucket_rows(count: int, worst: int, smallest: int = SMALLEST_BUCKET) -> int:
    """The label rows of a batch of ``count`` boxes: the next power of two ≥ ``count``, at
    least ``smallest``, at most ``worst`` (:func:`max_rows`, which no batch exceeds)."""
    return min(worst, max(smallest, 1 << max(0, count - 1).bit_length()))


@reader("AnnotatedData")
class AnnotatedDataSource(DataLayerSource):
    """SSD's ``AnnotatedData`` layer (see the module doc)."""

    def __init__(
        self,
        layer: caffe_pb2.LayerParameter,
        phase: str,
        *,
        base_dir: Path | None = None,
        seed: int | None = None,
    ) -> None:
        check_tops(layer, (2,))
        param = layer.annotated_data_param
        self.anno_type = int(param.anno_type) if param.HasField("anno_type") else None
        if self.anno_type not in (None, BBOX):
            raise DataError(f"layer {layer.name!r} (AnnotatedData): anno_type {param.anno_type} "
                            "is not supported (BBOX)")  # fmt: skip
        if param.yolo_data_type:  # eric612/MobileNet-YOLO's label (docs/forks.md, YOLOv2)
            raise DataError(f"layer {layer.name!r} (AnnotatedData): yolo_data_type "
                            f"{param.yolo_data_type} (eric612's (N, 1, 300, 5) YOLO label) is "
                            "not supported; SSD's rows are (yolo_data_type 0)")  # fmt: skip
        self.anno = AnnotatedTransformer(layer.transform_param, check_phase(phase),
                                         list(param.batch_sampler),
                                         f"layer {layer.name!r} (AnnotatedData)")  # fmt: skip
        super().__init__(layer, phase, base_dir=base_dir, seed=seed)

    def _setup(self, param: caffe_pb2.DataParameter, phase: str, rng: np.random.Generator) -> None:
        """The data shape from the first record, G from every record's box count."""
        first = next(self.db.items(), None)
        if first is None:
            raise DataError(f"{self.db.path}: database is empty")
        image, _ = self._decode(*first)
        self.anno.mean = self.transformer.mean
        self.item_shape = self.anno.output_shape(*image.shape)
        if self.anno.mean is not None and self.anno.mean.shape[0] != image.shape[0]:
            raise DataError(f"{self._where(first)}: mean_file has {self.anno.mean.shape[0]} "
                            f"channels, the data {image.shape[0]}")  # fmt: skip
        counts = [len(self._record(k, v)[1]) for k, v in self.db.items()]
        self.rows = max_rows(counts, self.batch_size)
        self._shapes = [(self.batch_size, *self.item_shape), (1, 1, self.rows, ROW)]
        self.sampler = None
        self.cursor = Cursor(self.db)

    def _record(self, key: bytes, value: bytes) -> tuple[caffe_pb2.AnnotatedDatum, Boxes]:
        where = self._where((key, value))
        record = parse_annotated_datum(value, where=where)
        if self.anno_type is not None:
            record.type = self.anno_type
        elif not record.HasField("type"):
            raise DataError(f"{where}: the record has no annotation type (AnnotatedData reads "
                            "BBOX records; set annotated_data_param.anno_type)")  # fmt: skip
        return record, boxes_of(record, where=where)

    def _decode(self, key: bytes, value: bytes) -> tuple[np.ndarray, int]:
        record, _ = self._record(key, value)
        where = self._where((key, value))
        return datum_to_array(record.datum, mode=self.transformer.decode_mode, where=where), 0

    def _size(self, datum: caffe_pb2.Datum, where: str) -> tuple[int, int, int]:
        """An image's C×H×W without decoding it (an encoded image's header)."""
        if not datum.encoded:
            return datum.channels, datum.height, datum.width
        size = header_size(datum.data)
        if size is None:  # a format whose header is not parsed here: decode it
            return datum_to_array(datum, mode=self.transformer.decode_mode, where=where).shape
        channels = self.item_shape[0]
        return channels, size[1], size[0]

    def plan(self) -> Planned:
        """The next batch's records with every item's random choices, and the label top at
        the batch's bucket."""
        planned = super().plan()
        parts, items = [], []
        for item, (position, (key, value)) in enumerate(zip(planned.positions, planned.records,
                                                            strict=True)):  # fmt: skip
            record, boxes = self._record(key, value)
            where = self._where((key, value))
            rng = np.random.default_rng([self.key, int(position)])
            shape = self._size(record.datum, where)
            recipe, kept = self.anno.plan(rng, shape, boxes, bool(record.datum.encoded))
            parts.append(kept.rows(item))
            items.append((record.datum, recipe, where))
        count = sum(len(part) for part in parts)
        rows = np.full((bucket_rows(count, self.rows), ROW), -1, np.float32)
        if count:
            rows[:count] = np.concatenate(parts)
        return Planned((items, rows[None, None]), planned.positions)

    def fill(self, planned: Planned, rows: range, out: list[np.ndarray]) -> float:
        """Decode and transform the items ``rows`` into their rows of the data top; the label
        (planned whole) is written at the head of the slot's label top by the worker that
        has the first row."""
        items, labels = planned.records
        if rows.start == 0:
            out[1][:, :, : labels.shape[2]] = labels
        for row in rows:
            datum, recipe, where = items[row]
            image = datum_to_array(datum, mode=self.transformer.decode_mode, where=where)
            self.anno.apply(image, recipe, out[0][row])
        return 0.0

    def batch_of(self, planned: Planned, out: list[np.ndarray]) -> list[np.ndarray]:
        """The data top, and the head of the slot's label top: the batch's bucket of rows."""
        return [out[0], out[1][:, :, : planned.records[1].shape[2]]]

    def pad_to(self, batch: list, shapes: list[tuple[int, ...]]) -> list:
        """``batch`` with its label padded by -1 rows to ``shapes``' (host or device arrays;
        a device array is padded on its device)."""
        label = batch[1]
        missing = shapes[1][2] - label.shape[2]
        if missing <= 0:
            return list(batch)
        widths = ((0, 0), (0, 0), (0, missing), (0, 0))
        if isinstance(label, np.ndarray):
            return [batch[0], np.pad(label, widths, constant_values=-1)]
        import jax.numpy as jnp

        return [batch[0], jnp.pad(label, widths, constant_values=-1)]

    def _item(self, record: object) -> tuple[np.ndarray, float]:
        raise NotImplementedError("AnnotatedData fills its rows itself")


__all__ = ["AnnotatedDataSource", "bucket_rows", "max_rows"]
