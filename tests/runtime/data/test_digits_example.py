"""The shipped examples/digits data set and its prototxts feed through the pipeline."""

from __future__ import annotations

import numpy as np
from google.protobuf import text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.runtime.data.records.datum import datum_to_array, parse_datum, read_blobproto
from caffe2jax.runtime.data.records.db import open_db
from caffe2jax.runtime.data.sources import make_source
from caffe2jax.runtime.tools.imageset import compute_image_mean
from tests.golden import ROOT

DIGITS = ROOT / "examples" / "digits"


def _net() -> caffe_pb2.NetParameter:
    text = (DIGITS / "lenet_train_test.prototxt").read_text()
    return text_format.Parse(text, caffe_pb2.NetParameter())


def test_databases_hold_the_split():
    counts = {}
    for subset in ("train", "test"):
        db = open_db(DIGITS / f"digits_{subset}_lmdb")
        labels = []
        for key, value in db.items():
            datum = parse_datum(value)
            pixels = datum_to_array(datum)
            assert pixels.shape == (1, 8, 8) and pixels.dtype == np.uint8 and pixels.max() <= 16
            assert key.decode().startswith(f"{len(labels):08d}_{subset}/")
            labels.append(datum.label)
        db.close()
        counts[subset] = np.bincount(labels, minlength=10)
        assert set(labels) == set(range(10))
    assert counts["train"].sum() == 1437 and counts["test"].sum() == 360
    size = sum(f.stat().st_size for f in DIGITS.rglob("*") if f.is_file())
    assert size <= 2 * 1024 * 1024


def test_mean_file_is_the_training_mean():
    mean = read_blobproto(DIGITS / "digits_mean.binaryproto")
    assert mean.shape == (1, 1, 8, 8)
    assert np.array_equal(mean, compute_image_mean(DIGITS / "digits_train_lmdb"))


def test_train_and_test_layers_feed_scaled_batches():
    net = _net()
    data_layers = [layer for layer in net.layer if layer.type == "Data"]
    phases = [caffe_pb2.Phase.Name(layer.include[0].phase) for layer in data_layers]
    assert phases == ["TRAIN", "TEST"]
    expected = {"TRAIN": [(64, 1, 8, 8), (64,)], "TEST": [(120, 1, 8, 8), (120,)]}
    for layer, phase in zip(data_layers, phases, strict=True):
        with make_source(layer, phase, base_dir=DIGITS, seed=0) as source:
            assert source.top_shapes() == expected[phase]
            data, labels = source.next_batch()
            assert 0.0 <= data.min() and data.max() <= 1.0 and data.max() > 0.5
            assert set(labels.astype(int)) <= set(range(10))


def test_solver_tests_every_test_image_once():
    text = (DIGITS / "lenet_solver.prototxt").read_text()
    solver = text_format.Parse(text, caffe_pb2.SolverParameter())
    assert (DIGITS / solver.net).is_file()
    test_batch = next(
        layer.data_param.batch_size
        for layer in _net().layer
        if layer.type == "Data" and layer.include[0].phase == caffe_pb2.TEST
    )
    assert solver.test_iter[0] * test_batch == 360
    assert solver.lr_policy == "inv" and solver.max_iter == 1500
