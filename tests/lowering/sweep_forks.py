"""Sweep nets (tests/lowering/test_model.py) for the forks' layer types: the smallest net
that compiles and runs each one with ones for inputs."""

from __future__ import annotations


def _input(name: str, *dims: int) -> str:
    shape = " ".join(f"dim: {d}" for d in dims)
    return (
        f'layer {{ name: "{name}" type: "Input" top: "{name}" '
        f"input_param {{ shape {{ {shape} }} }} }}\n"
    )


_V2_BIASES = " ".join(
    f"biases: {b}" for b in (1.08, 1.19, 3.42, 4.41, 6.63, 11.38, 9.42, 5.11, 16.62, 10.52)
)
_V3_BIASES = " ".join(f"biases: {b}" for b in (10, 14, 23, 27, 37, 58, 81, 82, 135, 169, 344, 319))

FORK_SWEEP = {
    "Normalize": _input("x", 1, 4, 3, 3)
    + 'layer { name: "n" type: "Normalize" bottom: "x" top: "y" '
    "norm_param { across_spatial: false channel_shared: false } }",
    "Permute": _input("x", 1, 4, 3, 2) + 'layer { name: "p" type: "Permute" bottom: "x" top: "y" '
    "permute_param { order: 0 order: 2 order: 3 order: 1 } }",
    "PriorBox": _input("f", 1, 4, 3, 3)
    + _input("img", 1, 3, 30, 30)
    + 'layer { name: "p" type: "PriorBox" bottom: "f" bottom: "img" top: "y" '
    "prior_box_param { min_size: 10 max_size: 20 aspect_ratio: 2 flip: true clip: true "
    "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 } }",
    "DetectionOutput": _input("loc", 1, 27 * 4)
    + _input("conf", 1, 27 * 3)
    + _input("prior", 1, 2, 27 * 4)
    + 'layer { name: "d" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "prior" '
    'top: "y" detection_output_param { num_classes: 3 share_location: true '
    "background_label_id: 0 nms_param { nms_threshold: 0.45 top_k: 20 } keep_top_k: 10 "
    "code_type: CENTER_SIZE confidence_threshold: 0.01 } }",
    "ROIPooling": _input("f", 1, 4, 8, 8)
    + _input("rois", 2, 5)
    + 'layer { name: "r" type: "ROIPooling" bottom: "f" bottom: "rois" top: "y" '
    "roi_pooling_param { pooled_h: 2 pooled_w: 2 spatial_scale: 0.5 } }",
    "PSROIPooling": _input("f", 1, 8, 8, 8)
    + _input("rois", 2, 5)
    + 'layer { name: "r" type: "PSROIPooling" bottom: "f" bottom: "rois" top: "y" '
    "psroi_pooling_param { spatial_scale: 0.5 output_dim: 2 group_size: 2 } }",
    "Reorg": _input("x", 1, 4, 4, 4)
    + 'layer { name: "r" type: "Reorg" bottom: "x" top: "y" reorg_param { stride: 2 } }',
    "YoloDetectionOutput": _input("x", 1, 5 * (5 + 3), 4, 4)
    + 'layer { name: "d" type: "YoloDetectionOutput" bottom: "x" top: "y" '
    f"yolo_detection_output_param {{ num_classes: 3 confidence_threshold: 0.3 "
    f"nms_threshold: 0.45 {_V2_BIASES} }} }}",
    "Yolov3DetectionOutput": _input("a", 1, 3 * (5 + 2), 2, 2)
    + _input("b", 1, 3 * (5 + 2), 4, 4)
    + 'layer { name: "d" type: "Yolov3DetectionOutput" bottom: "a" bottom: "b" top: "y" '
    f"yolov3_detection_output_param {{ num_classes: 2 confidence_threshold: 0.3 "
    f"nms_threshold: 0.45 {_V3_BIASES} mask: 3 mask: 4 mask: 5 mask: 0 mask: 1 mask: 2 "
    "anchors_scale: 32 anchors_scale: 16 mask_group_num: 2 } }",
    "BN": _input("x", 2, 3, 4, 4) + 'layer { name: "b" type: "BN" bottom: "x" top: "y" '
    'bn_param { bn_mode: LEARN scale_filler { type: "constant" value: 1 } } }',
    "Upsample": _input("x", 1, 2, 4, 4)
    + 'layer { name: "p" type: "Pooling" bottom: "x" top: "p" top: "mask" '
    "pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n"
    + 'layer { name: "u" type: "Upsample" bottom: "p" bottom: "mask" top: "y" '
    "upsample_param { scale: 2 } }",
    "Interp": _input("x", 1, 2, 3, 4)
    + 'layer { name: "i" type: "Interp" bottom: "x" top: "y" interp_param { zoom_factor: 2 } }',
    "ShuffleChannel": _input("x", 1, 6, 2, 2)
    + 'layer { name: "s" type: "ShuffleChannel" bottom: "x" top: "y" '
    "shuffle_channel_param { group: 3 } }",
    "ConvolutionDepthwise": _input("x", 1, 4, 5, 5)
    + 'layer { name: "c" type: "ConvolutionDepthwise" bottom: "x" top: "y" '
    "convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }",
    "DepthwiseConvolution": _input("x", 1, 4, 5, 5)
    + 'layer { name: "c" type: "DepthwiseConvolution" bottom: "x" top: "y" '
    "convolution_param { num_output: 4 group: 4 kernel_size: 3 pad: 1 } }",
    "Axpy": _input("a", 1, 3, 1, 1)
    + _input("x", 1, 3, 4, 4)
    + _input("b", 1, 3, 4, 4)
    + 'layer { name: "p" type: "Axpy" bottom: "a" bottom: "x" bottom: "b" top: "y" }',
    "ReLU6": _input("x", 2, 3) + 'layer { name: "r" type: "ReLU6" bottom: "x" top: "y" }',
    "Mish": _input("x", 2, 3) + 'layer { name: "m" type: "Mish" bottom: "x" top: "y" }',
    "MultiBoxLoss": _input("loc", 2, 27 * 4)
    + _input("conf", 2, 27 * 3)
    + _input("prior", 1, 2, 27 * 4)
    + _input("label", 1, 1, 4, 8)
    + 'layer { name: "m" type: "MultiBoxLoss" bottom: "loc" bottom: "conf" bottom: "prior" '
    'bottom: "label" top: "y" multibox_loss_param { num_classes: 3 code_type: CENTER_SIZE } }',
    "DetectionEvaluate": _input("det", 1, 1, 6, 7)
    + _input("label", 1, 1, 4, 8)
    + 'layer { name: "e" type: "DetectionEvaluate" bottom: "det" bottom: "label" top: "y" '
    "detection_evaluate_param { num_classes: 3 } }",
    "SmoothL1Loss": _input("p", 2, 4)
    + _input("t", 2, 4)
    + _input("w", 2, 4)
    + 'layer { name: "s" type: "SmoothL1Loss" bottom: "p" bottom: "t" bottom: "w" top: "y" }',
    "Proposal": _input("prob", 1, 2, 3, 3)
    + _input("deltas", 1, 4, 3, 3)
    + _input("info", 1, 4)
    + 'layer { name: "p" type: "Proposal" bottom: "prob" bottom: "deltas" bottom: "info" '
    'top: "rois" top: "scores" proposal_param { ratio: 1 scale: 2 min_size: 0 } }',
}

