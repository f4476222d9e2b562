"""SSD's AnnotatedDatum records (weiliu89/caffe, branch ssd) and its LabelMap files.

An AnnotatedDatum is one record of an ``AnnotatedData`` LMDB: a ``datum`` (the image, raw or
encoded, see :mod:`.datum`), a ``type`` (BBOX = 0, the only type the fork reads) and
``annotation_group``s. A group gathers the boxes of one label (``group_label``); each of its
``annotation``s has an ``instance_id`` (0, 1, … within the group, as the fork's converters
number them) and a ``bbox`` (NormalizedBBox: xmin, ymin, xmax, ymax in [0, 1] image
coordinates, ``difficult``).

Here the boxes of a record are a :class:`Boxes`: numpy arrays in the record's order (group by
group, annotation by annotation), which :meth:`Boxes.rows` turns into the rows of
AnnotatedData's label top, ``[item_id, group_label, instance_id, xmin, ymin, xmax, ymax,
difficult]``. :func:`annotated_datum` builds a record from boxes the way the fork's
``ReadXMLToAnnotatedDatum`` / ``ReadTxtToAnnotatedDatum`` do: a box joins the group of its
label (a new group is appended for a new label) and takes the next instance id there.

A LabelMap (``item { name label display_name }``, text format) maps the names of a VOC-style
XML file to labels; :func:`read_label_map` reads one, :func:`name_to_label` is the fork's
``MapNameToLabel`` (duplicated names are an error with ``strict``, else the last one wins).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.records.datum import datum_to_array

BBOX = caffe_pb2.AnnotatedDatum.BBOX
ROW = 8  # [item_id, group_label, instance_id, xmin, ymin, xmax, ymax, difficult]


@dataclass(frozen=True)
class Boxes:
    """The boxes of one image: ``boxes`` (K, 4) float32 normalized [xmin, ymin, xmax, ymax],
    ``labels`` (K,) int32 (the group labels), ``difficult`` (K,) bool and ``instance_ids``
    (K,) int32, in the record's order."""

    boxes: np.ndarray
    labels: np.ndarray
    difficult: np.ndarray
    instance_ids: np.ndarray

    @classmethod
    def empty(cls) -> Boxes:
        return cls(np.zeros((0, 4), np.float32), np.zeros(0, np.int32), np.zeros(0, bool),
                   np.zeros(0, np.int32))  # fmt: skip

    @classmethod
    def of(cls, boxes, labels, difficult=None, instance_ids=None) -> Boxes:
        """Boxes from array-likes; ``difficult`` defaults to False, ``instance_ids`` to the
        fork's numbering (0, 1, … per label, in order)."""
        b = np.asarray(boxes, np.float32).reshape(-1, 4)
        lab = np.asarray(labels, np.int32).reshape(-1)
        if len(lab) != len(b):
            raise ValueError(f"{len(b)} boxes but {len(lab)} labels")
        diff = np.zeros(len(b), bool) if difficult is None else np.asarray(difficult, bool)
        if instance_ids is None:
            seen: dict[int, int] = {}
            ids = []
            for label in lab.tolist():
                ids.append(seen.get(label, 0))
                seen[label] = ids[-1] + 1
            instance_ids = ids
        return cls(b, lab, diff.reshape(-1), np.asarray(instance_ids, np.int32).reshape(-1))

    def __len__(self) -> int:
        return len(self.boxes)

    def take(self, keep: np.ndarray) -> Boxes:
        """The boxes selected by ``keep`` (a mask or indices), in order."""
        return Boxes(self.boxes[keep], self.labels[keep], self.difficult[keep],
                     self.instance_ids[keep])  # fmt: skip

    def with_boxes(self, boxes: np.ndarray) -> Boxes:
        """The same annotations with new coordinates."""
        return Boxes(np.asarray(boxes, np.float32).reshape(-1, 4), self.labels, self.difficult,
                     self.instance_ids)  # fmt: skip

    def rows(self, item_id: int) -> np.ndarray:
        """AnnotatedData's label rows of this image as item ``item_id``: (K, 8) float32."""
        out = np.empty((len(self), ROW), np.float32)
        out[:, 0] = item_id
        out[:, 1] = self.labels
        out[:, 2] = self.instance_ids
        out[:, 3:7] = self.boxes
        out[:, 7] = self.difficult
        return out


