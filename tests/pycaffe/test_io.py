"""A pycaffe deploy script, ported by changing the import: caffe.io, Transformer, modes."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import caffe2jax as caffe
from caffe2jax.frontend.errors import DataError
from tests.golden import GOLDEN

DEPLOY = GOLDEN / "nets" / "lenet_deploy.prototxt"
WEIGHTS = GOLDEN / "nets" / "lenet_deploy.caffemodel"


def test_classification_script(tmp_path):
    caffe.set_mode_cpu()
    net = caffe.Net(str(DEPLOY), str(WEIGHTS), caffe.TEST)
    pixels = (np.arange(40 * 30) % 251).astype(np.uint8).reshape(40, 30)
    Image.fromarray(pixels).save(tmp_path / "digit.png")

    image = caffe.io.load_image(str(tmp_path / "digit.png"), color=False)
    assert image.shape == (40, 30, 1) and image.dtype == np.float32 and image.max() <= 1
    transformer = caffe.io.Transformer({"data": net.blobs["data"].data.shape})
    transformer.set_transpose("data", (2, 0, 1))
    transformer.set_raw_scale("data", 255)
    transformer.set_mean("data", np.array([10.0]))
    transformer.set_input_scale("data", 0.00390625)
    net.blobs["data"].data[...] = transformer.preprocess("data", image)
    prob = net.forward()["prob"]
    assert prob.shape == (2, 10) and np.allclose(prob.sum(axis=1), 1, atol=1e-5)

    resized = caffe.io.resize_image(image, (28, 28))
    expected = (resized.transpose(2, 0, 1) * 255 - 10.0) * 0.00390625
    np.testing.assert_allclose(net.blobs["data"].data[0], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        transformer.deprocess("data", net.blobs["data"].data[0]), resized, atol=1e-5
    )


def test_forward_all_batches_and_trims():
    net = caffe.Net(str(DEPLOY), str(WEIGHTS), caffe.TEST)  # batch 2
    data = np.random.default_rng(0).random((5, 1, 28, 28)).astype(np.float32)
    probs = net.forward_all(data=data)["prob"]
    assert probs.shape == (5, 10)
    one = net.forward(data=data[4:5].repeat(2, axis=0))["prob"][0]
    np.testing.assert_allclose(probs[4], one, rtol=1e-5, atol=1e-7)


def test_io_round_trips(tmp_path):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    datum = caffe.io.array_to_datum(array, label=7)
    assert datum.label == 7
    np.testing.assert_array_equal(caffe.io.datum_to_array(datum), array)
    mean = np.random.default_rng(1).random((1, 3, 4, 5)).astype(np.float32)
    caffe.io.write_blobproto(tmp_path / "mean.binaryproto", mean)
    np.testing.assert_array_equal(caffe.io.read_blobproto(tmp_path / "mean.binaryproto"), mean)


def test_transformer_errors():
    transformer = caffe.io.Transformer({"data": (1, 3, 8, 8)})
    with pytest.raises(DataError, match="not one of the net inputs"):
        transformer.set_raw_scale("image", 255)
    with pytest.raises(DataError, match="needs 3 channels"):
        transformer.set_channel_swap("data", (1, 0))
    with pytest.raises(DataError, match="needs 3 channels"):
        transformer.set_mean("data", np.zeros(2))


def test_random_seed_makes_fillers_reproducible():
    caffe.set_random_seed(5)
    a = caffe.Net(str(DEPLOY), caffe.TEST).params["conv1"][0].data.copy()
    b = caffe.Net(str(DEPLOY), caffe.TEST).params["conv1"][0].data.copy()
    caffe.set_random_seed(6)
    c = caffe.Net(str(DEPLOY), caffe.TEST).params["conv1"][0].data.copy()
    caffe.set_random_seed(0)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
