"""gklz1982/caffe-yolov2's BoxData layer (runtime/data/readers/box_data.py) on tiny LMDBs written
in the fork's record format (encoded Datum, float_data (class, difficult, x, y, w, h) per box):
TEST gives the records' boxes and pixels as they are; TRAIN's jitter equals the fork's loop
(data_transformer.cpp, transcribed) for the same Rand draws, its draws have the fork's
distribution, and each jittered label points at the same pixels of the resized crop; the same
bytes with worker threads and on resume; one-line refusals; a YOLOv2 net (BoxData → small
darknet-like body → RegionLoss) trained from the CLI."""

from __future__ import annotations

import re

import numpy as np
import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.runtime.data.base import plain
from caffe2jax.runtime.data.prefetch import Prefetcher
from caffe2jax.runtime.data.readers.box_data import jitter
from caffe2jax.runtime.data.records.db import Writer
from caffe2jax.runtime.data.sources import make_source
from caffe2jax.runtime.data.transform.image import encode_image
from tests.cli_runner import run_cli

from .helpers import layer

F = np.float32
SIZE = 40


def coordinate_image(size=SIZE) -> np.ndarray:
    """A BGR image whose channel 0 is the column index and channel 1 the row index."""
    rows, cols = np.mgrid[0:size, 0:size]
    return np.stack([cols, rows, np.full_like(rows, 7)]).astype(np.uint8)


def box_datum(image, boxes, encoded=True) -> caffe_pb2.Datum:
    """A record as the fork's convert_box_data writes it: the encoded image, 6 values a box."""
    datum = caffe_pb2.Datum(channels=image.shape[0], height=image.shape[1],
                            width=image.shape[2], encoded=encoded)  # fmt: skip
    datum.data = encode_image(image, "png") if encoded else image.tobytes()
    datum.float_data.extend(np.asarray(boxes, F).reshape(-1).tolist())
    return datum


BOXES = [
    [[3, 0, 0.5, 0.5, 0.4, 0.3], [1, 1, 0.2, 0.8, 0.1, 0.2]],
    [[0, 0, 0.7, 0.3, 0.5, 0.5]],
    [[2, 0, 0.35, 0.6, 0.2, 0.6], [4, 0, 0.9, 0.1, 0.15, 0.1], [5, 0, 0.55, 0.45, 0.3, 0.3]],
]


def write_boxes(path, records) -> str:
    with Writer(path, "lmdb") as writer:
        for i, datum in enumerate(records):
            writer.put(f"{i:08d}", datum.SerializeToString())
    return str(path)


@pytest.fixture(scope="module")
def box_db(tmp_path_factory):
    records = [box_datum(coordinate_image(), b) for b in BOXES]
    return write_boxes(tmp_path_factory.mktemp("box") / "lmdb", records)


def box_layer(db, batch=2, sides=(13,), transform="", tops=None):
    tops = tops if tops is not None else 1 + len(sides)
    top = ' top: "data"' + "".join(f' top: "label{i}"' for i in range(tops - 1))
    side = "".join(f" side: {s}" for s in sides)
    return layer(f'name: "box" type: "BoxData"{top} transform_param {{ {transform} }} '
                 f'data_param {{ source: "{db}" batch_size: {batch} backend: LMDB{side} '
                 "}")  # fmt: skip


def test_test_phase_gives_the_records_boxes_and_pixels(box_db):
    """TEST: (N, 150) labels per side, (class, x, y, w, h) of each box in record order then
    zeros; the image as decoded, mean and scale applied; seeds do not matter."""
    text = box_layer(box_db, batch=3, sides=(13, 7), transform="scale: 0.5 mean_value: 1")
    batches = []
    for seed in (1, 2):
        source = make_source(text, "TEST", seed=seed)
        assert source.top_shapes() == [(3, 3, SIZE, SIZE), (3, 150), (3, 150)]
        batches.append(source.next_batch())
        source.close()
    data, first, second = batches[0]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(*batches, strict=True))
    want = (coordinate_image()[None].astype(F) - 1) * F(0.5)
    np.testing.assert_array_equal(data, np.broadcast_to(want, data.shape))
    for item, boxes in enumerate(BOXES):
        want = np.zeros(150, F)
        rows = np.asarray(boxes, F)[:, [0, 2, 3, 4, 5]].reshape(-1)
        want[: rows.size] = rows
        np.testing.assert_array_equal(first[item], want)
    np.testing.assert_array_equal(first, second)


