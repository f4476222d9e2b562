"""caffe.Classifier, caffe.Detector and the rest of caffe.io, from pycaffe's documented
behaviour (preprocessing order, crops, oversampling, windows, BlobProto/Datum forms)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import caffe2jax as caffe
from caffe2jax.proto import caffe_pb2

DEPLOY = """
name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 10 dim: 3 dim: 8
  dim: 8 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param {
  num_output: 4 weight_filler { type: "gaussian" std: 0.05 }
  bias_filler { type: "constant" value: 0.1 } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""
MEAN = np.array([100.0, 110.0, 120.0], np.float32)


@pytest.fixture
def deploy(tmp_path):
    path = tmp_path / "deploy.prototxt"
    path.write_text(DEPLOY)
    return str(path)


def scores(net, batch):
    """The tiny net in numpy: softmax(W x + b) per row."""
    w, b = net.params["ip"][0].data, net.params["ip"][1].data
    z = batch.reshape(len(batch), -1) @ w.T + b
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def preprocess(crop):
    """transpose, swap RGB→BGR, ×255, − mean, ×0.5: pycaffe's order."""
    return (crop.transpose(2, 0, 1)[[2, 1, 0]] * 255.0 - MEAN[:, None, None]) * 0.5


def images():
    rng = np.random.default_rng(0)
    return [rng.random((12, 14, 3)).astype(np.float32), rng.random((9, 11, 3)).astype(np.float32)]


def test_classifier_oversampled_and_center_predictions(deploy):
    net = caffe.Classifier(deploy, None, image_dims=(10, 12), mean=MEAN, raw_scale=255,
                           channel_swap=(2, 1, 0), input_scale=0.5)  # fmt: skip
    inputs = images()
    resized = np.stack([caffe.io.resize_image(im, (10, 12)) for im in inputs])
    crops = caffe.io.oversample(resized, (8, 8))
    expected = scores(net, np.stack([preprocess(c) for c in crops])).reshape(2, 10, 4).mean(1)
    np.testing.assert_allclose(net.predict(inputs), expected, rtol=1e-5, atol=1e-6)
    center = resized[:, 1:9, 2:10, :]  # (10-8)/2, (12-8)/2
    expected = scores(net, np.stack([preprocess(c) for c in center]))
    # atol: class probabilities under 1e-6 carry exp's amplification of the logits' float32
    # rounding, which differs between backends (an H100 gave 1.5e-5 relative at 2.4e-13)
    np.testing.assert_allclose(net.predict(inputs, oversample=False), expected, rtol=1e-5,
                               atol=1e-9)  # fmt: skip
    assert isinstance(net, caffe.Net) and net.image_dims == (10, 12)


def test_oversample_corners_center_and_mirrors():
    image = np.arange(6 * 7 * 2, dtype=np.float32).reshape(6, 7, 2)
    crops = caffe.io.oversample([image, image + 1], (4, 4))
    assert crops.shape == (20, 4, 4, 2)
    corners = [image[:4, :4], image[:4, 3:], image[2:, :4], image[2:, 3:], image[1:5, 1:5]]
    for k, expected in enumerate(corners):
        np.testing.assert_array_equal(crops[k], expected)
        np.testing.assert_array_equal(crops[k + 5], expected[:, ::-1])
    np.testing.assert_array_equal(crops[10], image[:4, :4] + 1)


def test_detector_windows_in_order(deploy, tmp_path):
    pixels = (np.random.default_rng(1).random((20, 24, 3)) * 255).astype(np.uint8)
    path = str(tmp_path / "scene.png")
    Image.fromarray(pixels).save(path)
    det = caffe.Detector(deploy, None, mean=MEAN, raw_scale=255, channel_swap=(2, 1, 0),
                         input_scale=0.5)  # fmt: skip
    windows = [(0, 0, 8, 8), (4, 6, 20, 22), (2, 2, 12, 7)]
    found = det.detect_windows([(path, windows)])
    assert [d["filename"] for d in found] == [path] * 3
    assert [tuple(d["window"]) for d in found] == windows
    image = caffe.io.load_image(path)
    crops = [caffe.io.resize_image(image[y0:y1, x0:x1], (8, 8)) for y0, x0, y1, x1 in windows]
    expected = scores(det, np.stack([preprocess(c) for c in crops]))
    np.testing.assert_allclose(
        np.stack([d["prediction"] for d in found]), expected, rtol=3e-5, atol=1e-9
    )  # tiny probabilities: see the classifier test; rtol 3e-5, not 1e-5: the Detector's net and
    # the test's are two compiled programs (other batch), whose fused softmax rounds a 1e-3
    # probability 1.3e-5 apart (measured)
    with pytest.raises(caffe.CaffeError, match="detect_windows"):
        det.detect_selective_search([path])


def test_detector_context_pad_fills_outside_with_the_mean(deploy):
    det = caffe.Detector(deploy, None, mean=MEAN, raw_scale=255, channel_swap=(2, 1, 0),
                         context_pad=2)  # fmt: skip
    assert list(det.crop_dims) == [8, 8, 3]
    # the mean in raw image space: BGR mean back to RGB order, ÷ raw_scale
    np.testing.assert_allclose(det.crop_mean[0, 0], MEAN[[2, 1, 0]] / 255, rtol=1e-6)
    image = np.full((30, 30, 3), 0.5, np.float32)
    crop = det.crop(image, np.array([0, 0, 9, 9]))  # touches the top-left corner
    assert crop.shape == (8, 8, 3)
    np.testing.assert_allclose(crop[0, 0], MEAN[[2, 1, 0]] / 255, rtol=1e-6)  # padding
    np.testing.assert_allclose(crop[-1, -1], 0.5, rtol=1e-6)  # image
    inside = det.crop(image, np.array([10, 10, 19, 19]))
    np.testing.assert_allclose(inside, 0.5, rtol=1e-6)  # context all inside the image


def test_blobproto_forms_and_errors():
    arr = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    diff = -arr
    blob = caffe.io.array_to_blobproto(arr, diff)
    assert list(blob.shape.dim) == [2, 3, 4] and not blob.HasField("num")
    np.testing.assert_array_equal(caffe.io.blobproto_to_array(blob), arr)
    np.testing.assert_array_equal(caffe.io.blobproto_to_array(blob, return_diff=True), diff)
    legacy = caffe_pb2.BlobProto(num=1, channels=2, height=3, width=4)
    legacy.data.extend(range(24))
    assert caffe.io.blobproto_to_array(legacy).shape == (1, 2, 3, 4)
    legacy.data.append(1.0)
    with pytest.raises(ValueError):
        caffe.io.blobproto_to_array(legacy)
    with pytest.raises(ValueError):
        caffe.io.array_to_blobproto(arr, diff[:1])
    arrays = [arr, np.ones((5,), np.float32)]
    text = caffe.io.arraylist_to_blobprotovector_str(arrays)
    assert isinstance(text, bytes)
    back = caffe.io.blobprotovector_str_to_arraylist(text)
    assert len(back) == 2 and all(np.array_equal(a, b) for a, b in zip(arrays, back))


def test_datum_label_only_when_given():
    pixels = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    datum = caffe.io.array_to_datum(pixels)
    assert not datum.HasField("label") and datum.data == pixels.tobytes()
    assert caffe.io.array_to_datum(pixels, 3).label == 3
    floats = caffe.io.array_to_datum(pixels.astype(np.float32) / 2)
    assert not floats.data and len(floats.float_data) == 24
    np.testing.assert_array_equal(caffe.io.datum_to_array(datum), pixels)
    np.testing.assert_array_equal(caffe.io.datum_to_array(floats), pixels / 2)
    with pytest.raises(ValueError, match="Incorrect array shape"):
        caffe.io.array_to_datum(np.zeros((3, 4), np.uint8))


def test_transformer_resizes_an_elementwise_mean():
    t = caffe.io.Transformer({"data": (1, 3, 4, 4)})
    big = np.stack([np.full((8, 8), v, np.float32) for v in (1.0, 2.0, 3.0)])
    big[0, 0, 0] = 9.0
    t.set_mean("data", big)
    assert t.mean["data"].shape == (3, 4, 4)
    np.testing.assert_allclose(t.mean["data"][1:], big[1:, :4, :4], rtol=1e-6)
    assert t.mean["data"][0].max() <= 9.0 and t.mean["data"][0].min() >= 1.0
