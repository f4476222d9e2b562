"""AnnotatedDatum records and LabelMap files (runtime/data/records/annotated_datum.py)."""

from __future__ import annotations

import numpy as np
import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.records.annotated_datum import (
    Boxes,
    annotated_datum,
    boxes_of,
    decode_annotated,
    label_to_display_name,
    name_to_label,
    parse_annotated_datum,
    read_label_map,
)
from caffe2jax.runtime.data.records.datum import array_to_datum


def test_round_trip_groups_labels_and_instance_ids_as_the_fork():
    image = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)
    boxes = Boxes.of([[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.9, 0.8], [0.0, 0.0, 1.0, 1.0]],
                     [2, 1, 2], difficult=[False, True, False])  # fmt: skip
    record = annotated_datum(array_to_datum(image), boxes)
    assert [g.group_label for g in record.annotation_group] == [2, 1]
    assert [a.instance_id for a in record.annotation_group[0].annotation] == [0, 1]
    pixels, back = decode_annotated(record.SerializeToString())
    np.testing.assert_array_equal(pixels, image)
    # group order: label 2's two boxes, then label 1's
    np.testing.assert_allclose(back.boxes, boxes.boxes[[0, 2, 1]])
    np.testing.assert_array_equal(back.labels, [2, 2, 1])
    np.testing.assert_array_equal(back.instance_ids, [0, 1, 0])
    np.testing.assert_array_equal(back.difficult, [False, False, True])
    rows = back.rows(3)
    assert rows.shape == (3, 8) and rows.dtype == np.float32
    np.testing.assert_allclose(rows[2], [3, 1, 0, 0.5, 0.5, 0.9, 0.8, 1])


def test_empty_and_corrupt_records():
    record = annotated_datum(array_to_datum(np.zeros((1, 2, 2), np.uint8)), Boxes.empty())
    assert len(boxes_of(record)) == 0
    with pytest.raises(DataError, match="rec 7: corrupt AnnotatedDatum"):
        parse_annotated_datum(b"\xff\xff\xff", where="rec 7")
    with pytest.raises(DataError, match="has no datum"):
        parse_annotated_datum(b"")


def test_label_map(tmp_path):
    path = tmp_path / "labelmap.prototxt"
    path.write_text('item { name: "none_of_the_above" label: 0 display_name: "background" }\n'
                    'item { name: "box" label: 1 }\nitem { name: "box" label: 2 }\n')  # fmt: skip
    label_map = read_label_map(path)
    assert name_to_label(label_map) == {"none_of_the_above": 0, "box": 2}
    assert label_to_display_name(label_map) == {0: "background", 1: "box", 2: "box"}
    with pytest.raises(DataError, match="'box' appears more than once"):
        name_to_label(label_map, strict=True)
    path.write_text("item { name: 3 }\n")
    with pytest.raises(DataError, match=r"labelmap.prototxt:1:"):
        read_label_map(path)
    with pytest.raises(DataError, match="cannot read label map"):
        read_label_map(tmp_path / "missing")


def test_a_record_of_another_type_is_refused():
    record = caffe_pb2.AnnotatedDatum(type=caffe_pb2.AnnotatedDatum.LANE)
    record.datum.CopyFrom(array_to_datum(np.zeros((1, 2, 2), np.uint8)))
    with pytest.raises(DataError, match="not BBOX"):
        boxes_of(record)
