"""Decoded detections (runtime/outputs/detections.py): a whole SSD-style net against OpenCV dnn with
the same weights and image, pixel boxes, py-faster-rcnn's test-time decoding by hand."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from caffe2jax.runtime.formats.weights import save_weights
from caffe2jax.runtime.outputs.detections import Detection, detect, from_detection_output, from_rcnn

TINY_SSD = Path(__file__).resolve().parents[3] / "examples" / "detection" / "tiny_ssd.prototxt"


def _image(h=48, w=80, seed=0) -> np.ndarray:
    """Noise: no flat region, so no two priors tie in score (where Caffe's and OpenCV's
    unstable std::sort may order ties differently)."""
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def tiny_ssd(tmp_path_factory):
    model = caffe2jax.compile(TINY_SSD)
    params, state = model.init(0)
    weights = save_weights(tmp_path_factory.mktemp("w") / "tiny.caffemodel", model, params, state)
    return model, params, state, weights


def test_tiny_ssd_matches_opencv_end_to_end(tiny_ssd):
    """The image, preprocessed as cv2.dnn.blobFromImage does, through Normalize, Permute,
    PriorBox, Concat, Softmax and DetectionOutput: same rows (OpenCV lists them by score; Caffe
    by label, then score) within 1e-4 of the largest magnitude, then the same pixel boxes."""
    model, params, state, weights = tiny_ssd
    image = _image()
    net = cv2.dnn.readNetFromCaffe(str(TINY_SSD), str(weights))
    net.setInput(cv2.dnn.blobFromImage(image, 0.007843, (64, 64), (127.5, 127.5, 127.5)))
    theirs = net.forward()[0, 0]
    found = detect(model, params, state, image, mean=(127.5,) * 3, scale=0.007843)
    assert len(found) > 5
    theirs = theirs[: len(found)]
    theirs = theirs[np.lexsort((theirs[:, 1], theirs[:, 0]))]
    ours = np.array([[d.image, d.label, d.score, d.xmin / 80, d.ymin / 48, d.xmax / 80,
                      d.ymax / 48] for d in found])  # fmt: skip
    np.testing.assert_array_equal(ours[:, :2], theirs[:, :2])
    assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max()


def test_from_detection_output_scales_to_pixels_and_skips_padding():
    top = np.array([[0, 2, 0.9, 0.1, 0.2, 0.5, 0.6], [0, -1, -1, -1, -1, -1, -1],
                    [1, 1, 0.4, 0.0, 0.0, 1.0, 1.0]], np.float32)[None, None]  # fmt: skip
    found = from_detection_output(top, width=200, height=100, names=["bg", "cat", "dog"])
    assert [(d.image, d.label, d.name) for d in found] == [(0, 2, "dog"), (1, 1, "cat")]
    np.testing.assert_allclose([found[0].xmin, found[0].ymin, found[0].xmax, found[0].ymax],
                               [20, 20, 100, 60], rtol=1e-6)  # fmt: skip
    assert from_detection_output(top, 200, 100, threshold=0.5)[0].label == 2
    assert str(found[1]).startswith("1 1 cat 0.4000 0.0 0.0 200.0 100.0")


def test_from_rcnn_decodes_per_class_with_nms_as_py_faster_rcnn():
    """Two rois (im_scale 2), 3 classes. Class 1: both rois score 0.6/0.5 on nearly the same
    box → NMS 0.3 keeps the first. Class 2: only roi 1 passes 0.05. Padding roi ignored."""
    rois = np.array([[0, 20, 20, 59, 59], [0, 22, 22, 61, 61], [0, 0, 0, 0, 0]], np.float32)
    probs = np.array([[0.38, 0.6, 0.02], [0.1, 0.5, 0.4], [0.9, 0.05, 0.05]], np.float32)
    deltas = np.zeros((3, 12), np.float32)
    deltas[1, 8:12] = [0.5, 0, np.log(2), 0]  # class 2 of roi 1: shift by half, twice as wide
    found = from_rcnn(rois, probs, deltas, im_scale=2.0, width=100, height=100)
    assert [(d.label, round(d.score, 2)) for d in found] == [(1, 0.6), (2, 0.4)]
    # roi 0 / 2 = (10, 10)–(29.5, 29.5): width 20.5, so x2 = centre + 10.25 = 30.5 (no −1)
    np.testing.assert_allclose([found[0].xmin, found[0].ymin, found[0].xmax, found[0].ymax],
                               [10, 10, 30.5, 30.5])  # fmt: skip
    # roi 1 / 2 = (11, 11)–(30.5, 30.5): w = 20.5, centre 21.25 → 31.5, width 41
    np.testing.assert_allclose([found[1].xmin, found[1].xmax], [31.5 - 20.5, 31.5 + 20.5])
    agnostic = from_rcnn(rois, probs, np.tile(deltas[:, 8:], (1, 2)), 2.0, 100, 100)
    per_class = from_rcnn(rois, probs, np.tile(deltas[:, 8:], (1, 3)), 2.0, 100, 100)
    assert agnostic == per_class  # R-FCN's 8 columns: the foreground 4 for every class


def test_detect_refuses_a_net_without_detection_output():
    model = caffe2jax.compile(
        'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 '
        'dim: 8 dim: 8 } } }\nlayer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n'
    )
    with pytest.raises(NetError, match="no detection layer"):
        detect(model, {}, {}, _image())


def test_detection_is_exported():
    assert caffe2jax.Detection is Detection and caffe2jax.detect is detect


TINY_RCNN = """
name: "tiny_rcnn"
layer { name: "input" type: "Input" top: "data" top: "im_info"
  input_param { shape { dim: 1 dim: 3 dim: 64 dim: 64 } shape { dim: 1 dim: 3 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 8 kernel_size: 16 stride: 16
    weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "rpn_cls" type: "Convolution" bottom: "conv" top: "rpn_cls"
  convolution_param { num_output: 18 kernel_size: 1 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "rpn_bbox_pred" type: "Convolution" bottom: "conv" top: "rpn_bbox_pred"
  convolution_param { num_output: 36 kernel_size: 1
    weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "rpn_cls_reshape" type: "Reshape" bottom: "rpn_cls" top: "rpn_cls_reshape"
  reshape_param { shape { dim: 0 dim: 2 dim: -1 dim: 0 } } }
layer { name: "rpn_cls_prob" type: "Softmax" bottom: "rpn_cls_reshape" top: "rpn_cls_prob" }
layer { name: "rpn_cls_prob_reshape" type: "Reshape" bottom: "rpn_cls_prob"
  top: "rpn_cls_prob_reshape" reshape_param { shape { dim: 0 dim: 18 dim: -1 dim: 0 } } }
layer { name: "proposal" type: "Python" bottom: "rpn_cls_prob_reshape" bottom: "rpn_bbox_pred"
  bottom: "im_info" top: "rois"
  python_param { module: "rpn.proposal_layer" layer: "ProposalLayer"
    param_str: "'feat_stride': 16" } }
layer { name: "pool" type: "ROIPooling" bottom: "conv" bottom: "rois" top: "pool"
  roi_pooling_param { pooled_h: 2 pooled_w: 2 spatial_scale: 0.0625 } }
layer { name: "cls_score" type: "InnerProduct" bottom: "pool" top: "cls_score"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "cls_prob" type: "Softmax" bottom: "cls_score" top: "cls_prob" }
layer { name: "bbox_pred" type: "InnerProduct" bottom: "pool" top: "bbox_pred"
  inner_product_param { num_output: 12 weight_filler { type: "gaussian" std: 0.01 } } }
"""


def test_detect_runs_a_faster_rcnn_net_as_py_faster_rcnn_test():
    """An im_info net: the image is scaled so its shorter side is 600 (longer ≤ 1000), the net
    reshaped to it, im_info filled, and the outputs decoded by from_rcnn in the image's
    pixels."""
    model = caffe2jax.compile(TINY_RCNN)
    params, state = model.init(0)
    image = _image(h=100, w=150)  # scale 6 → 600 × 900
    found = detect(model, params, state, image, mean=(102.98, 115.95, 122.77))
    big = model.reshape({"data": (1, 3, 600, 900)})
    blob = cv2.resize(image, (900, 600)).astype(np.float32) - np.float32([102.98, 115.95, 122.77])
    inputs = {"data": blob.transpose(2, 0, 1)[None], "im_info": np.float32([[600, 900, 6.0]])}
    blobs = big.apply(params, state, inputs)[0]
    want = from_rcnn(blobs["rois"], blobs["cls_prob"], blobs["bbox_pred"], 6.0, 150, 100)
    assert found == want and len(found) > 3
    assert all(d.label in (1, 2) and d.score > 0.05 for d in found)
    assert all(0 <= d.xmin <= d.xmax <= 149 and 0 <= d.ymin <= d.ymax <= 99 for d in found)
