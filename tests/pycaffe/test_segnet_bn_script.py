"""SegNet's Scripts/compute_bn_statistics.py (alexgkendall/SegNet-Tutorial) run as it runs,
through ``import caffe`` and ``from caffe.proto import caffe_pb2`` (caffe2jax.install_as_caffe()),
its calls transcribed: ``make_testable`` edits the train net as a ``caffe_pb2.NetParameter``
(each one-top ``BN`` layer gets ``<top>-mean`` and ``<top>-var`` tops, the TEST data layer
removed, the TRAIN rule cleared) and writes it with ``text_format.MessageToString``;
``make_test_files`` opens it with ``caffe.Net(path, weights, caffe.TEST)``, sums
``net.forward()[<top>-mean / -var]`` over the training list, unbiases the variance, folds it into
``net.params[bn][0/1].data[...]``, turns the message into an inference net (``input`` and
``input_dim`` appended, ``bn_param.bn_mode = caffe_pb2.BNParameter.INFERENCE``, a Softmax added
with ``layer.add(name=, type=, bottom=[...], top=[...])``) and saves the weights with
``net.save``.

The oracle: the script's arithmetic in float64 NumPy from the conv's own weights and the images
(the BN layer's batch mean and biased variance per forward, as SegNet's BN computes them), and
the inference net's ``prob`` against NumPy's conv → folded BN → score → softmax.
"""

from __future__ import annotations

import cv2
import numpy as np
from google.protobuf import text_format

import caffe2jax

caffe2jax.install_as_caffe()
import caffe  # noqa: E402 - the script's own imports, through the alias
from caffe.proto import caffe_pb2  # noqa: E402

TRAIN = """name: "segnet_tiny"
layer { name: "data" type: "DenseImageData" top: "data" top: "label"
  dense_image_data_param { source: "LIST" batch_size: 2 } include { phase: TRAIN } }
layer { name: "data" type: "DenseImageData" top: "data" top: "label"
  dense_image_data_param { source: "LIST" batch_size: 1 } include { phase: TEST } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 2 kernel_size: 1 weight_filler { type: "gaussian" std: 0.1 }
    bias_filler { type: "constant" value: 0.5 } } }
layer { name: "conv_bn" type: "BN" bottom: "conv" top: "conv"
  bn_param { scale_filler { type: "constant" value: 1.5 }
             shift_filler { type: "constant" value: 0.2 } } }
layer { name: "score" type: "Convolution" bottom: "conv" top: "score"
  convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss" }
layer { name: "accuracy" type: "Accuracy" bottom: "score" bottom: "label" top: "accuracy"
  include { phase: TEST } }
"""


def make_testable(train_model_path):
    """compute_bn_statistics.make_testable."""
    train_net = caffe_pb2.NetParameter()
    with open(train_model_path) as f:
        text_format.Merge(f.read(), train_net)
    for layer in train_net.layer:
        if layer.type == "BN" and len(layer.top) == 1:
            layer.top.append(layer.top[0] + "-mean")
            layer.top.append(layer.top[0] + "-var")
    if train_net.layer[1].name == "data" and train_net.layer[1].include:
        train_net.layer.remove(train_net.layer[1])
        if train_net.layer[0].include:
            train_net.layer[0].include.remove(train_net.layer[0].include[0])
    return train_net


def make_test_files(testable_net_path, weights, num_iterations, in_h, in_w):
    """compute_bn_statistics.make_test_files (its prints left out)."""
    msg = caffe_pb2.NetParameter()
    with open(testable_net_path) as f:
        text_format.Merge(f.read(), msg)
    bns = [(lay.name, lay.top[0], lay.top[1], lay.top[2]) for lay in msg.layer if lay.type == "BN"]
    net = caffe.Net(testable_net_path, weights, caffe.TEST)
    res = net.forward()
    mean = {m: np.squeeze(res[m]).copy() for _, _, m, _ in bns}
    var = {v: np.squeeze(res[v]).copy() for _, _, _, v in bns}
    for _ in range(1, num_iterations):
        res = net.forward()
        for _, _, m, v in bns:
            mean[m] += np.squeeze(res[m])
            var[v] += np.squeeze(res[v])
    for layer, blob, m, v in bns:
        mean[m] /= num_iterations
        var[v] /= num_iterations
        count = np.prod(net.blobs[blob].data.shape) / np.prod(var[v].shape)
        var[v] *= count / (count - 1)
        gamma, beta = (np.squeeze(net.params[layer][i].data) for i in (0, 1))
        new_gamma = gamma / np.sqrt(var[v] + 1e-9)
        new_beta = beta - gamma * mean[m] / np.sqrt(var[v] + 1e-9)
        shape = net.params[layer][0].data.shape
        net.params[layer][0].data[...] = new_gamma.reshape(shape)
        net.params[layer][1].data[...] = new_beta.reshape(net.params[layer][1].data.shape)
    for data_layer in [lay for lay in msg.layer if lay.type.endswith("Data")]:
        msg.layer.remove(data_layer)
    msg.input.append("data")
    msg.input_dim.extend([1, 3, in_h, in_w])
    for lay in msg.layer:
        if lay.type == "BN":
            for dead in list(lay.top[1:]):
                lay.top.remove(dead)
            lay.bn_param.bn_mode = caffe_pb2.BNParameter.INFERENCE
    dead_outputs = [lay for lay in msg.layer if lay.type in ["SoftmaxWithLoss", "Accuracy"]]
    out_bottom = dead_outputs[0].bottom[0]
    for dead in dead_outputs:
        msg.layer.remove(dead)
    msg.layer.add(name="prob", type="Softmax", bottom=[out_bottom], top=["prob"])
    return net, msg


