"""`caffe2jax absorb_bn` (caffe2jax/cli/absorb_bn.py, runtime/tools/bn_absorb.py): INFERENCE BNs and
test-phase SpatialDropouts folded into the convolutions they read, the absorbed net giving the
original's output; BNs after a Deconvolution or on a blob read twice left in place."""

from __future__ import annotations

import numpy as np
import pytest

from caffe2jax.cli.main import main
from caffe2jax.pycaffe.net import Net

BN = "bn_param { bn_mode: INFERENCE }"
DROP = ("python_param { module: 'spatial_dropout' layer: 'SpatialDropoutLayer' "
        "param_str: \"{'phase': 'TEST', 'p': '0.2'}\" }")  # fmt: skip
DEPLOY = f"""name: "absorb"
layer {{ name: "data" type: "Input" top: "data"
  input_param {{ shape {{ dim: 2 dim: 3 dim: 6 dim: 6 }} }} }}
layer {{ name: "conv_a" type: "Convolution" bottom: "data" top: "conv_a"
  convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 bias_term: false }} }}
layer {{ name: "bn_a" type: "BN" bottom: "conv_a" top: "conv_a" {BN} }}
layer {{ name: "drop_a" type: "Python" bottom: "conv_a" top: "drop_a" {DROP} }}
layer {{ name: "conv_b" type: "Convolution" bottom: "drop_a" top: "conv_b"
  convolution_param {{ num_output: 5 kernel_size: 1 }} }}
layer {{ name: "bn_b" type: "BN" bottom: "conv_b" top: "bn_b" {BN} }}
layer {{ name: "relu_b" type: "PReLU" bottom: "bn_b" top: "bn_b" }}
layer {{ name: "deconv" type: "Deconvolution" bottom: "bn_b" top: "deconv"
  convolution_param {{ num_output: 3 kernel_size: 2 stride: 2 }} }}
layer {{ name: "bn_c" type: "BN" bottom: "deconv" top: "deconv" {BN} }}
layer {{ name: "conv_d" type: "Convolution" bottom: "deconv" top: "conv_d"
  convolution_param {{ num_output: 3 kernel_size: 1 }} }}
layer {{ name: "bn_d" type: "BN" bottom: "conv_d" top: "bn_d" {BN} }}
layer {{ name: "sum" type: "Eltwise" bottom: "bn_d" bottom: "conv_d" top: "sum" }}
"""


@pytest.fixture
def deploy(tmp_path):
    model, weights = tmp_path / "deploy.prototxt", tmp_path / "w.caffemodel"
    model.write_text(DEPLOY)
    rng = np.random.default_rng(0)
    net = Net(str(model), "TEST")
    for params in net.params.values():
        for blob in params:
            blob.data[...] = rng.normal(0.3, 1.0, blob.data.shape)
    net.save(str(weights))
    net.close()
    return model, weights, rng.normal(size=(2, 3, 6, 6)).astype(np.float32)


def _forward(model, weights, x) -> np.ndarray:
    net = Net(str(model), "TEST", weights=str(weights))
    try:
        net.blobs["data"].data[...] = x
        return np.array(net.forward()["sum"])
    finally:
        net.close()


def test_absorbed_net_computes_the_original(deploy, tmp_path, capsys):
    model, weights, x = deploy
    out_model, out_weights = tmp_path / "merged.prototxt", tmp_path / "merged.caffemodel"
    assert main(["absorb_bn", str(model), str(weights), str(out_model), str(out_weights)]) == 0
    assert "Absorbed 3 layers" in capsys.readouterr().out
    merged = Net(str(out_model), "TEST", weights=str(out_weights))
    try:
        names = [layer.name for layer in merged.layers]
    finally:
        merged.close()
    assert names == ["data", "conv_a", "conv_b", "relu_b", "deconv", "bn_c", "conv_d",
                     "conv_d_conv_d_0_split", "bn_d", "sum"]  # fmt: skip
    np.testing.assert_allclose(_forward(out_model, out_weights, x), _forward(model, weights, x),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_refusals_are_one_line(deploy, tmp_path, capsys):
    model, weights, _ = deploy
    learn = tmp_path / "learn.prototxt"
    learn.write_text(DEPLOY.replace(BN, "bn_param { bn_mode: LEARN }", 1))
    outs = [str(tmp_path / "o.prototxt"), str(tmp_path / "o.caffemodel")]
    assert main(["absorb_bn", str(learn), str(weights), *outs]) == 1
    err = capsys.readouterr().err
    assert "layer 'bn_a' (type BN) is in bn_mode LEARN" in err and len(err.splitlines()) == 1
    (tmp_path / "o.prototxt").write_text("mine")
    assert main(["absorb_bn", str(model), str(weights), *outs]) == 1
    assert "already exists" in capsys.readouterr().err
    assert (tmp_path / "o.prototxt").read_text() == "mine"
