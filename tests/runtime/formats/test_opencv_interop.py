"""OpenCV's Caffe importer (cv2.dnn.readNetFromCaffe) reads caffemodels caffe2jax writes.

The weights are our own: Caffe's golden initial weights after a few plain SGD steps taken with
``jax.grad`` on the train net (random data), so no byte of them comes from a Caffe-written file.
They go through the train net's caffemodel into the deploy net (copied by layer name, the loss
layer ignored) and out again as the deploy caffemodel OpenCV loads.
"""

from __future__ import annotations

import cv2
import jax
import numpy as np
import pytest

import caffe2jax
from caffe2jax.runtime.formats.weights import load_weights, save_weights
from tests import jitted
from tests.golden import GOLDEN, require

jax.config.update("jax_default_matmul_precision", "highest")

NETS = require(GOLDEN / "nets")


def sgd_steps(model, params, state, steps: int, lr: float = 0.01, seed: int = 0):
    """``steps`` plain SGD updates on random data and labels."""
    rng = np.random.default_rng(seed)
    grad = jax.grad(lambda p, s, x: model.loss(p, s, x)[0])
    for _ in range(steps):
        inputs = {
            "data": rng.uniform(0, 1, model.inputs["data"]).astype(np.float32),
            "label": rng.integers(0, 10, model.inputs["label"]).astype(np.float32),
        }
        g = grad(params, state, inputs)
        params = jax.tree_util.tree_map(lambda w, d: w - lr * d, params, g)
    return params


@pytest.mark.parametrize("case", ["lenet", "cifar10_quick"])
def test_opencv_runs_our_trained_caffemodel(case, tmp_path):
    train = caffe2jax.compile(NETS / f"{case}_train.prototxt", phase="TRAIN")
    golden = load_weights(NETS / f"{case}_train.caffemodel", train)
    params = sgd_steps(train, *golden, steps=3)
    assert not np.array_equal(params["conv1"][0], golden[0]["conv1"][0])
    save_weights(tmp_path / "train.caffemodel", train, params, golden[1])

    deploy_txt = NETS / f"{case}_deploy.prototxt"
    deploy = caffe2jax.compile(deploy_txt, phase="TEST")
    weights = load_weights(tmp_path / "train.caffemodel", deploy)
    np.testing.assert_array_equal(weights[0]["conv1"][0], params["conv1"][0])
    model_file = save_weights(tmp_path / "deploy.caffemodel", deploy, *weights)

    net = cv2.dnn.readNetFromCaffe(str(deploy_txt), str(model_file))
    x = np.random.default_rng(1).uniform(0, 1, deploy.inputs["data"]).astype(np.float32)
    net.setInput(x)
    blobs = jitted.forward(deploy, *weights, {"data": x})[0]
    names = ["conv1", "ip2", "prob"]  # first features, logits, softmax (none in place)
    for name, theirs in zip(names, net.forward(names)):
        ours = np.asarray(blobs[name])
        assert theirs.shape == ours.shape
        rel = np.linalg.norm(ours - theirs) / np.linalg.norm(ours)
        assert rel <= 1e-4, (name, rel, np.abs(ours - theirs).max())
        assert not np.array_equal(ours[0], ours[1]), "both images gave the same answer"