def test_compute_bn_statistics_through_pycaffe_matches_numpy(tmp_path):
    rng = np.random.default_rng(3)
    lines, images = [], []
    for i in range(6):
        image = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
        cv2.imwrite(str(tmp_path / f"i{i}.png"), image)
        cv2.imwrite(str(tmp_path / f"l{i}.png"), rng.integers(0, 3, (4, 5), dtype=np.uint8))
        lines.append(f"{tmp_path / f'i{i}.png'} {tmp_path / f'l{i}.png'}\n")
        images.append(image.transpose(2, 0, 1).astype(np.float64))
    (tmp_path / "train.txt").write_text("".join(lines))
    (tmp_path / "train.prototxt").write_text(TRAIN.replace("LIST", str(tmp_path / "train.txt")))
    trained = caffe.Net(str(tmp_path / "train.prototxt"), caffe.TRAIN)
    trained.save(str(tmp_path / "trained.caffemodel"))
    w = np.asarray(trained.params["conv"][0].data, np.float64).reshape(2, 3)
    b = np.asarray(trained.params["conv"][1].data, np.float64)
    score_w = np.asarray(trained.params["score"][0].data, np.float64).reshape(3, 2)
    score_b = np.asarray(trained.params["score"][1].data, np.float64)

    testable = make_testable(str(tmp_path / "train.prototxt"))
    assert [lay.name for lay in testable.layer][:2] == ["data", "conv"]
    path = tmp_path / "__for_calculating_BN_stats_train.prototxt"
    path.write_text(text_format.MessageToString(testable))
    num_iterations = 6 // 2 + 6 % 2  # the script's count from the list and batch size
    net, msg = make_test_files(
        str(path), str(tmp_path / "trained.caffemodel"), num_iterations, 4, 5
    )
    net.save(str(tmp_path / "test_weights.caffemodel"))

    conv = np.einsum("oc,nchw->nohw", w, np.stack(images)) + b[None, :, None, None]
    batches = [conv[i : i + 2] for i in (0, 2, 4)]
    mean = np.mean([c.mean(axis=(0, 2, 3)) for c in batches], axis=0)
    var = np.mean([c.var(axis=(0, 2, 3)) for c in batches], axis=0) * 40 / 39
    scale, shift = 1.5 / np.sqrt(var + 1e-9), 0.2 - 1.5 * mean / np.sqrt(var + 1e-9)
    np.testing.assert_allclose(net.params["conv_bn"][0].data.ravel(), scale, rtol=1e-4)
    np.testing.assert_allclose(net.params["conv_bn"][1].data.ravel(), shift, rtol=1e-4, atol=1e-5)

    (tmp_path / "deploy.prototxt").write_text(text_format.MessageToString(msg))
    deploy = caffe.Net(str(tmp_path / "deploy.prototxt"), str(tmp_path / "test_weights.caffemodel"),
                       caffe.TEST)  # fmt: skip
    deploy.blobs["data"].data[...] = images[0][None]
    prob = deploy.forward()["prob"][0]
    folded = conv[0] * scale[:, None, None] + shift[:, None, None]
    logits = np.einsum("oc,chw->ohw", score_w, folded) + score_b[:, None, None]
    want = np.exp(logits - logits.max(0)) / np.exp(logits - logits.max(0)).sum(0)
    np.testing.assert_allclose(prob, want, rtol=1e-4, atol=1e-6)