# CRNN (lowering/forks/crnn.py): the inputs are ones, so the labels read "1 1" (T = 4 aligns them)
FORK_SWEEP["CtcLoss"] = (
    _input("x", 4, 2, 3)
    + _input("label", 2, 2)
    + 'layer { name: "c" type: "CtcLoss" bottom: "x" bottom: "label" top: "loss" '
    "ctc_loss_param { alphabet_size: 3 time_step: 4 blank_label: 0 } }"
)
FORK_SWEEP["LabelsequenceAccuracy"] = (
    _input("x", 2, 4, 3)
    + _input("label", 2, 2)
    + 'layer { name: "a" type: "LabelsequenceAccuracy" bottom: "x" bottom: "label" top: "acc" '
    "labelsequence_accuracy_param { blank_label: 0 } }"
)

# R-FCN's OHEM layers (lowering/forks/rfcn_ohem.py), shaped as py-R-FCN's
# train_agnostic_ohem.prototxt
FORK_SWEEP["SoftmaxWithLossOHEM"] = (
    _input("score", 4, 3)
    + _input("labels", 4, 1, 1, 1)
    + 'layer { name: "s" type: "SoftmaxWithLossOHEM" bottom: "score" bottom: "labels" '
    'top: "loss" top: "prob" top: "per_roi" loss_weight: 1 loss_weight: 0 loss_weight: 0 '
    "loss_param { ignore_label: -1 } }"
)
FORK_SWEEP["SmoothL1LossOHEM"] = (
    _input("pred", 4, 8, 1, 1)
    + _input("target", 4, 8, 1, 1)
    + _input("w", 4, 8, 1, 1)
    + 'layer { name: "s" type: "SmoothL1LossOHEM" bottom: "pred" bottom: "target" bottom: "w" '
    'top: "loss" top: "per_roi" loss_weight: 1 loss_weight: 0 '
    "loss_param { normalization: PRE_FIXED pre_fixed_normalizer: 128 } }"
)
FORK_SWEEP["BoxAnnotatorOHEM"] = (
    _input("rois", 4, 5, 1, 1)
    + _input("loss", 4, 1, 1, 1)
    + _input("labels", 4, 1, 1, 1)
    + _input("w", 4, 8, 1, 1)
    + 'layer { name: "b" type: "BoxAnnotatorOHEM" bottom: "rois" bottom: "loss" '
    'bottom: "labels" bottom: "w" top: "labels_ohem" top: "w_ohem" '
    "box_annotator_ohem_param { roi_per_img: 2 ignore_label: -1 } }"
)