def parse_annotated_datum(
    value: bytes, *, where: str = "AnnotatedDatum"
) -> caffe_pb2.AnnotatedDatum:
    """Parse a serialised AnnotatedDatum; ``where`` names the file and record in the error."""
    record = caffe_pb2.AnnotatedDatum()
    try:
        record.ParseFromString(value)
    except DecodeError as err:
        raise DataError(f"{where}: corrupt AnnotatedDatum ({err})") from err
    if not record.HasField("datum"):
        raise DataError(f"{where}: not an AnnotatedDatum (it has no datum)")
    return record


def boxes_of(record: caffe_pb2.AnnotatedDatum, *, where: str = "AnnotatedDatum") -> Boxes:
    """The boxes of a BBOX record, group by group, in the record's order."""
    if record.type != BBOX:
        raise DataError(f"{where}: annotation type {record.type} is not BBOX (the only one "
                        "AnnotatedData reads)")  # fmt: skip
    coords, labels, difficult, ids = [], [], [], []
    for group in record.annotation_group:
        for anno in group.annotation:
            b = anno.bbox
            coords.append((b.xmin, b.ymin, b.xmax, b.ymax))
            labels.append(group.group_label)
            difficult.append(b.difficult)
            ids.append(anno.instance_id)
    if not coords:
        return Boxes.empty()
    return Boxes.of(coords, labels, difficult, ids)


def decode_annotated(
    value: bytes, *, mode: str = "native", where: str = "AnnotatedDatum"
) -> tuple[np.ndarray, Boxes]:
    """A serialised AnnotatedDatum as its C×H×W image (uint8, or float32 for ``float_data``;
    encoded images decoded with ``mode``, see :func:`~.datum.datum_to_array`) and its boxes."""
    record = parse_annotated_datum(value, where=where)
    return datum_to_array(record.datum, mode=mode, where=where), boxes_of(record, where=where)


def annotated_datum(datum: caffe_pb2.Datum, boxes: Boxes) -> caffe_pb2.AnnotatedDatum:
    """A BBOX AnnotatedDatum of ``datum`` and ``boxes``: each box joins the group of its label
    (groups in order of first appearance), keeping its ``instance_id``."""
    record = caffe_pb2.AnnotatedDatum(type=BBOX)
    record.datum.CopyFrom(datum)
    groups: dict[int, caffe_pb2.AnnotationGroup] = {}
    for i in range(len(boxes)):
        label = int(boxes.labels[i])
        group = groups.get(label)
        if group is None:
            group = groups[label] = record.annotation_group.add(group_label=label)
        anno = group.annotation.add(instance_id=int(boxes.instance_ids[i]))
        xmin, ymin, xmax, ymax = (float(v) for v in boxes.boxes[i])
        anno.bbox.xmin, anno.bbox.ymin, anno.bbox.xmax, anno.bbox.ymax = xmin, ymin, xmax, ymax
        anno.bbox.difficult = bool(boxes.difficult[i])
    return record


def read_label_map(path: str | Path) -> caffe_pb2.LabelMap:
    """A LabelMap text-format file (``item { name: "cat" label: 8 display_name: "cat" }``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise DataError(f"{path}: cannot read label map ({err.strerror})") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: label map is not UTF-8 text") from None
    label_map = caffe_pb2.LabelMap()
    try:
        text_format.Parse(text, label_map)
    except text_format.ParseError as err:
        raise DataError(f"{path}:{err}") from None
    if not label_map.item:
        raise DataError(f"{path}: label map has no items")
    return label_map


def name_to_label(label_map: caffe_pb2.LabelMap, *, strict: bool = False,
                  where: str = "label map") -> dict[str, int]:  # fmt: skip
    """The fork's ``MapNameToLabel``: name → label; a duplicated name is an error with
    ``strict`` (``--check_label``), else the last item wins."""
    names: dict[str, int] = {}
    for item in label_map.item:
        if strict and item.name in names:
            raise DataError(f"{where}: name {item.name!r} appears more than once")
        names[item.name] = int(item.label)
    return names


def label_to_display_name(label_map: caffe_pb2.LabelMap) -> dict[int, str]:
    """label → display name (the name where an item has none), as the fork's
    ``MapLabelToDisplayName`` gives the per-class names of detection results."""
    return {int(item.label): item.display_name or item.name for item in label_map.item}
