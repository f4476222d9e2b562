"""Parsing prototxt text and binary NetParameters, with file:line:col errors."""

from __future__ import annotations

import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import PrototxtError
from caffe2jax.frontend.parse import read_net, read_solver
from tests.golden import GOLDEN, MODELS

LENET = MODELS / "examples/mnist/lenet_train_test.prototxt"


def test_text_path_and_string_agree():
    from_path = read_net(LENET)
    assert from_path == read_net(LENET.read_text())
    assert from_path.name == "LeNet" and len(from_path.layer) == 11


def test_binary_net_parameter(tmp_path):
    path = tmp_path / "lenet.binaryproto"
    path.write_bytes(read_net(LENET).SerializeToString())
    assert read_net(path) == read_net(LENET)
    assert read_net(path.read_bytes()) == read_net(LENET)


def test_caffemodel_is_a_binary_net():
    net = read_net(GOLDEN / "nets/lenet_train.caffemodel")
    assert any(layer.blobs for layer in net.layer)


def error_of(text: str, tmp_path) -> str:
    path = tmp_path / "net.prototxt"
    path.write_text(text)
    with pytest.raises(PrototxtError) as err:
        read_net(path)
    message = str(err.value)
    assert "\n" not in message
    return message.replace(str(path), "net.prototxt")


def test_unknown_field_names_position_and_suggests(tmp_path):
    message = error_of('name: "x"\nlayer {\n  name: "a"\n  typ: "ReLU"\n}\n', tmp_path)
    assert message.startswith("net.prototxt:4:3: layer 'a': unknown layer parameter or field 'typ'")
    assert "did you mean 'type'" in message and "'typ'" in message


def test_unknown_layer_parameter(tmp_path):
    message = error_of('layer { name: "a" convolution_parm { } }', tmp_path)
    assert message.startswith("net.prototxt:1:")
    assert "convolution_parm" in message and "convolution_param" in message


def test_unknown_field_inside_a_parameter_message(tmp_path):
    message = error_of("layer { convolution_param { num_outputs: 3 } }", tmp_path)
    assert "unknown field 'num_outputs' in ConvolutionParameter" in message
    assert "num_output" in message


def test_wrong_value_type(tmp_path):
    message = error_of('layer { convolution_param { num_output: "three" } }', tmp_path)
    assert message.startswith("net.prototxt:1:") and "three" in message


def test_truncated_file(tmp_path):
    message = error_of('name: "x"\nlayer {\n  name: "a"\n', tmp_path)
    assert message.startswith("net.prototxt:")


def test_not_a_binary_net(tmp_path):
    path = tmp_path / "garbage.caffemodel"
    path.write_bytes(b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x02")
    with pytest.raises(PrototxtError, match="not a binary NetParameter"):
        read_net(path)


def test_missing_file(tmp_path):
    with pytest.raises(PrototxtError, match="file not found"):
        read_net(tmp_path / "nope.prototxt")


def test_solver_text():
    solver = read_solver(MODELS / "examples/mnist/lenet_solver.prototxt")
    assert isinstance(solver, caffe_pb2.SolverParameter)
    assert solver.base_lr == pytest.approx(0.01) and solver.lr_policy == "inv"
