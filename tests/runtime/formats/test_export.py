"""`caffe2jax export` and runtime.export: a net's forward as serialized StableHLO."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import export

import caffe2jax
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.runtime.formats.export import describe, export_forward, load_exported, save_exported
from caffe2jax.runtime.formats.weights import load_weights
from tests import cli_runner
from tests.golden import GOLDEN, require

jax.config.update("jax_default_matmul_precision", "highest")

NETS = require(GOLDEN / "nets")


def test_exported_forward_equals_apply(tmp_path):
    model = caffe2jax.compile(NETS / "cifar10_quick_deploy.prototxt")
    params, state = load_weights(NETS / "cifar10_quick_deploy.caffemodel", model)
    path = save_exported(tmp_path / "cifar.jaxexport", export_forward(model, params, state))
    forward = export.deserialize(bytearray(path.read_bytes()))  # plain JAX, no caffe2jax
    x = np.random.default_rng(0).uniform(0, 1, (2, 3, 32, 32)).astype(np.float32)
    out = forward.call({"data": x})
    assert set(out) == {"prob"}
    expected = model.apply(params, state, {"data": x})[0]["prob"]
    np.testing.assert_allclose(out["prob"], expected, rtol=1e-6, atol=1e-7)
    info = describe(load_exported(path))
    assert info["inputs"] == {"data": (2, 3, 32, 32)} and info["outputs"] == {"prob": (2, 10)}


def run_cli(*args):
    return cli_runner.run_cli("export", *args)


def test_cli_export_with_input_shape_and_two_platforms(tmp_path):
    out = tmp_path / "lenet.jaxexport"
    result = run_cli(
        "--model", NETS / "lenet_deploy.prototxt", "--weights", NETS / "lenet_deploy.caffemodel",
        "--out", out, "--input-shape", "data=1,1,28,28", "--platform", "cpu", "--platform", "cuda",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    forward = load_exported(out)
    assert tuple(forward.platforms) == ("cpu", "cuda")
    model = caffe2jax.compile(NETS / "lenet_deploy.prototxt", input_shapes={"data": (1, 1, 28, 28)})
    params, state = load_weights(NETS / "lenet_deploy.caffemodel", model)
    x = np.random.default_rng(1).uniform(0, 1, (1, 1, 28, 28)).astype(np.float32)
    expected = model.apply(params, state, {"data": x})[0]["prob"]
    np.testing.assert_allclose(forward.call({"data": x})["prob"], expected, rtol=1e-6, atol=1e-7)


def test_cli_export_errors_are_one_line(tmp_path):
    result = run_cli(
        "--model", NETS / "lenet_deploy.prototxt", "--weights", tmp_path / "missing.caffemodel",
        "--out", tmp_path / "x.jaxexport",
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"caffe2jax export: error: {tmp_path / 'missing.caffemodel'}: no such weights file"
    ]
    assert not (tmp_path / "x.jaxexport").exists()


def test_load_exported_rejects_other_files(tmp_path):
    (tmp_path / "x").write_bytes(b"not a module")
    with pytest.raises(CaffeError, match="not a serialized jax.export module"):
        load_exported(tmp_path / "x")


MID_NET = """name: "mid"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 16 dim: 40 dim: 40 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 48 kernel_size: 3 pad: 1
                            weight_filler { type: "msra" } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "pool1" top: "fc"
        inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def test_a_net_above_onednns_size_rule_exports_and_equals_apply(tmp_path):
    """conv1 (2·48·1600·144 = 22M multiply-adds) is over oneDNN's 16M rule, so the default CPU
    policy runs it through oneDNN's foreign call, which a serialized module cannot hold: the
    export traces with XLA's own convolution and computes the same forward."""
    from caffe2jax.lowering.engines import onednn

    model = caffe2jax.compile(MID_NET)
    if onednn.available() is None and jax.default_backend() == "cpu":
        assert model.graph.engines["conv1"] == "onednn"  # the case of issue 34
    params, state = model.init(0)
    path = save_exported(tmp_path / "mid.jaxexport", export_forward(model, params, state))
    forward = export.deserialize(bytearray(path.read_bytes()))
    x = np.random.default_rng(2).uniform(0, 1, (2, 16, 40, 40)).astype(np.float32)
    expected = jax.jit(lambda p, s, v: model.apply(p, s, {"data": v})[0]["prob"])(params, state, x)
    np.testing.assert_allclose(forward.call({"data": x})["prob"], expected, rtol=1e-5, atol=1e-7)