class Script:
    """A stream of raw draws: the fork's Rand(n) takes ``next % n``, numpy's integers(0, n) the
    same here, so both sides see one sequence of choices."""

    def __init__(self, values):
        self.values = iter(values)

    def rand(self, n):
        return next(self.values) % n

    def integers(self, low, high):
        return low + next(self.values) % (high - low)


def fork_jitter(boxes, height, width, rand):
    """data_transformer.cpp Transform(datum, blob, box_labels), TRAIN, transcribed."""
    labels = []
    while not labels:
        rand_scale = F(1.0 - rand(30) / 100.0)
        rand_w = int(F(width) * rand_scale) - 1
        rand_h = int(F(height) * rand_scale) - 1
        rand_x, rand_y = rand(width - rand_w), rand(height - rand_h)
        for cls, _, x, y, w, h in boxes:
            ori_x, ori_y = int(F(x) * F(width)), int(F(y) * F(height))
            ori_w, ori_h = int(F(w) * F(width)), int(F(h) * F(height))
            if not (rand_x <= ori_x < rand_x + rand_w) or not (rand_y <= ori_y < rand_y + rand_h):
                continue
            labels.append([cls, F(ori_x - rand_x) / F(rand_w), F(ori_y - rand_y) / F(rand_h),
                           F(ori_w) / F(rand_w), F(ori_h) / F(rand_h)])  # fmt: skip
    return (rand_x, rand_y, rand_w, rand_h), np.asarray(labels, F)


def test_jitter_is_the_forks_loop_for_the_same_draws():
    """Crops and kept boxes equal the fork's for scripted draws, retries included (a first
    crop keeping no box is drawn again)."""
    boxes = np.asarray(BOXES[2], F)
    rng = np.random.default_rng(5)
    for _ in range(200):
        raw = rng.integers(0, 2**31, 64).tolist()
        crop, rows = jitter(boxes, 48, 40, Script(raw))
        want_crop, want_rows = fork_jitter(boxes, 48, 40, Script(raw).rand)
        assert crop == want_crop
        np.testing.assert_array_equal(rows, want_rows)
    lonely = np.asarray([[1, 0, 0.01, 0.01, 0.1, 0.1]], F)  # kept only by crops at (0, 0)
    script = [5, 3, 4, 0, 0, 0]  # a 37×37 crop at (0, 1) keeps nothing: drawn again at (0, 0)
    want = fork_jitter(lonely, 40, 40, Script(script).rand)[0]
    assert jitter(lonely, 40, 40, Script(script))[0] == want == (0, 0, 39, 39)


def test_jitter_draws_have_the_forks_distribution():
    """scale = 1 − Rand(30)/100 takes its 30 values uniformly, offsets Rand(W − rand_w)
    theirs: 6000 draws, each value within 4.5 standard deviations of its expected count."""
    rng = np.random.default_rng(0)
    boxes = np.asarray([[0, 0, 0.5, 0.5, 0.2, 0.2]], F)
    crops = np.asarray([jitter(boxes, 100, 100, rng)[0] for _ in range(6000)])
    widths = crops[:, 2]
    assert set(widths) == {int(F(100) * F(1 - r / 100)) - 1 for r in range(30)}
    counts = np.bincount(widths, minlength=100)[sorted(set(widths))]
    assert np.abs(counts - 200).max() < 4.5 * np.sqrt(200 * 29 / 30)
    assert (crops[:, 0] >= 0).all() and (crops[:, 0] + crops[:, 2] < 100).all()
    assert set(crops[crops[:, 2] == 99, 0]) == {0}  # scale 1: Rand(100 − 99) = 0
    small = crops[crops[:, 2] == 70]  # scale 0.71: Rand(30), every offset drawn
    assert set(small[:, 0]) == set(range(30)) and set(small[:, 1]) == set(range(30))


