"""The forks' layer types as data: where a type comes from, which only training uses, and
what to say of fields and types caffe2jax does not support yet.

The numbering side of the forks is :mod:`caffe2jax.frontend.forks.catalog`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from caffe2jax.frontend.forks.catalog import FORKS_BY_KEY, UPSAMPLE_FORKS, fork_names, forks_of_type

#: Python layer modules that belong to a fork's models (Caffe's python_param.module).
PYTHON_MODULES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "rpn.proposal_layer": ("frcnn", "rfcn"),
        "rpn.anchor_target_layer": ("frcnn", "rfcn"),
        "rpn.proposal_target_layer": ("frcnn", "rfcn"),
        "roi_data_layer.layer": ("frcnn", "rfcn"),
        "spatial_dropout": ("enet",),
    }
)

#: Fork layer types that only training or evaluation uses (issue 26's layers).
TRAINING_TYPES: frozenset[str] = frozenset(
    {
        "Yolov3", "GaussianYolov3", "YoloSeg", "SegmentationEvaluate", "LaneData",
        "SegAccuracy", "VoxelSoftmaxWithLoss", "VoxelCustomLoss",
    }
)  # fmt: skip

#: Loss types whose fork LayerSetUp skips LossLayer's, so that no ``loss_weight`` means 0
#: (ydwen/caffe-face's and happynear's CenterLoss), not Caffe's default 1.
NO_DEFAULT_LOSS_WEIGHT: frozenset[str] = frozenset({"CenterLoss"})

#: What some unsupported fork types are, where "a training layer" would mislead.
TYPE_KINDS: Mapping[str, str] = MappingProxyType(
    {"MatRead": "a reader of input blobs from MATLAB .mat files"}
)

#: Fields of forks caffe2jax's schema does not hold, for messages that name their owner.
UNKNOWN_FORK_FIELDS: Mapping[str, str] = MappingProxyType(
    {
        "normalize_bbox_param": "OpenCV's Normalize layer (opencv-caffe.proto; caffe2jax "
        "reads SSD's norm_param)",
        "correlation_param": "the Correlation layer of FlowNet's Caffe (synopsys-caffe)",
        "squeeze_convolution_param": "synopsys-caffe's SqueezeConvolution layer",
        "squeeze_inner_product_param": "synopsys-caffe's SqueezeInnerProduct layer",
        "yolo_v2_loss_param": "synopsys-caffe's YoloV2Loss layer",
        "yolo_v3_loss_param": "synopsys-caffe's YoloV3Loss layer",
        "box_output_param": "the BoxOutput layer of gdlg/panoramic-object-detection",
        "ring_pad_param": "the RingPad layer of gdlg/panoramic-object-detection",
        "spatial_dropout_param": "a SpatialDropout layer of another Caffe fork (ENet's is a "
        "Python layer)",
    }
)


#: (type, form) -> the forks of that form (frontend/forks/forms.py), home first.
FORM_FORKS: Mapping[tuple[str, str], tuple[str, ...]] = MappingProxyType(
    {
        ("BN", "segnet"): ("segnet", "enet"), ("BN", "pspnet"): ("pspnet",),
        ("Upsample", "max_unpool"): UPSAMPLE_FORKS[True],
        ("Upsample", "nearest"): UPSAMPLE_FORKS[False],
        ("SmoothL1Loss", "rcnn"): ("frcnn", "rfcn"),
        ("SmoothL1Loss", "ssd"): ("ssd", "eric612", "darknet2caffe"),
        ("VideoData", "ssd"): ("ssd",), ("VideoData", "c3d"): ("c3d-v1.1",),
        ("VideoData", "c3d-v1.0"): ("c3d-v1.0",), ("Convolution3D", "c3d-v1.0"): ("c3d-v1.0",),
        ("Pooling3D", "c3d-v1.0"): ("c3d-v1.0",), ("Interp", "deeplab-v1"): ("deeplab-v1",),
        ("ImageSegData", "deeplab-v1"): ("deeplab-v1",),
        ("Normalize", "happynear"): ("happynear",),
        ("InnerProduct", "happynear"): ("happynear",),
        ("CenterLoss", "happynear"): ("happynear",),
    }
)  # fmt: skip


def unsupported_fork_type(layer_type: str, form: str = "") -> str | None:
    """What to say of a fork layer type caffe2jax does not lower (None: not a fork type)."""
    keys = FORM_FORKS.get((layer_type, form))
    forks = tuple(FORKS_BY_KEY[k] for k in keys) if keys else forks_of_type(layer_type)
    if not forks:
        return None
    home = f"{forks[0].name} ({forks[0].source})"
    also = f"; also in {fork_names(forks[1:])}" if forks[1:] else ""
    if layer_type in TYPE_KINDS:
        return f"{TYPE_KINDS[layer_type]} of {home}{also}, not supported yet"
    if layer_type in TRAINING_TYPES:
        return f"a training layer of {home}{also}, not supported yet"
    return f"the {layer_type} layer of {home}{also}, which caffe2jax does not support yet"


#: The parameter fields each fork layer type reads (beside transform_param and loss_param):
#: a fork layer decoded from a binary with another parameter is the wrong fork's numbering.
FORK_TYPE_PARAMS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "AnnotatedData": ("annotated_data_param", "data_param"),
        "MultiBoxLoss": ("multibox_loss_param",), "Permute": ("permute_param",),
        "PriorBox": ("prior_box_param",), "DetectionOutput": ("detection_output_param",),
        "DetectionEvaluate": ("detection_evaluate_param",), "Normalize": ("norm_param",),
        "VideoData": ("video_data_param",), "ROIPooling": ("roi_pooling_param",),
        "SmoothL1Loss": ("smooth_l1_loss_param",), "PSROIPooling": ("psroi_pooling_param",),
        "BoxAnnotatorOHEM": ("box_annotator_ohem_param",),
        "SoftmaxWithLossOHEM": ("softmax_param",), "SmoothL1LossOHEM": ("smooth_l1_loss_param",),
        "BN": ("bn_param",), "Upsample": ("upsample_param",),
        "DenseImageData": ("dense_image_data_param",), "Interp": ("interp_param",),
        "ImageSegData": ("image_data_param",), "SegAccuracy": ("seg_accuracy_param",),
        "MatWrite": ("mat_write_param",), "MatRead": ("mat_read_param",),
        "DenseCRF": ("dense_crf_param",), "DomainTransform": ("domain_transform_param",),
        "DomainTransformForwardOnly": ("domain_transform_param",),
        "AdaptiveBiasChannel": ("adaptive_bias_channel_param",),
        "BiasChannel": ("bias_channel_param",), "UniqueLabel": ("unique_label_param",),
        "CtcLoss": ("ctc_loss_param",),
        "ContinuationIndicator": ("continuation_indicator_param",),
        "LabelsequenceAccuracy": ("labelsequence_accuracy_param",),
        "Convolution3D": ("convolution3d_param",), "Pooling3D": ("pooling3d_param",),
        "Reorg": ("reorg_param",), "ReLU6": ("relu6_param",),
        "RegionLoss": ("region_loss_param",),
        "YoloDetectionOutput": ("yolo_detection_output_param",),
        "Yolov3DetectionOutput": ("yolov3_detection_output_param",),
        "Yolov3": ("yolov3_param",), "GaussianYolov3": ("yolov3_param",),
        "YoloSeg": ("yolo_seg_param",), "SegmentationEvaluate": ("segmentation_evaluate_param",),
        "Mish": ("mish_param",), "ShuffleChannel": ("shuffle_channel_param",),
        "DepthwiseConvolution": ("convolution_param",),
        "ConvolutionDepthwise": ("convolution_param",), "Axpy": (),
    }
)  # fmt: skip
