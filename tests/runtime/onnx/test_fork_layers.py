"""The forks' layers (and a few BVLC configurations the goldens lack) one by one: a small net
exported to ONNX, run in onnxruntime, every output within 1e-5 of caffe2jax's jitted forward
(detection rows as sets: rows of tied scores may come in either order)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from caffe2jax.runtime.onnx import OnnxExportError
from tests.runtime.onnx import onnx_runs
from tests.runtime.onnx.small_nets import agree, net_text, random_inputs, random_model

jax.config.update("jax_default_matmul_precision", "highest")

X = {"x": (2, 6, 9, 11)}

SIMPLE = {
    "normalize": ('layer { name: "n" type: "Normalize" bottom: "x" top: "y" '
                  "norm_param { across_spatial: false } }", X),
    "normalize_shared_spatial": ('layer { name: "n" type: "Normalize" bottom: "x" top: "y" '
                                 "norm_param { across_spatial: true channel_shared: true } }", X),
    "permute": ('layer { name: "p" type: "Permute" bottom: "x" top: "y" '
                "permute_param { order: 0 order: 2 order: 3 order: 1 } }", X),
    "shuffle_channel": ('layer { name: "s" type: "ShuffleChannel" bottom: "x" top: "y" '
                        "shuffle_channel_param { group: 3 } }", X),
    "relu6": ('layer { name: "r" type: "ReLU6" bottom: "x" top: "y" }', X),
    "relu6_slope": ('layer { name: "r" type: "ReLU6" bottom: "x" top: "y" '
                    "relu6_param { negative_slope: 0.1 } }", X),
    "mish": ('layer { name: "m" type: "Mish" bottom: "x" top: "y" }', X),
    "depthwise": ('layer { name: "d" type: "ConvolutionDepthwise" bottom: "x" top: "y" '
                  "convolution_param { num_output: 12 kernel_size: 3 stride: 2 pad: 1 } }", X),
    "depthwise_eric612": ('layer { name: "d" type: "DepthwiseConvolution" bottom: "x" top: "y" '
                          "convolution_param { num_output: 6 kernel_size: 3 pad: 1 } }", X),
    "axpy": ('layer { name: "a" type: "Axpy" bottom: "a" bottom: "x" bottom: "z" top: "y" }',
             {"a": (2, 6, 1, 1), "x": (2, 6, 5, 4), "z": (2, 6, 5, 4)}),
    "axpy_2d_scale": ('layer { name: "a" type: "Axpy" bottom: "a" bottom: "x" bottom: "z" '
                      'top: "y" }', {"a": (2, 6), "x": (2, 6, 5, 4), "z": (2, 6, 5, 4)}),
    "bn_segnet_inference": ('layer { name: "b" type: "BN" bottom: "x" top: "y" '
                            "bn_param { bn_mode: INFERENCE } }", X),
    "bn_segnet_learn": ('layer { name: "b" type: "BN" bottom: "x" top: "y" top: "m" top: "v" '
                        "bn_param { bn_mode: LEARN } }", X),
    "bn_pspnet": ('layer { name: "b" type: "BN" bottom: "x" top: "y" '
                  "bn_param { eps: 1e-5 frozen: true } }", X),
    "upsample_nearest": ('layer { name: "u" type: "Upsample" bottom: "x" top: "y" '
                         "upsample_param { scale: 2 } }", X),
    "upsample_nearest_3": ('layer { name: "u" type: "Upsample" bottom: "x" top: "y" '
                           "upsample_param { scale: 3 } }", X),
    "interp_zoom": ('layer { name: "i" type: "Interp" bottom: "x" top: "y" '
                    "interp_param { zoom_factor: 3 } }", X),
    "interp_shrink": ('layer { name: "i" type: "Interp" bottom: "x" top: "y" '
                      "interp_param { shrink_factor: 2 } }", X),
    "interp_size_crop": ('layer { name: "i" type: "Interp" bottom: "x" top: "y" '
                         "interp_param { height: 17 width: 5 pad_beg: -1 pad_end: -2 } }", X),
    "reorg": ('layer { name: "r" type: "Reorg" bottom: "x" top: "y" '
              "reorg_param { stride: 2 } }", {"x": (2, 8, 6, 4)}),
    "reorg_reverse": ('layer { name: "r" type: "Reorg" bottom: "x" top: "y" '
                      "reorg_param { stride: 2 reverse: true } }", {"x": (2, 8, 6, 4)}),
    "conv3d_pool3d_max": (
        'layer { name: "c" type: "Convolution3D" bottom: "x" top: "c" convolution3d_param { '
        "num_output: 4 kernel_size: 3 kernel_depth: 3 pad: 1 temporal_pad: 1 } }\n"
        'layer { name: "p" type: "Pooling3D" bottom: "c" top: "y" pooling3d_param { '
        "pool: MAX kernel_size: 2 stride: 2 kernel_depth: 2 temporal_stride: 2 } }",
        {"x": (2, 3, 5, 7, 9)}),
    "pool3d_ave_pad": ('layer { name: "p" type: "Pooling3D" bottom: "x" top: "y" '
                       "pooling3d_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 "
                       "kernel_depth: 2 temporal_stride: 2 } }", {"x": (2, 3, 5, 7, 8)}),
    "pool_stochastic_test": ('layer { name: "p" type: "Pooling" bottom: "x" top: "y" '
                             "pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 } }", X),
    "pool_kernel_below_stride": ('layer { name: "p" type: "Pooling" bottom: "x" top: "y" '
                                 "pooling_param { pool: MAX kernel_size: 1 stride: 3 } }", X),
    "pool_ave_kernel_below_stride": ('layer { name: "p" type: "Pooling" bottom: "x" top: "y" '
                                     "pooling_param { pool: AVE kernel_size: 2 stride: 3 "
                                     "pad: 1 } }", X),
    "dropout_scale_train": ('layer { name: "d" type: "Dropout" bottom: "x" top: "y" '
                            "dropout_param { dropout_ratio: 0.3 scale_train: false } }", X),
    "spatial_dropout_test": ('layer { name: "d" type: "Python" bottom: "x" top: "y" '
                             'python_param { module: "spatial_dropout" '
                             'layer: "SpatialDropoutLayer" '
                             "param_str: \"{'phase': 'TEST', 'p': 0.2}\" } }", X),
    "darknet_pooling": ('layer { name: "m" type: "Mish" bottom: "x" top: "m" }\n'
                        'layer { name: "p" type: "Pooling" bottom: "m" top: "y" '
                        "pooling_param { pool: MAX kernel_size: 2 stride: 1 } }", X),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(SIMPLE))
def test_fork_layer(case):
    layers, inputs = SIMPLE[case]
    model, params, state = random_model(net_text(layers, inputs))
    if case == "darknet_pooling":
        assert model.net.layer("p").form == "darknet2caffe"
    agree(model, params, state, random_inputs(model, low=-3, high=3))


def test_max_unpooling_reads_the_pooling_mask():
    """SegNet's Upsample on a MAX Pooling's mask top: values back at their argmax, zeros
    elsewhere (inputs without ties, so both runtimes pick the same maxima)."""
    text = net_text(
        'layer { name: "p" type: "Pooling" bottom: "x" top: "p" top: "mask" '
        "pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n"
        'layer { name: "u" type: "Upsample" bottom: "p" bottom: "mask" top: "y" '
        "upsample_param { scale: 2 pad_out_h: true } }",
        {"x": (2, 3, 7, 8)},
    )
    model, params, state = random_model(text)
    x = np.random.default_rng(0).permutation(2 * 3 * 7 * 8).reshape(2, 3, 7, 8)
    got = agree(model, params, state, {"x": x.astype(np.float32)}, dynamic_batch=True)
    assert got["y"].shape == (2, 3, 7, 8)


def _prior_net(extra: str, loc_classes: int = 1, classes: int = 4) -> str:
    priors = 2 * 2 * 3 + 3 * 3 * 3
    return net_text(
        'layer { name: "p1" type: "PriorBox" bottom: "f1" bottom: "img" top: "p1" '
        "prior_box_param { min_size: 10 max_size: 20 aspect_ratio: 2 flip: false clip: true "
        "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 } }\n"
        'layer { name: "p2" type: "PriorBox" bottom: "f2" bottom: "img" top: "p2" '
        "prior_box_param { min_size: 5 aspect_ratio: 2 flip: true step: 8 offset: 0.5 } }\n"
        'layer { name: "pc" type: "Concat" bottom: "p1" bottom: "p2" top: "priors" '
        "concat_param { axis: 2 } }\n"
        'layer { name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" '
        f'bottom: "priors" top: "det" '
        f"detection_output_param {{ num_classes: {classes} {extra} }} }}",
        {"f1": (2, 1, 2, 2), "f2": (2, 1, 3, 3), "img": (2, 3, 24, 24),
         "loc": (2, priors * loc_classes * 4), "conf": (2, priors * classes)},
    )  # fmt: skip


DETECTION = {
    "center_size": "share_location: true background_label_id: 0 nms_param { nms_threshold: "
    "0.45 top_k: 20 } code_type: CENTER_SIZE keep_top_k: 10 confidence_threshold: 0.01",
    "corner_no_threshold": "background_label_id: 0 nms_param { nms_threshold: 0.3 } "
    "code_type: CORNER",
    "corner_size_encoded": "background_label_id: -1 nms_param { nms_threshold: 0.5 top_k: 7 } "
    "code_type: CORNER_SIZE variance_encoded_in_target: true keep_top_k: 12",
    "unshared": "share_location: false background_label_id: 1 nms_param { nms_threshold: 0.4 "
    "top_k: 9 } keep_top_k: 5 confidence_threshold: 0.05",
    "nothing_kept": "background_label_id: 0 nms_param { nms_threshold: 0.45 } "
    "confidence_threshold: 1.0",
}


@pytest.mark.parametrize("case", sorted(DETECTION))
def test_detection_output(case):
    """SSD's DetectionOutput on priors from two PriorBox layers (folded to constants)."""
    unshared = case == "unshared"
    model, params, state = random_model(_prior_net(DETECTION[case], 4 if unshared else 1))
    inputs = random_inputs(model)
    # CORNER codes: offsets that leave most boxes upright; the few inverted ones (no area in
    # the fork) must neither suppress nor be suppressed (docs/onnx.md)
    inputs["loc"] *= 0.2 if "corner" in case else 1.0
    logits = np.random.default_rng(3).normal(0, 2, (2, 39, 4))
    conf = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    inputs["conf"] = conf.reshape(2, -1).astype(np.float32)
    proto = onnx_runs.export(model, params, state)
    got = onnx_runs.run(proto, inputs)["det"]
    ours = onnx_runs.reference(model, params, state, inputs)["det"]
    onnx_runs.same_rows(ours, got)
    if case == "nothing_kept":
        np.testing.assert_array_equal(got[0, 0, :2, 0], [0, 1])
        assert (got[0, 0, :, 1] == -1).all()
    else:
        assert (got[0, 0, :, 1] >= 0).sum() > 2