def test_train_labels_point_at_the_same_pixels_of_the_resized_crop(box_db):
    """TRAIN: each kept box's centre x'·W, y'·H in the output image shows the original pixel
    int(x·W), int(y·H) (the coordinate image; bilinear resize: within 1.5); sizes scale by
    W/rand_w."""
    source = make_source(box_layer(box_db, batch=3), "TRAIN", seed=4)
    seen = 0
    for _ in range(4):
        data, label = source.next_batch()
        for item in range(3):
            rows = label[item].reshape(30, 5)
            rows = rows[rows[:, 3] != 0]
            assert len(rows) >= 1
            for cls, x, y, w, _ in rows:
                match = [b for b in BOXES[seen % 3] if b[0] == cls][0]
                col, row = int(round(x * SIZE)), int(round(y * SIZE))
                if col < SIZE and row < SIZE:
                    assert abs(data[item, 0, row, col] - int(F(match[2]) * SIZE)) <= 1.5
                    assert abs(data[item, 1, row, col] - int(F(match[3]) * SIZE)) <= 1.5
                assert w >= int(F(match[4]) * SIZE) / (SIZE - 1) - 1e-6
            seen += 1
    source.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_the_same_bytes_with_workers_and_on_resume(box_db, workers):
    text = box_layer(box_db, batch=2)
    source = make_source(text, "TRAIN", seed=3)
    want, states = [], []
    for _ in range(4):  # past a wrap-around (3 records)
        want.append([a.copy() for a in source.next_batch()])
        states.append(plain(source.get_state()))
    source.close()
    with Prefetcher(make_source(text, "TRAIN", seed=3), 2, workers=workers) as reader:
        for batch, state in zip(want, states, strict=True):
            got = reader.next_batch()
            assert all(np.asarray(g).tobytes() == w.tobytes() for g, w in zip(got, batch))
            assert plain(reader.get_state()) == state
    resumed = make_source(text, "TRAIN", seed=11)
    resumed.set_state(states[1])
    for batch in want[2:]:
        assert all(g.tobytes() == w.tobytes() for g, w in zip(resumed.next_batch(), batch))
    resumed.close()


@pytest.mark.parametrize(
    ("records", "message"),
    (
        ([box_datum(coordinate_image(), BOXES[0], encoded=False)], "BoxData reads encoded"),
        ([box_datum(coordinate_image(), [1, 0, 0.5, 0.5, 0.2])], "float_data holds 5 values"),
        ([box_datum(coordinate_image(), [[1, 0, 0.5, 0.5, 0.1, 0.1]] * 31)],
         "31 boxes; BoxData's label holds 30"),
        ([box_datum(coordinate_image(), [-1, 0, 0.5, 0.5, 0.2, 0.2])], "a negative class"),
    ),
)  # fmt: skip
def test_bad_records_are_one_line_naming_the_record(tmp_path, records, message):
    db = write_boxes(tmp_path / "bad", records)
    with pytest.raises(DataError, match=message) as err:
        make_source(box_layer(db), "TEST")
    assert "\n" not in str(err.value) and "record '00000000'" in str(err.value)


def test_a_record_no_crop_can_keep_is_refused_in_train(tmp_path):
    db = write_boxes(
        tmp_path / "edge", [box_datum(coordinate_image(), [1, 0, 0.99, 0.5, 0.1, 0.1])]
    )
    source = make_source(box_layer(db, batch=1), "TRAIN")
    with pytest.raises(DataError, match="no crop keeps a box .the fork would draw forever"):
        source.next_batch()
    source.close()
    test = make_source(box_layer(db, batch=1), "TEST")  # TEST reads it as it is
    assert test.next_batch()[1][0, 1] == F(0.99)
    test.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    (
        ({"transform": "crop_size: 20"}, "crop_size/mirror are not supported"),
        ({"transform": "mirror: true"}, "crop_size/mirror are not supported"),
        ({"sides": (13, 7), "tops": 2}, "2 tops for 2 data_param.side"),
        ({"sides": (), "tops": 3}, "3 tops for 1 data_param.side"),
    ),
)
def test_layer_refusals(box_db, kwargs, message):
    with pytest.raises(DataError, match=message):
        make_source(box_layer(box_db, **kwargs), "TRAIN")


BIASES = " ".join(f"biases: {b}" for b in (1.08, 1.19, 3.42, 4.41, 6.63, 11.38, 9.42, 5.11,
                                             16.62, 10.52))  # fmt: skip


