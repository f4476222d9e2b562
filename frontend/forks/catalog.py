"""The forks of Caffe as data: their wire numbers, layer types and V1 enum values.

Each :class:`Fork` lists what its caffe.proto adds to or renumbers in BVLC's, by message and
field *name*, with the fork's own number (read from each fork's src/caffe/proto/caffe.proto at
the commits of ``../shared/forks/FORKS.md`` §0). caffe2jax's schema (frontend/caffe.proto) holds
every one of these fields under the same names, some at other numbers (the header of
caffe.proto gives the rule); :mod:`caffe2jax.frontend.forks.dialect` builds from these tables the
schema each fork actually wrote its binary files with.

``adds`` are the fork's own fields (seeing one in a prototxt is evidence of the fork);
``renumbers`` are fields another schema also has that this fork numbers differently (no
evidence). Entries are ``"Message": {"field": number}`` with nested messages written
``"Outer.Inner"``; enum values likewise under the enum's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from caffe2jax.frontend.forks.catalog_face import FACE_FORKS
from caffe2jax.frontend.forks.catalog_pvanet import PVANET_FORKS
from caffe2jax.frontend.forks.catalog_ssd_derived import SSD_DERIVED_FORKS
from caffe2jax.frontend.forks.catalog_tail import TAIL_FORKS
from caffe2jax.frontend.forks.catalog_yolo_ctpn import YOLO_CTPN_FORKS
from caffe2jax.frontend.forks.fork import Fork, Numbers

_SSD_LAYER = {
    "annotated_data_param": 200, "multibox_loss_param": 201, "permute_param": 202,
    "prior_box_param": 203, "detection_output_param": 204, "detection_evaluate_param": 205,
    "norm_param": 206,
}  # fmt: skip
_SSD_TRANSFORM = {
    "resize_param": 8, "noise_param": 9, "emit_constraint": 10, "crop_h": 11, "crop_w": 12,
    "distort_param": 13, "expand_param": 14,
}  # fmt: skip
_SSD_TYPES = (
    "AnnotatedData", "MultiBoxLoss", "Permute", "PriorBox", "DetectionOutput",
    "DetectionEvaluate", "Normalize", "SmoothL1Loss",
)  # fmt: skip
_SEGNET_BN = {"scale_filler": 1, "shift_filler": 2, "bn_mode": 3}
_SEGNET_UPSAMPLE = {
    "scale_h": 2, "scale_w": 3, "pad_out_h": 4, "pad_out_w": 5, "upsample_h": 6, "upsample_w": 7
}  # fmt: skip
_SEGNET_LOSS = {"weight_by_label_freqs": 3, "class_weighting": 4}
_DEEPLAB_LAYER = {
    "interp_param": 143, "seg_accuracy_param": 144, "mat_write_param": 145,
    "dense_crf_param": 146, "domain_transform_param": 147, "adaptive_bias_channel_param": 148,
    "bias_channel_param": 149, "unique_label_param": 150, "mat_read_param": 151,
}  # fmt: skip
_DEEPLAB_TYPES = (
    "Interp", "ImageSegData", "SegAccuracy", "MatWrite", "MatRead", "DenseCRF",
    "DomainTransform", "DomainTransformForwardOnly", "AdaptiveBiasChannel", "BiasChannel",
    "UniqueLabel", "SpatialProduct",
)  # fmt: skip
_DEEPLAB_V2 = {
    "LayerParameter": _DEEPLAB_LAYER,
    "TransformationParameter": {"scale_factors": 8, "crop_width": 9, "crop_height": 10},
    "ImageDataParameter": {"ignore_label": 15, "label_type": 16},
    "BatchNormParameter": {"update_global_stats": 4},
}
_DEEPLAB_V1_PARAMS = {
    "seg_accuracy_param": 42, "interp_param": 43, "softmaxloss_param": 44, "padding_param": 45,
    "mat_write_param": 46, "mat_read_param": 47, "dense_crf_param": 48,
    "dominant_channel_param": 49, "bias_channel_param": 50, "unique_label_param": 51,
    "censor_label_param": 52, "adaptive_bias_channel_param": 53, "channel_aggregator_param": 54,
    "ignore_overlay_param": 55, "histogram_param": 56, "euclidean_loss_param": 57,
    "gain_channel_param": 58, "onehot_param": 59, "strict_dim": 1003,
}  # fmt: skip
_DEEPLAB_V1_TYPES = {
    "IMAGE_SEG_DATA": ("ImageSegData", 39), "SEG_ACCURACY": ("SegAccuracy", 40),
    "INTERP": ("Interp", 41), "PADDING": ("Padding", 42), "MAT_WRITE": ("MatWrite", 43),
    "MAT_READ": ("MatRead", 44), "DENSE_CRF": ("DenseCRF", 45),
    "DOMINANT_CHANNEL": ("DominantChannel", 46), "BIAS_CHANNEL": ("BiasChannel", 47),
    "UNIQUE_LABEL": ("UniqueLabel", 48), "CENSOR_LABEL": ("CensorLabel", 49),
    "ADAPTIVE_BIAS_CHANNEL": ("AdaptiveBiasChannel", 50),
    "CHANNEL_AGGREGATOR": ("ChannelAggregator", 51), "IGNORE_OVERLAY": ("IgnoreOverlay", 52),
    "HISTOGRAM": ("Histogram", 53), "RELATIVE_ERROR": ("RelativeError", 54),
    "GAIN_CHANNEL": ("GainChannel", 55), "ONEHOT": ("OneHot", 56),
}  # fmt: skip
_C3D_V10_TYPES = {
    "ELTWISE_PRODUCT": ("Eltwise", 25), "CONVOLUTION3D": ("Convolution3D", 30),
    "POOLING3D": ("Pooling3D", 31), "VOLUME_DATA": ("VolumeData", 32),
    "VIDEO_DATA": ("VideoData", 33), "DECONVOLUTION3D": ("Deconvolution3D", 34),
    "VIDEO_SEGMENTATION_DATA": ("VideoSegmentationData", 35),
    "VOXEL_SOFTMAX": ("VoxelSoftmax", 36), "VOXEL_SOFTMAX_LOSS": ("VoxelSoftmaxWithLoss", 37),
    "VIDEO_WITH_VOXEL_TRUTH_DATA": ("VideoWithVoxelTruthData", 38),
    "VOXEL_CUSTOM_LOSS": ("VoxelCustomLoss", 39), "DOWN_SAMPLING": ("DownSampling", 40),
}  # fmt: skip
_ERIC612_LAYER = {
    **_SSD_LAYER, "reorg_param": 149, "upsample_param": 150, "relu6_param": 211,
    "region_loss_param": 600, "yolo_detection_output_param": 601,
    "yolov3_detection_output_param": 602, "yolov3_param": 603, "yolo_seg_param": 604,
    "segmentation_evaluate_param": 605,
}  # fmt: skip
_ERIC612_TRANSFORM = {
    **_SSD_TRANSFORM, "enable_classf_aug": 15, "min_scaling_factor": 16,
    "max_scaling_factor": 17, "max_rotation_angle": 18, "contrast_brightness_adjustment": 19,
    "smooth_filtering": 20, "min_contrast": 21, "max_contrast": 22, "max_brightness_shift": 23,
    "max_smooth": 24, "max_color_shift": 25, "min_side_min": 26, "min_side_max": 27,
    "min_side": 28, "apply_probability": 29, "debug_params": 30, "cvt_bgr2rgb": 31,
}  # fmt: skip
_SSD_SOLVER = {"plateau_winsize": 43, "show_per_class_result": 44}
_SSD_STATE = {"minimum_loss": 5, "iter_last_event": 6}
_V1_TYPES = "V1LayerParameter.LayerType"


def _v1(table: Mapping[str, tuple[str, int]]) -> tuple[dict[str, str], dict[str, int]]:
    return {k: v[0] for k, v in table.items()}, {k: v[1] for k, v in table.items()}


_DLV1_V1, _DLV1_ENUM = _v1(_DEEPLAB_V1_TYPES)
_C3D_V1, _C3D_ENUM = _v1(_C3D_V10_TYPES)

#: Every fork caffe2jax reads, in the priority order of caffe.proto's numbering rule.
FORKS: tuple[Fork, ...] = (
    Fork(
        "c3d-v1.1", "C3D v1.1", "facebook/C3D@71336a2 (C3D-v1.1)",
        adds={"LayerParameter": {"video_data_param": 6660, "convolution3d_param": 6661,
                                 "pooling3d_param": 6662},
              "VideoDataParameter": {"source": 1, "new_length": 13, "use_image": 15,
                                     "use_temporal_jitter": 16, "sampling_rate": 17}},
        types=("Convolution3D", "Pooling3D", "VideoData", "Deconvolution3D", "L2Normalize",
               "BlackHole"),
    ),
    Fork(
        "ssd", "SSD", "weiliu89/caffe@4817bf8 (branch ssd)",
        adds={"LayerParameter": {**_SSD_LAYER, "video_data_param": 207},
              "TransformationParameter": _SSD_TRANSFORM,
              "SolverParameter": {"eval_type": 41, "ap_version": 42, **_SSD_SOLVER},
              "SolverState": _SSD_STATE,
              "VideoDataParameter": {"video_type": 1, "device_id": 2, "video_file": 3,
                                     "skip_frames": 4}},
        types=(*_SSD_TYPES, "VideoData"),
    ),
    Fork(
        "frcnn", "Faster R-CNN", "rbgirshick/caffe-fast-rcnn@0dcd397",
        adds={"LayerParameter": {"roi_pooling_param": 8266711, "smooth_l1_loss_param": 8266712},
              "DropoutParameter": {"scale_train": 2}},
        types=("ROIPooling", "SmoothL1Loss"),
    ),
    Fork(
        "segnet", "SegNet", "alexgkendall/caffe-segnet@344c113",
        adds={"LayerParameter": {"bn_param": 45, "upsample_param": 137,
                                 "dense_image_data_param": 138},
              "LossParameter": _SEGNET_LOSS, "DropoutParameter": {"sample_weights_test": 2},
              "BNParameter": _SEGNET_BN, "UpsampleParameter": _SEGNET_UPSAMPLE},
        types=("BN", "Upsample", "DenseImageData"),
    ),
    Fork(
        "enet", "ENet", "TimoSaemann/caffe-enet@22d356c",
        adds={"LayerParameter": {"bn_param": 45, "dense_image_data_param": 46,
                                 "upsample_param": 147},
              "LossParameter": _SEGNET_LOSS, "DropoutParameter": {"sample_weights_test": 2},
              "BNParameter": _SEGNET_BN, "UpsampleParameter": _SEGNET_UPSAMPLE,
              "DenseImageDataParameter": {"label_divide_factor": 13},
              "ImageDataParameter": {"label_divide_factor": 13}},
        renumbers={"LossParameter": {"normalization": 5}},
        types=("BN", "Upsample", "DenseImageData"),
    ),
    Fork("deeplab-v2", "DeepLab v2", "DrSleep/deeplab-public-ver2@a11f8a2", adds=_DEEPLAB_V2,
         types=_DEEPLAB_TYPES),
    Fork(
        "pspnet", "PSPNet", "hszhao/PSPNet@798bdc9",
        adds={**_DEEPLAB_V2,
              "LayerParameter": {**_DEEPLAB_LAYER, "bn_param": 152},
              "BNParameter": {"slope_filler": 1, "bias_filler": 2, "momentum": 3, "eps": 4,
                              "frozen": 5, "engine": 6}},
        types=("BN", *_DEEPLAB_TYPES),
    ),
    Fork(
        "deeplab-v1", "DeepLab v1", "TheLegendAli/DeepLab-Context@fb04e9e (V1 syntax)",
        adds={"V1LayerParameter": _DEEPLAB_V1_PARAMS,
              "ConvolutionParameter": {"hole": 17, "hole_h": 18, "hole_w": 19},
              "ImageDataParameter": {"has_label": 13, "max_labels": 14, "ignore_label": 15,
                                     "label_type": 16}},
        enums={_V1_TYPES: _DLV1_ENUM},
        types=tuple(sorted(set(_DLV1_V1.values()))), v1_types=_DLV1_V1,
    ),
    Fork(
        "rfcn", "R-FCN", "Microsoft/caffe@1a2be8e",
        adds={"LayerParameter": {"roi_pooling_param": 147, "smooth_l1_loss_param": 148,
                                 "psroi_pooling_param": 149, "box_annotator_ohem_param": 150,
                                 "mil_data_param": 5065028, "mil_param": 5065036},
              "LossParameter": {"pre_fixed_normalizer": 4},
              "DropoutParameter": {"scale_train": 2}},
        enums={"LossParameter.NormalizationMode": {"PRE_FIXED": 3}},
        enum_renumbers={"LossParameter.NormalizationMode": {"NONE": 4}},
        types=("ROIPooling", "SmoothL1Loss", "PSROIPooling", "BoxAnnotatorOHEM",
               "SoftmaxWithLossOHEM", "SmoothL1LossOHEM"),
    ),
    Fork(
        "crnn", "CRNN", "yalecyu/crnn.caffe@0d95ba2",
        adds={"LayerParameter": {"ctc_loss_param": 200, "continuation_indicator_param": 201,
                                 "permute_param": 202, "labelsequence_accuracy_param": 203}},
        types=("CtcLoss", "ContinuationIndicator", "LabelsequenceAccuracy", "Permute"),
    ),
    Fork(
        "c3d-v1.0", "C3D v1.0", "facebook/C3D@71336a2 (C3D-v1.0, V1 syntax)",
        adds={"V1LayerParameter": {"down_sampling_param": 23},
              "BlobProto": {"length": 3},
              "ConvolutionParameter": {"kernel_depth": 6, "temporal_stride": 8,
                                       "filter_group": 11, "temporal_pad": 12},
              "PoolingParameter": {"kernel_depth": 5, "temporal_stride": 6},
              "DataParameter": {"show_data": 8},
              "ImageDataParameter": {
                  "new_length": 11, "show_data": 12, "use_image": 13, "sampling_rate": 14,
                  "use_label": 15, "use_temporal_jitter": 16, "mean_value": 17,
                  "num_truth_channels": 18, "use_byte_input": 19, "is_flow": 20,
                  "truth_scale": 21, "clip_min": 22, "clip_max": 23}},
        renumbers={"BlobProto": {"height": 4, "width": 5, "data": 6, "diff": 7},
                   "ConvolutionParameter": {"stride": 7, "weight_filler": 9, "bias_filler": 10}},
        enums={_V1_TYPES: _C3D_ENUM},
        types=tuple(sorted(set(_C3D_V1.values()) - {"Eltwise"})), v1_types=_C3D_V1,
        blob_layout="c3d-v1.0",
    ),
    Fork(
        "eric612", "MobileNet-YOLO", "eric612/MobileNet-YOLO@69b4441",
        adds={"LayerParameter": _ERIC612_LAYER, "TransformationParameter": _ERIC612_TRANSFORM,
              "SolverParameter": {**_SSD_SOLVER, "stagelr": 50, "stageiter": 51,
                                  "eval_type": 52, "ap_version": 53},
              "SolverState": _SSD_STATE, "V1LayerParameter": {"relu6_param": 61},
              "Datum": {"seg_label": 8}, "Annotation": {"lanes": 3},
              "AnnotatedDataParameter": {
                  "yolo_data_type": 4, "yolo_data_jitter": 5, "train_diffcult": 6,
                  "single_class": 7, "seg_scales": 8, "seg_resize_width": 9,
                  "seg_resize_height": 10, "difficult_label_warmup": 11}},
        enums={_V1_TYPES: {"RELU6": 61},
               "AnnotatedDatum.AnnotationType": {"BBOXandSeg": 1, "LANE": 2}},
        types=(*_SSD_TYPES, "Upsample", "DepthwiseConvolution", "ReLU6", "Reorg", "RegionLoss",
               "YoloDetectionOutput", "Yolov3DetectionOutput", "Yolov3", "GaussianYolov3",
               "YoloSeg", "SegmentationEvaluate", "AssistedExcitation", "LaneData", "Axpy"),
        v1_types={"RELU6": "ReLU6"},
    ),
    Fork(
        "darknet2caffe", "darknet2caffe", "ChenYingpeng/darknet2caffe@f6d9ea3 (on SSD's Caffe)",
        adds={"LayerParameter": {**_SSD_LAYER, "video_data_param": 207, "upsample_param": 149,
                                 "mish_param": 150},
              "TransformationParameter": _SSD_TRANSFORM,
              "SolverParameter": {"eval_type": 41, "ap_version": 42, **_SSD_SOLVER},
              "SolverState": _SSD_STATE},
        types=(*_SSD_TYPES, "Upsample", "Mish"),
    ),
    Fork("shufflenet", "ShuffleNet", "farmingyard/ShuffleNet@b962444 (README patch)",
         adds={"LayerParameter": {"shuffle_channel_param": 164}}, types=("ShuffleChannel",)),
    Fork("ceil_mode", "the ceil_mode patch", "BVLC/caffe PR #3057 (as OpenCV's proto has it)",
         adds={"PoolingParameter": {"ceil_mode": 13}}),
    Fork("senet", "SENet", "hujie-frank/SENet@0262d43", types=("Axpy",)),
    Fork("mobilenet", "caffe-mobilenet", "farmingyard/caffe-mobilenet (depthwise convolution)",
         types=("ConvolutionDepthwise",)),
    Fork("depthwise", "DepthwiseConvolution", "yonghenglh6/DepthwiseConvolution",
         types=("DepthwiseConvolution",)),
    *FACE_FORKS,
    *YOLO_CTPN_FORKS,
    *SSD_DERIVED_FORKS,
    *TAIL_FORKS,
    *PVANET_FORKS,
)  # fmt: skip

FORKS_BY_KEY: Mapping[str, Fork] = MappingProxyType({f.key: f for f in FORKS})

#: caffe.proto fields no fork writes: where upgraded DeepLab v1 / C3D v1.0 V1 layers keep
#: their fork parameters (those forks have no V2 LayerParameter).
CAFFE2JAX_HOMES: Numbers = MappingProxyType(
    {
        "LayerParameter": {
            name: 0
            for name in (
                "softmaxloss_param", "padding_param", "dominant_channel_param",
                "censor_label_param", "channel_aggregator_param", "ignore_overlay_param",
                "histogram_param", "euclidean_loss_param", "gain_channel_param", "onehot_param",
                "down_sampling_param",
            )
        }
    }
)  # fmt: skip


def _non_bvlc(attr: str, extra: Numbers) -> Mapping[str, frozenset[str]]:
    names: dict[str, set[str]] = {msg: set(fields) for msg, fields in extra.items()}
    for fork in FORKS:
        for msg, fields in getattr(fork, attr).items():
            names.setdefault(msg, set()).update(fields)
    return MappingProxyType({msg: frozenset(v) for msg, v in names.items()})


#: Message -> the fields of caffe.proto that BVLC Caffe does not have (the forks' additions
#: and caffe2jax's homes for V1 fork parameters); enum -> values likewise.
NON_BVLC_FIELDS = _non_bvlc("adds", CAFFE2JAX_HOMES)
NON_BVLC_VALUES = _non_bvlc("enums", {})

#: The forks of an Upsample layer: max-unpooling has two bottoms (values and the pooling
#: mask), the YOLO ports' nearest-neighbour form one. Best guess first.
UPSAMPLE_FORKS: Mapping[bool, tuple[str, ...]] = MappingProxyType(
    {True: ("segnet", "enet"), False: ("darknet2caffe", "eric612")}
)

#: The fork a type string comes from, where several forks register it (best guess first).
TYPE_HOMES: Mapping[str, str] = MappingProxyType(
    {
        "Axpy": "senet", "DepthwiseConvolution": "depthwise", "Permute": "ssd",
        "SmoothL1Loss": "frcnn", "ROIPooling": "frcnn", "BN": "segnet", "VideoData": "c3d-v1.1",
        "Interp": "deeplab-v2", "Normalize": "ssd", "MarginInnerProduct": "sphereface",
        "LargeMarginInnerProduct": "lsoftmax", "CenterLoss": "caffe-face",
    }
)  # fmt: skip


def forks_of_type(layer_type: str) -> tuple[Fork, ...]:
    """The forks that register ``layer_type``, its home fork first (empty for BVLC types and
    unknown ones)."""
    forks = [f for f in FORKS if layer_type in f.types]
    home = TYPE_HOMES.get(layer_type)
    return tuple(sorted(forks, key=lambda f: f.key != home))


def fork_names(forks: tuple[Fork, ...]) -> str:
    """``"SSD / MobileNet-YOLO"``: the forks' names for a message."""
    return " / ".join(dict.fromkeys(f.name for f in forks))
