"""`caffe2jax export` writing ONNX (caffe2jax/cli/export.py): the format from the extension or
--format, --input-shape, --dynamic-batch, --opset, --output; a layer with no ONNX form is one
line naming file:line, layer and type, and nothing is written."""

from __future__ import annotations

import numpy as np
import onnx

import caffe2jax
from caffe2jax.runtime.formats.weights import load_weights, save_weights
from tests import cli_runner
from tests.golden import GOLDEN, require
from tests.runtime.onnx import onnx_runs

NETS = require(GOLDEN / "nets")
LENET = ("--model", NETS / "lenet_deploy.prototxt", "--weights", NETS / "lenet_deploy.caffemodel")


def run_cli(*args):
    return cli_runner.run_cli("export", *args)


def test_export_onnx_with_a_dynamic_batch(tmp_path):
    out = tmp_path / "lenet.onnx"
    result = run_cli(*LENET, "--out", out, "--input-shape", "data=2,1,28,28", "--dynamic-batch")
    assert result.returncode == 0, result.stderr
    assert f"Wrote {out}: ONNX opset 17, inputs {{'data': ['N', 1, 28, 28]}}" in result.stdout
    proto = onnx.load(out)
    onnx.checker.check_model(proto, full_check=True)
    model = caffe2jax.compile(NETS / "lenet_deploy.prototxt", input_shapes={"data": (3, 1, 28, 28)})
    params, state = load_weights(NETS / "lenet_deploy.caffemodel", model)
    x = np.random.default_rng(0).uniform(0, 1, (3, 1, 28, 28)).astype(np.float32)
    expected = onnx_runs.reference(model, params, state, {"data": x})["prob"]
    got = onnx_runs.run(proto, {"data": x})["prob"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_format_flag_opset_and_outputs(tmp_path):
    out = tmp_path / "lenet.bin"
    result = run_cli(*LENET, "--out", out, "--format", "onnx", "--opset", "20",
                     "--output", "ip1")  # fmt: skip
    assert result.returncode == 0, result.stderr
    proto = onnx.load(out)
    assert proto.opset_import[0].version == 20
    assert [o.name for o in proto.graph.output] == ["ip1"]
    # ip1 after its in-place ReLU (Caffe's blob ip1); ip2 and prob are left out
    assert {n.op_type for n in proto.graph.node} == {"Conv", "MaxPool", "Flatten", "Gemm", "Relu"}
    bad = run_cli(*LENET, "--out", tmp_path / "x.onnx", "--opset", "9")
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "caffe2jax export: error: opset 9 is not supported: use 13 to "
        f"{onnx.defs.onnx_opset_version()}"
    ]


def test_a_layer_with_no_onnx_form_is_one_line_and_writes_nothing(tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text(
        'name: "n"\n'
        'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 4 } } }\n'
        'layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc"\n'
        "        inner_product_param { num_output: 3 } }\n"
        'layer { name: "drop" type: "Python" bottom: "fc" top: "out"\n'
        '        python_param { module: "spatial_dropout" layer: "SpatialDropoutLayer"\n'
        "                       param_str: \"{'phase': 'TRAIN', 'p': 0.5}\" } }\n"
    )
    model = caffe2jax.compile(net)
    weights = save_weights(tmp_path / "w.caffemodel", model, *model.init(0))
    out = tmp_path / "net.onnx"
    result = run_cli("--model", net, "--weights", weights, "--out", out)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"caffe2jax export: error: {net}:5: layer 'drop' (type "
        "Python:spatial_dropout.SpatialDropoutLayer): its param_str phase is TRAIN: it drops "
        "random channels on every forward"
    ]
    assert sorted(tmp_path.iterdir()) == sorted([net, weights])  # no file, no temp file