def _conv(name, bottom, out, kernel=3):
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
            f"convolution_param {{ num_output: {out} kernel_size: {kernel} pad: {kernel // 2} "
            'weight_filler { type: "xavier" } } }\n')  # fmt: skip


def _block(i, bottom, out):
    return (_conv(f"conv{i}", bottom, out)
            + f'layer {{ name: "relu{i}" type: "ReLU" bottom: "conv{i}" top: "conv{i}" '
              "relu_param { negative_slope: 0.1 } }\n"
            + f'layer {{ name: "pool{i}" type: "Pooling" bottom: "conv{i}" top: "pool{i}" '
              "pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n")  # fmt: skip


def yolov2_train_net(db) -> str:
    """BoxData (24×24 crops, side 3) → three darknet blocks → 1×1 conv to 5·(5 + 2) →
    gklz1982's RegionLoss."""
    data = ('layer { name: "data" type: "BoxData" top: "data" top: "label" '
            "include { phase: TRAIN } transform_param { scale: 0.00390625 } "
            f'data_param {{ source: "{db}" batch_size: 2 backend: LMDB side: 3 }} '
            "}\n")  # fmt: skip
    body = _block(1, "data", 8) + _block(2, "pool1", 16) + _block(3, "pool2", 16)
    loss = ('layer { name: "region_loss" type: "RegionLoss" bottom: "head" bottom: "label" '
            'top: "loss" region_loss_param { side: 3 num_class: 2 coords: 4 num: 5 '
            "object_scale: 5 noobject_scale: 1 class_scale: 1 coord_scale: 1 thresh: 0.6 "
            f"{BIASES} }} }}\n")  # fmt: skip
    return 'name: "tiny-yolov2"\n' + data + body + _conv("head", "pool3", 35, 1) + loss


def test_a_yolov2_net_trains_from_the_cli(tmp_path):
    """`caffe2jax train` on a BoxData LMDB: the net reads as gklz1982's (BoxData), its
    RegionLoss is form yolov2, 12 SGD iterations run, every loss finite, weights written."""
    rng = np.random.default_rng(9)
    records = []
    for i in range(6):
        image = rng.integers(0, 255, (3, 24, 24)).astype(np.uint8)
        boxes = [[i % 2, 0, 0.3 + 0.07 * i, 0.6 - 0.05 * i, 0.3, 0.4],
                 [1 - i % 2, 0, 0.7, 0.25, 0.2, 0.2]]  # fmt: skip
        records.append(box_datum(image, boxes))
    db = write_boxes(tmp_path / "train_lmdb", records)
    (tmp_path / "train.prototxt").write_text(yolov2_train_net(db))
    shapes = {"data": (2, 3, 24, 24), "label": (2, 150)}
    model = compile_net(tmp_path / "train.prototxt", phase="TRAIN", input_shapes=shapes)
    assert model.net.dialect == "yolov2" and model.net.layer("region_loss").form == "yolov2"
    (tmp_path / "solver.prototxt").write_text(
        'net: "train.prototxt" base_lr: 0.001 lr_policy: "fixed" momentum: 0.9 max_iter: 12 '
        'display: 1 weight_decay: 0.0005 snapshot_prefix: "tiny" random_seed: 1\n'
    )
    proc = run_cli("train", "--solver", tmp_path / "solver.prototxt", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    losses = [float(v) for v in re.findall(r"Iteration \d+ .*loss = (\S+)", proc.stderr)]
    assert len(losses) >= 12 and np.isfinite(losses).all(), proc.stderr[-2000:]
    assert (tmp_path / "tiny_iter_12.caffemodel").is_file()


def test_a_bad_record_stops_the_cli_in_one_line(tmp_path):
    """A record that is not encoded: `caffe2jax train` exits 1 with one line naming it."""
    db = write_boxes(tmp_path / "raw_lmdb", [box_datum(coordinate_image(24), BOXES[0], False)])
    (tmp_path / "train.prototxt").write_text(yolov2_train_net(db))
    (tmp_path / "solver.prototxt").write_text(
        'net: "train.prototxt" base_lr: 0.001 lr_policy: "fixed" max_iter: 2\n'
    )
    proc = run_cli("train", "--solver", tmp_path / "solver.prototxt", cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("caffe2jax train: error: ") and "record '00000000'" in last, last
    assert "BoxData reads encoded images" in last