# issue 35's fork families: CTPN, YOLOv2 (gklz1982), soeaver's caffe-priv, RCF
FORK_SWEEP["Lstm"] = _input("x", 3, 1, 4) + (
    'layer { name: "l" type: "Lstm" bottom: "x" top: "y" lstm_param { num_output: 2 '
    'weight_filler { type: "gaussian" std: 0.1 } } }'
)
FORK_SWEEP["Reverse"] = _input("x", 3, 1, 4) + (
    'layer { name: "r" type: "Reverse" bottom: "x" top: "y" reverse_param { axis: 0 } }'
)
FORK_SWEEP["Transpose"] = _input("x", 1, 2, 3, 4) + (
    'layer { name: "t" type: "Transpose" bottom: "x" top: "y" '
    "transpose_param { dim: 0 dim: 2 dim: 3 dim: 1 } }"
)
FORK_SWEEP["RegionLoss"] = (
    _input("x", 1, 2 * (5 + 3), 3, 3)
    + _input("label", 1, 150)
    + 'layer { name: "l" type: "RegionLoss" bottom: "x" bottom: "label" top: "loss" '
    "region_loss_param { side: 3 num_class: 3 coords: 4 num: 2 "
    "biases: 1.0 biases: 1.2 biases: 2.5 biases: 1.8 } }"
)
FORK_SWEEP["SeLu"] = _input("x", 1, 2, 3, 3) + (
    'layer { name: "s" type: "SeLu" bottom: "x" top: "y" }'
)
FORK_SWEEP["SeLuDropout"] = _input("x", 1, 2, 3, 3) + (
    'layer { name: "s" type: "SeLuDropout" bottom: "x" top: "y" '
    "selu_dropout_param { dropout_ratio: 0.2 } }"
)
FORK_SWEEP["AutoCrop"] = (
    _input("data", 1, 1, 8, 8) + 'layer { name: "c" type: "Convolution" bottom: "data" top: "c" '
    "convolution_param { num_output: 1 kernel_size: 3 } }\n"
    'layer { name: "a" type: "AutoCrop" bottom: "data" bottom: "c" top: "y" }'
)