def test_detection_output_with_a_dynamic_batch():
    model, params, state = random_model(_prior_net(DETECTION["center_size"]))
    proto = onnx_runs.export(model, params, state, dynamic_batch=True)
    member = model.reshape({k: (3, *s[1:]) for k, s in model.inputs.items()})
    inputs = random_inputs(member)
    inputs["conf"] = np.abs(inputs["conf"])
    got = onnx_runs.run(proto, inputs)["det"]
    ours = onnx_runs.reference(member, params, state, inputs)["det"]
    assert got.shape == ours.shape == (1, 1, 30, 7)
    onnx_runs.same_rows(ours, got)


def test_adaptive_nms_is_refused():
    model, params, state = random_model(_prior_net(
        "nms_param { nms_threshold: 0.7 eta: 0.9 } background_label_id: 0"))  # fmt: skip
    with pytest.raises(OnnxExportError, match="layer 'det' .*adaptive NMS"):
        onnx_runs.export(model, params, state)


YOLO = {
    "v2": ('layer { name: "d" type: "YoloDetectionOutput" bottom: "x" top: "y" '
           "yolo_detection_output_param { num_classes: 3 num_box: 2 confidence_threshold: 0.2 "
           "nms_threshold: 0.45 biases: 1 2 biases: 3 1.5 } }", {"x": (1, 16, 5, 5)}),
    "v3": ('layer { name: "d" type: "Yolov3DetectionOutput" bottom: "a" bottom: "b" top: "y" '
           "yolov3_detection_output_param { num_classes: 2 num_box: 2 confidence_threshold: 0.3 "
           "nms_threshold: 0.45 mask_group_num: 2 mask: 2 mask: 3 mask: 0 mask: 1 "
           "anchors_scale: 32 anchors_scale: 16 biases: 10 14 biases: 23 27 biases: 37 58 "
           "biases: 81 82 } }", {"a": (1, 14, 3, 3), "b": (1, 14, 6, 6)}),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(YOLO))
def test_yolo_detection_output(case):
    text = net_text(*YOLO[case]).replace("biases: 1 2 biases: 3 1.5", "biases: 1 biases: 2 "
                                         "biases: 3 biases: 1.5")  # fmt: skip
    text = text.replace(
        "biases: 10 14 biases: 23 27 biases: 37 58 biases: 81 82",
        " ".join(f"biases: {v}" for v in (10, 14, 23, 27, 37, 58, 81, 82)),
    )
    model, params, state = random_model(text)
    inputs = random_inputs(model, low=-2, high=2)
    proto = onnx_runs.export(model, params, state)
    got = onnx_runs.run(proto, inputs)["y"]
    ours = onnx_runs.reference(model, params, state, inputs)["y"]
    onnx_runs.same_rows(ours, got)
    assert (got[0, 0, :, 1] >= 0).sum() >= 1
    with pytest.raises(OnnxExportError, match="pools every image"):
        onnx_runs.export(model, params, state, dynamic_batch=True)
