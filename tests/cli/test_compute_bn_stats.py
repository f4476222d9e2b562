"""`caffe2jax compute_bn_stats` (caffe2jax/cli/compute_bn_stats.py, runtime/tools/bn_stats.py) on a
tiny SegNet-style net against a NumPy transcription of compute_bn_statistics.py's math: the BN
input's per-batch mean and biased variance over the training list, averaged, the variance
times m // (m − 1) (Python 2) or m / (m − 1) (--unbias), folded into scale and shift."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from caffe2jax.cli.main import main
from caffe2jax.pycaffe.net import Net

TRAIN = """name: "tiny"
layer { name: "data" type: "DenseImageData" top: "data" top: "label"
  dense_image_data_param { source: "LIST" batch_size: 2 } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 2 kernel_size: 1 weight_filler { type: "gaussian" std: 0.1 }
    bias_filler { type: "constant" value: 0.5 } } }
layer { name: "conv_bn" type: "BN" bottom: "conv" top: "conv"
  bn_param { scale_filler { type: "constant" value: 1.5 }
             shift_filler { type: "constant" value: 0.2 } } }
layer { name: "score" type: "Convolution" bottom: "conv" top: "score"
  convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss"
  loss_param { weight_by_label_freqs: true class_weighting: 1 class_weighting: 2
               class_weighting: 3 } }
layer { name: "accuracy" type: "Accuracy" bottom: "score" bottom: "label" top: "accuracy"
  include { phase: TEST } }
"""


@pytest.fixture
def tiny(tmp_path):
    """The train prototxt, its weights and the 6 training images (BGR float, C×H×W)."""
    rng = np.random.default_rng(3)
    lines, images = [], []
    for i in range(6):
        image = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
        cv2.imwrite(str(tmp_path / f"i{i}.png"), image)
        cv2.imwrite(str(tmp_path / f"l{i}.png"), rng.integers(0, 3, (4, 5), dtype=np.uint8))
        lines.append(f"{tmp_path / f'i{i}.png'} {tmp_path / f'l{i}.png'}\n")
        images.append(image.transpose(2, 0, 1).astype(np.float64))
    (tmp_path / "train.txt").write_text("".join(lines))
    model = tmp_path / "train.prototxt"
    model.write_text(TRAIN.replace("LIST", str(tmp_path / "train.txt")))
    net = Net(str(model), "TRAIN", seed=5)
    net.save(str(tmp_path / "trained.caffemodel"))
    blobs = {k: [np.array(b.data, np.float64) for b in v] for k, v in net.params.items()}
    net.close()
    return model, tmp_path / "trained.caffemodel", np.stack(images), blobs


def _reference(images, blobs, unbias: bool):
    """compute_bn_statistics.py's numbers for the tiny net (3 forwards of 2 images)."""
    w, b = blobs["conv"][0].reshape(2, 3), blobs["conv"][1]
    conv = np.einsum("oc,nchw->nohw", w, images) + b[None, :, None, None]
    means, variances = [], []
    for batch in (conv[0:2], conv[2:4], conv[4:6]):
        mu = batch.mean(axis=(0, 2, 3))
        means.append(mu)
        variances.append((batch**2).mean(axis=(0, 2, 3)) - mu**2)
    m = 2 * 4 * 5
    mean = np.mean(means, axis=0)
    var = np.mean(variances, axis=0) * (m / (m - 1) if unbias else m // (m - 1))
    gamma, beta = blobs["conv_bn"][0].ravel(), blobs["conv_bn"][1].ravel()
    scale = gamma / np.sqrt(var + 1e-9)
    return conv, scale, beta - gamma * mean / np.sqrt(var + 1e-9)


@pytest.mark.parametrize("unbias", [False, True])
def test_folded_weights_and_inference_net_match_the_scripts_math(tiny, tmp_path, unbias, capsys):
    model, weights, images, blobs = tiny
    out, deploy = tmp_path / "folded.caffemodel", tmp_path / "deploy.prototxt"
    argv = ["compute_bn_stats", str(model), str(weights), str(out), "--inference-prototxt",
            str(deploy)] + (["--unbias"] if unbias else [])  # fmt: skip
    assert main(argv) == 0
    assert "progress: 3/3" in capsys.readouterr().out  # 6 // 2 + 6 % 2 forwards
    conv, scale, shift = _reference(images, blobs, unbias)
    net = Net(str(deploy), "TEST", weights=str(out))
    try:
        assert net.inputs == ["data"] and list(net.blobs["data"].data.shape) == [1, 3, 4, 5]
        assert [layer.type for layer in net.layers][-1] == "Softmax" and "loss" not in net.blobs
        np.testing.assert_allclose(net.params["conv_bn"][0].data.ravel(), scale, rtol=2e-6)
        np.testing.assert_allclose(net.params["conv_bn"][1].data.ravel(), shift, rtol=2e-6,
                                   atol=1e-6)  # fmt: skip
        net.blobs["data"].data[...] = images[:1]
        prob = net.forward()["prob"]
    finally:
        net.close()
    bn = conv[:1] * scale[None, :, None, None] + shift[None, :, None, None]
    score = np.einsum("oc,nchw->nohw", blobs["score"][0].reshape(3, 2), bn)
    score += blobs["score"][1][None, :, None, None]
    expected = np.exp(score) / np.exp(score).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(prob, expected, rtol=1e-5, atol=1e-6)


def test_bad_inputs_are_one_line_and_outputs_are_not_overwritten(tiny, tmp_path, capsys):
    model, weights, _, _ = tiny
    out = tmp_path / "folded.caffemodel"
    out.write_bytes(b"mine")
    assert main(["compute_bn_stats", str(model), str(weights), str(out)]) == 1
    assert out.read_bytes() == b"mine"
    err = capsys.readouterr().err
    assert "already exists; pass --force" in err and len(err.strip().splitlines()) == 1
    plain = tmp_path / "plain.prototxt"
    plain.write_text(TRAIN.split('layer { name: "conv_bn"')[0] + 'layer { name: "score" '
                     'type: "Convolution" bottom: "conv" top: "score" convolution_param { '
                     "num_output: 3 kernel_size: 1 } }")  # fmt: skip
    for argv, message in (
        ([str(plain), str(weights), str(tmp_path / "a.caffemodel")], "no SegNet BN layer"),
        ([str(model), str(tmp_path / "none.caffemodel"), str(tmp_path / "b.caffemodel")],
         "none.caffemodel"),
        ([str(model), str(weights), str(tmp_path / "c.caffemodel"), "--iters", "0"],
         "--iters must be at least 1"),
    ):  # fmt: skip
        assert main(["compute_bn_stats", *argv]) == 1
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
