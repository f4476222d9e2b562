"""``compare`` (runtime/onnx/compare.py, `caffe2jax compare`): it finds planted faults in an
ONNX model — a flipped ceil mode, an input fed BGR for RGB, a wrong LRN alpha — naming the
first blob that diverges, and reports agreement on a faithful export (and with OpenCV 4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from caffe2jax.runtime.formats.weights import save_weights
from caffe2jax.runtime.onnx import save_onnx
from caffe2jax.runtime.onnx.compare import compare_onnx, compare_opencv
from tests import cli_runner
from tests.runtime.onnx import onnx_runs
from tests.runtime.onnx.small_nets import net_text, random_inputs, random_model

LAYERS = """
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 8 kernel_size: 3 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "norm1" type: "LRN" bottom: "conv1" top: "norm1"
        lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 } }
layer { name: "pool1" type: "Pooling" bottom: "norm1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 6 kernel_size: 1 } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "fc" type: "InnerProduct" bottom: "pool2" top: "fc"
        inner_product_param { num_output: 5 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


@pytest.fixture(scope="module")
def small():
    """The net (16×16 conv1: pool1 is 8×8 by Caffe's ceil, 7×7 by floor; a global pooling
    after it, so that a floor-mode pool1 still runs), weights, an input."""
    model, params, state = random_model(net_text(LAYERS, {"data": (1, 3, 18, 18)}))
    inputs = random_inputs(model, low=0.0, high=1.0)
    return model, params, state, inputs, onnx_runs.export(model, params, state)


def _node(proto: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    return next(n for n in proto.graph.node if n.op_type == op_type)


def floor_mode(proto):
    """The MaxPool without the end padding that gives Caffe's ceil rounding."""
    pool = _node(proto, "MaxPool")
    pads = next(a for a in pool.attribute if a.name == "pads")
    pads.ints[2:] = [0, 0]


def bgr(proto):
    """conv1 reads the input with its channels reversed."""
    conv = _node(proto, "Conv")
    conv.input[0] = "data_bgr"
    steps = [helper.make_tensor(n, onnx.TensorProto.INT64, [1], [v])
             for n, v in (("s", 2), ("e", -4), ("a", 1), ("t", -1))]  # fmt: skip
    proto.graph.initializer.extend(steps)
    flip = helper.make_node("Slice", ["data", "s", "e", "a", "t"], ["data_bgr"])
    proto.graph.node.insert(0, flip)


def lrn_alpha(proto):
    alpha = next(a for a in _node(proto, "LRN").attribute if a.name == "alpha")
    alpha.f *= 2


@pytest.mark.parametrize(("fault", "blob"), [(floor_mode, "pool1"), (bgr, "conv1@conv1"),
                                              (lrn_alpha, "norm1")])  # fmt: skip
def test_compare_names_the_first_diverging_blob(small, fault, blob):
    model, params, state, inputs, proto = small
    faulty = onnx.ModelProto()
    faulty.CopyFrom(proto)
    fault(faulty)
    report = compare_onnx(model, params, state, inputs, faulty)
    bad = report.first_divergence
    assert bad is not None and bad.blob == blob, report.summary()
    before = report.blobs[: report.blobs.index(bad)]
    assert all(not b.diverges(report.tolerance) for b in before)
    assert f"first divergence at blob '{blob}'" in report.summary()


def test_a_faithful_export_agrees_everywhere(small):
    model, params, state, inputs, proto = small
    report = compare_onnx(model, params, state, inputs, proto)
    assert report.first_divergence is None
    assert [b.blob for b in report.blobs] == ["conv1@conv1", "conv1", "norm1", "pool1", "conv2",
                                              "pool2", "fc", "prob"]  # fmt: skip
    assert max(b.max_rel for b in report.blobs) <= 1e-5


def test_opencv_agrees_too(small, tmp_path):
    model, params, state, inputs, _ = small
    prototxt = tmp_path / "net.prototxt"
    prototxt.write_text(net_text(LAYERS, {"data": (1, 3, 18, 18)}))
    report = compare_opencv(model, params, state, inputs, prototxt)
    assert report.first_divergence is None, report.summary()
    assert {b.blob for b in report.blobs} >= {"norm1", "pool1", "prob"}


def test_cli_compare_exits_2_naming_the_blob(small, tmp_path):
    model, params, state, inputs, proto = small
    prototxt = tmp_path / "net.prototxt"
    prototxt.write_text(net_text(LAYERS, {"data": (1, 3, 18, 18)}))
    weights = save_weights(tmp_path / "w.caffemodel", model, params, state)
    faulty = onnx.ModelProto()
    faulty.CopyFrom(proto)
    lrn_alpha(faulty)
    save_onnx(tmp_path / "faulty.onnx", faulty)
    np.save(tmp_path / "x.npy", inputs["data"])
    args = ["--model", prototxt, "--weights", weights, "--input", f"data={tmp_path / 'x.npy'}"]
    bad = cli_runner.run_cli("compare", *args, "--onnx", tmp_path / "faulty.onnx")
    assert bad.returncode == 2, bad.stderr
    assert "first divergence at blob 'norm1' (layer 'norm1', type LRN)" in bad.stdout
    good = cli_runner.run_cli("compare", *args, "--opencv")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "onnxruntime: all 8 blobs agree" in good.stdout
    assert "OpenCV 4" in good.stdout


def test_cli_compare_reads_a_data_layers_shapes_from_its_source_as_export_does(tmp_path):
    """A train_val prototxt whose input is a Data layer (the digits example's LMDB): `compare`
    takes the TEST net's shapes from the source, as `export` does (it used to ask for
    input_shapes), and the export of that net agrees blob by blob."""
    import caffe2jax

    root = Path(__file__).resolve().parents[3]
    prototxt = root / "examples/digits/lenet_train_test.prototxt"
    model = caffe2jax.compile(str(prototxt), input_shapes={"data": (120, 1, 8, 8), "label": (120,)})
    params, state = model.init(0)
    weights = save_weights(tmp_path / "w.caffemodel", model, params, state)
    exported = cli_runner.run_cli("export", "--model", prototxt, "--weights", weights,
                                  "--out", tmp_path / "lenet.onnx")  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    proc = cli_runner.run_cli("compare", "--model", prototxt, "--weights", weights,
                              "--onnx", tmp_path / "lenet.onnx")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "onnxruntime: all 9 blobs agree" in proc.stdout
