"""SSD's AnnotatedData layer (runtime/data/readers/annotated_data.py): shapes and the label top
(real rows first, -1 padding, each batch at its own bucket of rows), the fork's recipe on the
synthetic set, the same bytes with worker threads and on resume, and one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import plain
from caffe2jax.runtime.data.prefetch import Prefetcher
from caffe2jax.runtime.data.readers.annotated_data import bucket_rows, max_rows
from caffe2jax.runtime.data.records.annotated_datum import Boxes, annotated_datum, decode_annotated
from caffe2jax.runtime.data.records.datum import array_to_datum
from caffe2jax.runtime.data.records.db import Writer, open_db
from caffe2jax.runtime.data.sources import make_source
from examples.detection.synthetic_boxes import make_dataset

from .helpers import layer, write_annotated_db

SSD_TRANSFORM = """mirror: true mean_value: 127.5 mean_value: 127.5 mean_value: 127.5
scale: 0.007843 resize_param { resize_mode: WARP height: 48 width: 48 interp_mode: LINEAR
interp_mode: AREA interp_mode: NEAREST interp_mode: CUBIC interp_mode: LANCZOS4 }
emit_constraint { emit_type: CENTER }
distort_param { brightness_prob: 0.5 brightness_delta: 32 contrast_prob: 0.5
contrast_lower: 0.5 contrast_upper: 1.5 hue_prob: 0.5 hue_delta: 18 saturation_prob: 0.5
saturation_lower: 0.5 saturation_upper: 1.5 }
expand_param { prob: 0.5 max_expand_ratio: 4 }"""
SSD_SAMPLERS = "batch_sampler { max_sample: 1 max_trials: 1 }" + "".join(
    f"batch_sampler {{ sampler {{ min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 "
    f"max_aspect_ratio: 2 }} sample_constraint {{ {c} }} max_sample: 1 max_trials: 50 }}"
    for c in ("min_jaccard_overlap: 0.1", "min_jaccard_overlap: 0.5", "max_jaccard_overlap: 1")
)


def anno_layer(db, batch=4, transform=SSD_TRANSFORM, samplers=SSD_SAMPLERS, tops=2):
    top = ' top: "data" top: "label"' if tops == 2 else ' top: "data"'
    return layer(f'name: "a" type: "AnnotatedData"{top} transform_param {{ {transform} }} '
                 f'data_param {{ source: "{db}" batch_size: {batch} backend: LMDB }} '
                 f"annotated_data_param {{ {samplers} }}")  # fmt: skip


def read_all(path) -> list[tuple[np.ndarray, Boxes]]:
    db = open_db(path)
    try:
        return [decode_annotated(value) for _, value in db.items()]
    finally:
        db.close()


@pytest.fixture(scope="module")
def boxes_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("boxes")
    return make_dataset(out, train=10, test=3, size=64)


def test_ssd_recipe_shapes_and_label_rows(boxes_set):
    source = make_source(anno_layer(boxes_set["train_lmdb"]), "TRAIN", seed=2)
    counts = [len(boxes) for _, boxes in read_all(boxes_set["train_lmdb"])]
    g = sum(sorted(counts, reverse=True)[:4])
    assert source.top_shapes() == [(4, 3, 48, 48), (1, 1, g, 8)]
    for _ in range(6):
        data, label = source.next_batch()
        assert data.shape == (4, 3, 48, 48) and np.abs(data).max() <= 1.0001
        rows = label[0, 0]
        assert len(rows) == bucket_rows(int((rows[:, 0] >= 0).sum()), g)
        real = rows[:, 0] >= 0
        n = int(real.sum())
        assert real[:n].all() and (rows[n:] == -1).all()  # real rows first, padding all -1
        assert (np.diff(rows[:n, 0]) >= 0).all()  # items in order
        assert set(rows[:n, 1].tolist()) <= {1, 2, 3}
        boxes = rows[:n, 3:7]
        assert (boxes >= 0).all() and (boxes <= 1).all()
        assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
    source.close()


def test_test_phase_without_augmentation_gives_the_records_boxes(boxes_set):
    text = anno_layer(boxes_set["test_lmdb"], batch=3, samplers="",
                      transform="resize_param { height: 64 width: 64 }")  # fmt: skip
    source = make_source(text, "TEST", seed=0)
    data, label = source.next_batch()
    want = read_all(boxes_set["test_lmdb"])
    np.testing.assert_array_equal(data[0], want[0][0].astype(np.float32))
    rows = np.concatenate([b.rows(i) for i, (_, b) in enumerate(want)])
    np.testing.assert_allclose(label[0, 0], rows, atol=1e-6)  # G = all boxes: no padding
    source.close()


def serial(text, count):
    source = make_source(text, "TRAIN", seed=3)
    out, states = [], []
    for _ in range(count):
        out.append([a.copy() for a in source.next_batch()])
        states.append(plain(source.get_state()))
    source.close()
    return out, states


@pytest.mark.parametrize("workers", [0, 2])
def test_the_same_bytes_with_workers_and_on_resume(boxes_set, workers):
    text = anno_layer(boxes_set["train_lmdb"], batch=3)
    want, states = serial(text, 6)  # past a wrap-around (10 records)
    with Prefetcher(make_source(text, "TRAIN", seed=3), 2, workers=workers) as reader:
        for batch, state in zip(want, states, strict=True):
            got = reader.next_batch()
            assert all(np.asarray(g).tobytes() == w.tobytes() for g, w in zip(got, batch))
            assert plain(reader.get_state()) == state
    resumed = make_source(text, "TRAIN", seed=11)
    resumed.set_state(states[2])
    for batch in want[3:]:
        assert all(g.tobytes() == w.tobytes() for g, w in zip(resumed.next_batch(), batch))
    resumed.close()
    other = make_source(text, "TRAIN", seed=4)
    assert other.next_batch()[1].tobytes() != want[0][1].tobytes()  # the seed matters
    other.close()


def test_max_rows():
    assert max_rows([3, 1, 2], 2) == 5
    assert max_rows([3, 1], 5) == 3 + 3 + 3 + 1 + 1  # a batch wraps: each record up to 3 times
    assert max_rows([0, 0], 4) == 1  # one row of -1, as the fork's batch without boxes


def test_a_batch_without_boxes_is_all_padding(tmp_path):
    with Writer(tmp_path / "db") as writer:
        for i in range(2):
            record = annotated_datum(array_to_datum(np.zeros((3, 4, 4), np.uint8)), Boxes.empty())
            writer.put(f"{i:08d}", record.SerializeToString())
    source = make_source(anno_layer(tmp_path / "db", 2, "", ""), "TRAIN", seed=0)
    assert source.top_shapes()[1] == (1, 1, 1, 8)
    np.testing.assert_array_equal(source.next_batch()[1], -np.ones((1, 1, 1, 8), np.float32))
    source.close()


def test_one_line_errors(tmp_path, boxes_set):
    with pytest.raises(DataError, match="needs 2 tops"):
        make_source(anno_layer(boxes_set["train_lmdb"], tops=1), "TRAIN")
    with Writer(tmp_path / "db") as writer:
        untyped = annotated_datum(array_to_datum(np.zeros((3, 4, 4), np.uint8)), Boxes.empty())
        untyped.ClearField("type")
        writer.put("0", untyped.SerializeToString())
    with pytest.raises(DataError, match="has no annotation type"):
        make_source(anno_layer(tmp_path / "db", 1, "", ""), "TRAIN")
    with pytest.raises(DataError, match="crop 8×8 is larger than the image 4×4"):
        make_source(anno_layer(tmp_path / "db", 1, "crop_size: 8", "anno_type: BBOX"), "TRAIN")
    yolo = "anno_type: BBOX yolo_data_type: 1"  # eric612's YOLO label: refused, not SSD's rows
    with pytest.raises(DataError, match="yolo_data_type 1 .eric612's .N, 1, 300, 5. YOLO label"):
        make_source(anno_layer(tmp_path / "db", 1, "", yolo), "TRAIN")


def test_max_rows_of_a_huge_batch_is_counted_not_listed():
    """batch_size 2^31 − 1: the rows are counted without building the repeated list (it was a
    bare MemoryError); the layer then refuses the batch in one line before allocating."""
    assert max_rows([5, 2], 2**31 - 1) == 5 * 2**30 + 2 * (2**30 - 1)


def test_a_huge_batch_size_is_refused_in_one_line(boxes_set):
    source = make_source(anno_layer(boxes_set["train_lmdb"], batch=2**31 - 1), "TRAIN", seed=0)
    with pytest.raises(DataError, match="'a'|\\ba\\b") as error:
        source.next_batch()
    assert len(str(error.value).splitlines()) == 1, str(error.value)
    source.close()


def test_bucket_rows():
    assert [bucket_rows(n, 5002) for n in (0, 1, 8, 9, 16, 17, 4000, 4097, 5002)] == [
        8, 8, 8, 16, 16, 32, 4096, 5002, 5002]  # fmt: skip
    assert bucket_rows(0, 1) == 1 and bucket_rows(3, 5) == 5  # never past the worst batch
    # a handful of sizes: log2(G / 8) + 2 at most
    assert len({bucket_rows(n, 5002) for n in range(5003)}) == 11


HUGE = [2, 2, 2, 5000, 2, 2, 2, 2]  # one record of 5,000 boxes among 2-box records


@pytest.mark.parametrize(("workers", "to_device"), [(0, False), (2, True)])
def test_a_huge_record_costs_only_its_own_batch(tmp_path, workers, to_device):
    """Issue 37: one 5,000-box record among 2-box records. The declared label top is the
    worst batch (G = 5,000 + 2 with batch 2); every other batch's label is at the smallest
    bucket (8 rows), the huge record's batch at G; never more than batch × worst × 8 floats.
    The real rows are the same as the worst-record padding's, in the same order."""
    db = write_annotated_db(tmp_path / "db", HUGE)
    text = anno_layer(db, batch=2, transform="", samplers="")
    worst = 2 * max(HUGE)
    source = make_source(text, "TEST", seed=0)
    with Prefetcher(source, 2, workers=workers, to_device=to_device) as reader:
        assert reader.top_shapes()[1] == (1, 1, 5002, 8)
        sizes = []
        for _ in range(2 * len(HUGE) // 2):  # two passes over the records
            data, label = reader.next_batch()
            assert label.size <= 2 * worst * 8 and data.shape == (2, 3, 8, 8)
            sizes.append(label.shape[2])
            padded = reader.pad_to([data, label], reader.top_shapes())[1]
            rows, padded = np.asarray(label[0, 0]), np.asarray(padded[0, 0])
            real = int((rows[:, 0] >= 0).sum())
            assert (rows[real:] == -1).all() and real <= len(rows)
            assert padded.shape == (5002, 8) and (padded[real:] == -1).all()
            np.testing.assert_array_equal(padded[:real], rows[:real])
    assert sizes == [8, 5002, 8, 8] * 2
