"""The digits example trained by `caffe2jax train`, exported by `caffe2jax export` as ONNX, and
scored by onnxruntime on the test set with the accuracy caffe2jax reports for each batch.

The TEST net exports whole (its Data layer's tops are the model's inputs, its Accuracy and
SoftmaxWithLoss layers are in the graph); the batches are what caffe2jax's data layer reads
(transform_param applied), taken through pycaffe's Net as a user would.
"""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest

import caffe2jax as caffe
from tests import cli_runner
from tests.golden import ROOT
from tests.runtime.onnx import onnx_runs

DIGITS = ROOT / "examples" / "digits"
BATCHES = 3  # 3 × 120 = the 360 test digits


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("digits")
    for name in ("lenet_solver.prototxt", "lenet_train_test.prototxt"):
        shutil.copy(DIGITS / name, work / name)
    for name in ("digits_train_lmdb", "digits_test_lmdb"):
        (work / name).symlink_to(DIGITS / name)
    run = cli_runner.run_cli("train", "--solver", work / "lenet_solver.prototxt",
                             "--iterations", "200", "--progress", "log", cwd=work)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return work, work / "lenet_digits_iter_200.caffemodel"


def test_trained_digits_score_the_same_in_onnxruntime(trained):
    work, weights = trained
    net_file = work / "lenet_train_test.prototxt"
    out = work / "digits.onnx"
    run = cli_runner.run_cli("export", "--model", net_file, "--weights", weights, "--out", out,
                             cwd=work)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "ONNX opset 17" in run.stdout
    proto = onnx.load(out)
    assert {o.name for o in proto.graph.output} == {"accuracy", "loss"}
    net = caffe.Net(str(net_file), str(weights), caffe.TEST)
    scores, ours = [], []
    for _ in range(BATCHES):
        net.forward()
        batch = {k: net.blobs[k].data.copy() for k in ("data", "label")}
        got = onnx_runs.run(proto, batch)
        ours.append(float(net.blobs["accuracy"].data))
        assert got["accuracy"] == pytest.approx(ours[-1], abs=1e-7)
        assert got["loss"] == pytest.approx(float(net.blobs["loss"].data), rel=1e-5)
        scores.append(float(got["accuracy"]))
    # what `caffe2jax test` reports: the mean of the batches' accuracies, caffe2jax's own
    assert np.mean(scores) == pytest.approx(np.mean(ours), abs=1e-7)
    assert np.mean(scores) > 0.8
