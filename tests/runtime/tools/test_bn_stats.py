"""runtime/tools/bn_stats.py: the statistics net and inference net compute_bn_statistics.py builds,
its iteration count, and the fold (the numbers themselves: tests/cli/test_compute_bn_stats.py)."""

from __future__ import annotations

import numpy as np
import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.pipeline import load_param
from caffe2jax.runtime.tools import bn_stats

NET = """name: "n"
layer { name: "data" type: "DenseImageData" top: "data" top: "label"
  dense_image_data_param { source: "train.txt" batch_size: 4 } include { phase: TRAIN } }
layer { name: "data" type: "DenseImageData" top: "data" top: "label"
  dense_image_data_param { source: "test.txt" batch_size: 1 } include { phase: TEST } }
layer { name: "c" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 2 kernel_size: 1 } }
layer { name: "c_bn" type: "BN" bottom: "c" top: "c" %s }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "c" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "c" bottom: "label" top: "acc" }
"""


def test_statistics_net_keeps_the_train_data_and_adds_mean_and_var_tops():
    stats, bns = bn_stats.statistics_net(load_param(NET % ""))
    assert [layer.name for layer in stats.layer] == ["data", "c", "c_bn", "loss", "acc"]
    assert stats.layer[0].dense_image_data_param.source == "train.txt"
    assert not stats.layer[0].include and not stats.HasField("state")
    assert list(stats.layer[2].top) == ["c", "c-mean", "c-var"]
    assert bns == [bn_stats.BNTops("c_bn", "c", "c-mean", "c-var")]


def test_inference_net_is_the_scripts_test_net():
    stats, _ = bn_stats.statistics_net(load_param(NET % ""))
    net = bn_stats.inference_net(stats, (1, 3, 8, 10))
    assert [(layer.name, layer.type) for layer in net.layer] == [
        ("c", "Convolution"), ("c_bn", "BN"), ("prob", "Softmax")]  # fmt: skip
    assert list(net.input) == ["data"] and list(net.input_dim) == [1, 3, 8, 10]
    assert list(net.layer[1].top) == ["c"]
    assert net.layer[1].bn_param.bn_mode == caffe_pb2.BNParameter.INFERENCE
    assert list(net.layer[2].bottom) == ["c"]


@pytest.mark.parametrize(
    "bn, match",
    [
        ("bn_param { bn_mode: INFERENCE }", "INFERENCE already"),
        ("bn_param { momentum: 0.9 }", "PSPNet's BN keeps running statistics"),
    ],  # fmt: skip
)
def test_refusals_name_the_layer(bn, match):
    with pytest.raises(NetError, match=rf"layer 'c_bn' \(type BN\).*{match}"):
        bn_stats.statistics_net(load_param(NET % bn))


def test_default_iterations_is_the_scripts_formula():
    assert bn_stats.default_iterations(367, 4) == 91 + 3  # CamVid's train list, batch 4
    assert bn_stats.default_iterations(10, 4) == 4
    assert bn_stats.default_iterations(8, 4) == 2


def test_fold_python2_factor_and_shapes():
    scale, shift = np.full((1, 2, 1, 1), 2.0, np.float32), np.full((1, 2, 1, 1), 0.5, np.float32)
    mean, var = np.array([1.0, -1.0]), np.array([4.0, 0.25])
    s, b = bn_stats.fold(scale, shift, mean, var, m=2)  # Python 2: 2 / 1 = 2
    np.testing.assert_allclose(s.ravel(), 2 / np.sqrt(var * 2 + 1e-9), rtol=1e-6)
    np.testing.assert_allclose(b.ravel(), 0.5 - 2 * mean / np.sqrt(var * 2 + 1e-9), rtol=1e-6)
    s3, _ = bn_stats.fold(scale, shift, mean, var, m=3)  # 3 / 2 = 1 in Python 2
    np.testing.assert_allclose(s3.ravel(), 2 / np.sqrt(var + 1e-9), rtol=1e-6)
    s3u, _ = bn_stats.fold(scale, shift, mean, var, m=3, unbias=True)
    np.testing.assert_allclose(s3u.ravel(), 2 / np.sqrt(var * 1.5 + 1e-9), rtol=1e-6)
    assert s.shape == scale.shape and s.dtype == np.float32
    with pytest.raises(NetError, match="m = 1"):
        bn_stats.fold(scale, shift, mean, var, m=1)
