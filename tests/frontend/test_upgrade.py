"""Caffe's upgrade_proto rules (frontend/upgrade.py, frontend/upgrade_v0.py).

V0/V1-format nets written for these tests (tests/frontend/data/) upgrade to hand-written
current-format nets, compared as whole messages; every prototxt of Caffe's own models upgrades,
current ones unchanged; the BatchNorm upgrade matches what real Caffe wrote into a caffemodel.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import PrototxtError, SolverError
from caffe2jax.frontend.forks.upgrade import FORK_V1_TYPES
from caffe2jax.frontend.parse import read_net, read_solver
from caffe2jax.frontend.upgrade import (
    V1_COPIED_PARAMS,
    V1_LAYER_TYPES,
    net_needs_upgrade,
    solver_needs_upgrade,
    upgrade_net,
    upgrade_solver,
    upgraded_text,
)
from caffe2jax.frontend.upgrade_v0 import V0_IGNORED_FIELDS, V0_LAYER_TYPES
from tests.golden import GOLDEN, MODELS, require

DATA = Path(__file__).parent / "data"
V1 = caffe_pb2.V1LayerParameter


def _net(text: str) -> caffe_pb2.NetParameter:
    return text_format.Parse(text, caffe_pb2.NetParameter())


def _fixture(name: str) -> tuple[caffe_pb2.NetParameter, caffe_pb2.NetParameter]:
    return read_net(DATA / f"{name}.prototxt"), read_net(DATA / f"{name}.expected")


# --------------------------------------------------------------------------------------------
# V1 nets


def test_v1_net_upgrades_to_the_hand_written_current_net():
    v1, expected = _fixture("upgrade_v1_all_types")
    assert upgrade_net(v1, "upgrade_v1_all_types.prototxt") == expected


def test_v1_fixture_uses_every_v1_layer_type():
    v1, _ = _fixture("upgrade_v1_all_types")
    used = {V1.LayerType.Name(layer.type) for layer in v1.layers}
    assert used == set(V1.LayerType.keys()) - set(FORK_V1_TYPES)  # every BVLC V1 type
    assert len(used) == 40


def test_v1_type_strings_are_caffes():
    assert set(V1_LAYER_TYPES) == set(V1.LayerType.keys())
    assert V1_LAYER_TYPES["SOFTMAX_LOSS"] == "SoftmaxWithLoss"
    assert V1_LAYER_TYPES["IM2COL"] == "Im2col"
    assert V1_LAYER_TYPES["NONE"] == ""


def test_every_v1_parameter_message_is_copied():
    structural = {"include", "exclude", "blobs", "layer"}
    messages = {
        f.name
        for f in V1.DESCRIPTOR.fields
        if f.message_type is not None and f.name not in structural
    }
    assert set(V1_COPIED_PARAMS) == messages


def test_param_specs_are_as_many_as_the_longest_v1_list():
    net = _net('layers { name: "ip" type: INNER_PRODUCT param: "w" blobs_lr: 1 blobs_lr: 2 }')
    (layer,) = upgrade_net(net).layer
    assert list(layer.param) == [
        caffe_pb2.ParamSpec(name="w", lr_mult=1),
        caffe_pb2.ParamSpec(lr_mult=2),
    ]


def test_data_layers_keep_params_absent_when_no_data_upgrade_runs():
    net = _net('layers { name: "d" type: DATA top: "x" }')
    (layer,) = upgrade_net(net).layer
    assert not layer.HasField("data_param") and not layer.HasField("transform_param")


# --------------------------------------------------------------------------------------------
# V0 nets


def test_v0_net_upgrades_to_the_hand_written_current_net():
    v0, expected = _fixture("upgrade_v0_net")
    assert upgrade_net(v0, "upgrade_v0_net.prototxt") == expected


def test_v0_fixture_uses_every_v0_type_and_field():
    v0, _ = _fixture("upgrade_v0_net")
    types = {entry.layer.type for entry in v0.layers}
    assert types == set(V0_LAYER_TYPES) | {"padding"}
    fields = {f.name for entry in v0.layers for f, _ in entry.layer.ListFields()}
    assert fields == {f.name for f in caffe_pb2.V0LayerParameter.DESCRIPTOR.fields}
    assert set(V0_IGNORED_FIELDS) <= fields


def test_upgrade_does_not_mutate_its_input():
    for name in ("upgrade_v0_net", "upgrade_v1_all_types"):
        net, _ = _fixture(name)
        before = net.SerializeToString()
        upgrade_net(net)
        assert net.SerializeToString() == before
    solver = caffe_pb2.SolverParameter(solver_type=caffe_pb2.SolverParameter.ADAM)
    upgrade_solver(solver)
    assert solver.HasField("solver_type") and not solver.HasField("type")


# --------------------------------------------------------------------------------------------
# Inputs and BatchNorm

_INPUT_LAYER = """
layer {
  name: "input" type: "Input" top: "a" top: "b"
  input_param { shape { dim: 1 dim: 2 } shape { dim: 3 dim: 4 dim: 5 } }
}
"""
_RELU = 'layer { name: "relu" type: "ReLU" bottom: "a" top: "a" }'


def test_input_shape_becomes_a_first_input_layer():
    net = _net(
        'name: "n" input: "a" input: "b" input_shape { dim: 1 dim: 2 } '
        "input_shape { dim: 3 dim: 4 dim: 5 } " + _RELU
    )
    assert upgrade_net(net) == _net('name: "n" ' + _INPUT_LAYER + _RELU)


def test_input_dim_becomes_a_first_input_layer():
    net = _net('input: "data" input_dim: 10 input_dim: 3 input_dim: 227 input_dim: 227 ' + _RELU)
    expected = _net(
        'layer { name: "input" type: "Input" top: "data" '
        "input_param { shape { dim: 10 dim: 3 dim: 227 dim: 227 } } } " + _RELU
    )
    assert upgrade_net(net) == expected


def test_input_shape_wins_over_input_dim():
    net = _net('input: "a" input_shape { dim: 7 } input_dim: 1 input_dim: 2')
    (layer,) = upgrade_net(net).layer
    assert list(layer.input_param.shape) == [caffe_pb2.BlobShape(dim=[7])]


def test_inputs_without_shapes_are_only_removed():
    net = _net('input: "data" ' + _RELU)
    assert upgrade_net(net) == _net(_RELU)


def test_batch_norm_with_three_param_specs_gets_zero_multipliers():
    net = _net(
        'layer { name: "bn" type: "BatchNorm" param { lr_mult: 0 } param { name: "v" lr_mult: 1 }'
        " param { lr_mult: 0 decay_mult: 3 } }"
        'layer { name: "bn2" type: "BatchNorm" param { lr_mult: 0 } param { lr_mult: 0 } }'
    )
    expected = _net(
        'layer { name: "bn" type: "BatchNorm" param { lr_mult: 0 decay_mult: 0 } '
        'param { name: "v" lr_mult: 0 decay_mult: 0 } param { lr_mult: 0 decay_mult: 0 } }'
        'layer { name: "bn2" type: "BatchNorm" param { lr_mult: 0 } param { lr_mult: 0 } }'
    )
    assert net_needs_upgrade(net)
    assert upgrade_net(net) == expected
    assert not net_needs_upgrade(expected)


def test_batch_norm_upgrade_matches_the_specs_real_caffe_saved():
    """Caffe wrote the upgraded layer parameters into this caffemodel (net.save())."""
    stem = require(GOLDEN / "nets") / "cifar10_full_sigmoid_bn_train"
    upgraded = upgrade_net(read_net(stem.with_suffix(".prototxt")))
    saved = read_net(stem.with_suffix(".caffemodel"))
    specs = {layer.name: list(layer.param) for layer in upgraded.layer if layer.type == "BatchNorm"}
    assert len(specs) == 3
    for layer in saved.layer:
        if layer.type == "BatchNorm":
            assert list(layer.param) == specs[layer.name]


# --------------------------------------------------------------------------------------------
# Refusals


_BAD_NETS = {
    "v0 layer beside v1 fields": (
        'input: "x" layers { layer { name: "r" type: "relu" } name: "r" type: RELU bottom: "x" }',
        ["layer 'r'", "name, type"],
    ),
    "v1 entry in a v0 net": (
        'input: "x" layers { layer { name: "a" type: "relu" } bottom: "x" top: "y" }'
        'layers { name: "b" type: RELU bottom: "y" top: "z" }',
        ["layer 'b'", "V1-format"],
    ),
    "layer and layers": (
        'layer { name: "new" type: "ReLU" } layers { name: "old" type: RELU }',
        ["'new'", "'old'", "mixes"],
    ),
    "too few input_dim": (
        'input: "data" input_dim: 1 input_dim: 3 input_dim: 8',
        ["'data'", "3 input_dim", "expected 4 per input (4)"],
    ),
    "too many input_dim": (
        'input: "a" input: "b" input_dim: 1 input_dim: 1 input_dim: 1 input_dim: 1',
        ["'a', 'b'", "4 input_dim", "(8)"],
    ),
    "input_shape count": ('input: "a" input: "b" input_shape { dim: 1 }', ["1 input_shape"]),
    "unknown v0 type": ('layers { layer { name: "m" type: "mystery" } }', ["'m'", "'mystery'"]),
    "unknown bottom": (
        'layers { layer { name: "r" type: "relu" } bottom: "nowhere" }',
        ["'r'", "unknown bottom blob 'nowhere'"],
    ),
    "v0 field of another type": (
        'input: "x" layers { layer { name: "r" type: "relu" num_output: 3 } bottom: "x" }',
        ["'r'", "'num_output'", "'relu'"],
    ),
    "padding into relu": (
        'input: "x" layers { layer { name: "p" type: "padding" pad: 1 } bottom: "x" top: "y" }'
        'layers { layer { name: "r" type: "relu" } bottom: "y" top: "z" }',
        ["'r'", "non-convolutional / non-pooling layer type 'relu'"],
    ),
    "padding with two bottoms": (
        'input: "x" layers { layer { name: "p" type: "padding" } bottom: "x" bottom: "x" top: "y" }'
        'layers { layer { name: "c" type: "conv" } bottom: "y" top: "z" }',
        ["'c'", "padding layer 'p' must have one bottom and one top"],
    ),
    "padded conv with two bottoms": (
        'input: "x" layers { layer { name: "p" type: "padding" } bottom: "x" top: "y" }'
        'layers { layer { name: "c" type: "conv" } bottom: "y" bottom: "x" top: "z" }',
        ["'c'", "single bottom"],
    ),
}


@pytest.mark.parametrize("case", sorted(_BAD_NETS))
def test_nets_caffe_cannot_upgrade_cleanly_are_refused(case):
    text, fragments = _BAD_NETS[case]
    with pytest.raises(PrototxtError) as err:
        upgrade_net(_net(text), "bad.prototxt")
    message = str(err.value)
    assert message.startswith("bad.prototxt: ") and "\n" not in message
    for fragment in fragments:
        assert fragment in message


# --------------------------------------------------------------------------------------------
# Solvers

_SOLVER_TYPES = [
    ("SGD", "SGD"),
    ("NESTEROV", "Nesterov"),
    ("ADAGRAD", "AdaGrad"),
    ("RMSPROP", "RMSProp"),
    ("ADADELTA", "AdaDelta"),
    ("ADAM", "Adam"),
]


def test_solver_type_table_covers_the_enum():
    assert [name for name, _ in _SOLVER_TYPES] == list(caffe_pb2.SolverParameter.SolverType.keys())


@pytest.mark.parametrize("enum_name, type_string", _SOLVER_TYPES)
def test_solver_type_enum_becomes_type_string(enum_name, type_string):
    solver = read_solver(f"base_lr: 0.1\nsolver_type: {enum_name}\nmax_iter: 3\n")
    assert solver_needs_upgrade(solver)
    expected = read_solver(f'base_lr: 0.1\ntype: "{type_string}"\nmax_iter: 3\n')
    assert upgrade_solver(solver, "s.prototxt") == expected
    assert not solver_needs_upgrade(expected)


@pytest.mark.parametrize("type_string", ["SGD", "Adam"])
def test_solver_type_and_type_together_are_refused(type_string):
    solver = read_solver(f'solver_type: SGD\ntype: "{type_string}"\n')
    with pytest.raises(SolverError, match=r"^s\.prototxt: both .*solver_type: SGD"):
        upgrade_solver(solver, "s.prototxt")


def test_inline_solver_nets_are_upgraded_only_on_request():
    solver = read_solver('type: "SGD" net_param { layers { name: "r" type: RELU } }')
    assert not solver_needs_upgrade(solver)
    assert solver_needs_upgrade(solver, nets=True)
    assert upgrade_solver(solver) == solver
    upgraded = upgrade_solver(solver, nets=True)
    assert upgraded == read_solver('type: "SGD" net_param { layer { name: "r" type: "ReLU" } }')


# --------------------------------------------------------------------------------------------
# Text and needs-upgrade


def test_upgraded_text_is_the_upgraded_message_as_prototxt():
    v1, expected = _fixture("upgrade_v1_all_types")
    assert read_net(upgraded_text(v1)) == expected
    solver = read_solver('solver_type: ADAM net_param { layers { name: "r" type: RELU } }')
    text = upgraded_text(solver)
    assert read_solver(text) == upgrade_solver(solver, nets=True)
    assert 'type: "Adam"' in text and "layers" not in text
    with pytest.raises(TypeError):
        upgraded_text(caffe_pb2.LayerParameter())


@pytest.mark.parametrize(
    "text",
    [
        'layers { layer { name: "r" type: "relu" } }',
        'layers { name: "r" type: RELU }',
        'input: "data"',
        'layer { type: "BatchNorm" param {} param {} param {} }',
    ],
)
def test_net_needs_upgrade(text):
    assert net_needs_upgrade(_net(text))
    assert not net_needs_upgrade(upgrade_net(_net(text)))


# --------------------------------------------------------------------------------------------
# Caffe's own prototxts


def _model_files() -> list[Path]:
    return sorted(MODELS.rglob("*.prototxt"))


def _model_id(path: Path) -> str:
    return str(path.relative_to(MODELS))


def test_model_prototxts_present():
    assert len(list(require(MODELS).rglob("*.prototxt"))) >= 50


def test_only_two_models_need_an_upgrade():
    need = set()
    for path in _model_files():
        if "solver" in path.name:
            needs = solver_needs_upgrade(read_solver(path), nets=True)
        else:
            needs = net_needs_upgrade(read_net(path))
        if needs:
            need.add(path.name)
    assert need == {
        "cifar10_full_sigmoid_train_test_bn.prototxt",
        "lenet_consolidated_solver.prototxt",
    }


@pytest.mark.parametrize("path", _model_files(), ids=_model_id)
def test_model_prototxt_upgrades(path):
    if "solver" in path.name:
        solver = read_solver(path)
        upgraded = upgrade_solver(solver, str(path), nets=True)
        assert (upgraded == solver) != solver_needs_upgrade(solver, nets=True)
        assert not solver_needs_upgrade(upgraded, nets=True)
    else:
        net = read_net(path)
        upgraded = upgrade_net(net, str(path))
        assert (upgraded == net) != net_needs_upgrade(net)
        assert not net_needs_upgrade(upgraded)
        assert upgrade_net(upgraded) == upgraded


def test_the_v1_model_upgrades_to_current_layer_types():
    solver = read_solver(
        require(MODELS / "examples" / "mnist" / "lenet_consolidated_solver.prototxt")
    )
    assert len(solver.net_param.layers) == 12 and not solver.net_param.layer
    net = upgrade_solver(solver, nets=True).net_param
    assert not net.layers
    types = [layer.type for layer in net.layer]
    assert types == ["Data"] * 3 + ["Convolution", "Pooling", "Convolution", "Pooling"] + [
        "InnerProduct",
        "ReLU",
        "InnerProduct",
        "Accuracy",
        "SoftmaxWithLoss",
    ]
    conv1 = net.layer[3]
    assert list(conv1.param) == [caffe_pb2.ParamSpec(lr_mult=1), caffe_pb2.ParamSpec(lr_mult=2)]
    assert [layer.include[0].stage for layer in net.layer[1:3]] == [
        ["test-on-test-set"],
        ["test-on-train-set"],
    ]
