"""Every prototxt Caffe ships (../shared/caffe/models) goes through the whole frontend."""

from __future__ import annotations

from collections import Counter

import pytest

from caffe2jax.frontend.parse import read_solver
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.frontend.upgrade import upgrade_solver
from tests.golden import MODELS, require

ALL = sorted(require(MODELS).rglob("*.prototxt"))
NETS = [p for p in ALL if "solver" not in p.name]
SOLVERS = [p for p in ALL if "solver" in p.name]


def _id(path):
    return str(path.relative_to(MODELS))


def test_the_model_zoo_is_all_there():
    assert len(NETS) >= 25 and len(SOLVERS) >= 20


# Nets whose TEST data layers are selected by a stage (Caffe needs the stage too).
TEST_STAGES = {"mnist_autoencoder.prototxt": ["test-on-test"]}


@pytest.mark.parametrize("path", NETS, ids=_id)
@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_net_builds_in_both_phases(path, phase):
    stages = TEST_STAGES.get(path.name, []) if phase == "TEST" else []
    net = load_net(path, phase, stages=stages)
    assert net.phase == phase and net.layers
    produced = {t for layer in net.layers for t in layer.tops}
    assert all(b in produced for layer in net.layers for b in layer.bottoms)
    for layer in net.layers:
        for rule in layer.param.include:
            assert not rule.HasField("phase") or rule.phase == (0 if phase == "TRAIN" else 1)


@pytest.mark.parametrize("path", SOLVERS, ids=_id)
def test_solver_parses_and_upgrades(path):
    solver = upgrade_solver(read_solver(path))
    assert solver.type in {"SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"}
    assert not solver.HasField("solver_type")


def types(path, phase):
    return Counter(layer.type for layer in load_net(MODELS / path, phase).layers)


def test_lenet_phases():
    train = types("examples/mnist/lenet_train_test.prototxt", "TRAIN")
    test = types("examples/mnist/lenet_train_test.prototxt", "TEST")
    assert "Accuracy" not in train and test["Accuracy"] == 1
    assert train["Data"] == test["Data"] == 1
    assert train["SoftmaxWithLoss"] == test["SoftmaxWithLoss"] == 1


def test_googlenet_phases():
    train = types("models/bvlc_googlenet/train_val.prototxt", "TRAIN")
    test = types("models/bvlc_googlenet/train_val.prototxt", "TEST")
    assert test["Accuracy"] == 6 and test["SoftmaxWithLoss"] == 3
    assert train["SoftmaxWithLoss"] == 3 and "Accuracy" not in train
    assert train["Data"] == test["Data"] == 1


def test_the_other_phases_data_layer_is_gone():
    path = MODELS / "models/bvlc_alexnet/train_val.prototxt"
    train = load_net(path, "TRAIN").layer("data").param
    test = load_net(path, "TEST").layer("data").param
    assert train.transform_param.mirror and not test.transform_param.mirror
    assert train.data_param.source != test.data_param.source


def test_v1_net_inside_a_solver_is_upgraded():
    solver = read_solver(MODELS / "examples/mnist/lenet_consolidated_solver.prototxt")
    assert solver.net_param.layers and not solver.net_param.layer
    net = load_net(solver.net_param, "TRAIN")
    assert [layer.type for layer in net.layers] == [
        "Data", "Convolution", "Pooling", "Convolution", "Pooling", "InnerProduct", "ReLU",
        "InnerProduct", "Accuracy", "SoftmaxWithLoss",
    ]  # fmt: skip


def test_stage_selects_the_autoencoders_test_data():
    path = MODELS / "examples/mnist/mnist_autoencoder.prototxt"
    on_train = load_net(path, "TEST", stages=["test-on-train"]).layer("data").param
    on_test = load_net(path, "TEST", stages=["test-on-test"]).layer("data").param
    assert on_train.data_param.source.endswith("train_lmdb")
    assert on_test.data_param.source.endswith("test_lmdb")
