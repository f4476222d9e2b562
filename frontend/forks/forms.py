"""Layer forms: which of a type string's meanings a layer has, decided once, here.

Some type strings name different layers in different forks. The frontend decides the form of
every such layer from its prototxt (the fields it sets, its bottom count) and, where the text
alone cannot tell, from the net's dialect; ``ir.Layer.form`` holds the answer, and the
lowering registry finds the layer's entry by (type, form) (each form registered in its fork's
module, lowering/forks/). A form never depends on a binary file.

=================  =============  ============================================================
type               form           meaning
=================  =============  ============================================================
BN                 ``segnet``     SegNet / ENet: blobs [scale, shift] (1,C,1,1); ``bn_mode``
                                  LEARN (batch statistics in every phase, eps 1e-9) or
                                  INFERENCE (y = scale*x + shift)
BN                 ``pspnet``     PSPNet: blobs [slope, bias, mean, variance]; ``momentum``,
                                  ``eps``, ``frozen``
Upsample           ``max_unpool`` SegNet / ENet: bottoms [values, Pooling mask top];
                                  scale/scale_h/scale_w/pad_out_*/upsample_h/w
Upsample           ``nearest``    YOLO ports (darknet2caffe, eric612): one bottom, ``scale``
                                  (1 when unset: the upgrade writes it out)
SmoothL1Loss       ``rcnn``       Faster R-CNN / R-FCN: ``sigma``, bottoms pred, target
                                  [, inside weights, outside weights]
SmoothL1Loss       ``ssd``        SSD: no parameter, bottoms pred, target [, weights]; the
                                  weights are not applied in backward. (With two bottoms and
                                  no sigma both forms compute the same values and gradients.)
Dropout            ``scale_train`` Faster R-CNN: ``scale_train`` is set (false: no 1/(1-p) in
                                  TRAIN, x*(1-p) in TEST)
Dropout            ``sample_test`` SegNet / ENet: ``sample_weights_test`` is set (true: drop in
                                  TEST too)
SoftmaxWithLoss    ``segnet``     ``weight_by_label_freqs`` / ``class_weighting`` are set
VideoData          ``c3d``        C3D's clip reader (``video_data_param`` source, new_length..)
VideoData          ``c3d-v1.0``   the same, upgraded from C3D v1.0's V1 VIDEO_DATA
VideoData          ``ssd``        SSD's webcam / video-file reader (video_type, device_id...)
Convolution3D,     ``c3d-v1.0``   upgraded from C3D v1.0 (its mean file and blobs are 5-D
Pooling3D                         C3D v1.0 BlobProtos); ``""`` for C3D v1.1
Interp,            ``deeplab-v1`` DeepLab v1 (exactly one of zoom/shrink/height+width);
ImageSegData                      ``""``: PSPNet / DeepLab v2 rules
Interp             ``blob_size``  soeaver's caffe-priv (FPN): ``use_blob_size`` set or two
                                  bottoms; bottom 1 gives the size when use_blob_size
Pooling            ``darknet2caffe``  darknet2caffe's Caffe: one more output row and column
                                  when (kernel - stride) is odd (yolov3-tiny's 2x2/1 pools)
Python             ``rfcn``       py-R-FCN's ``rpn.proposal_layer`` / ``rpn.proposal_target_
                                  layer`` / ``rpn.anchor_target_layer`` (same module names as
                                  py-faster-rcnn's; its rfcn_end2end_ohem.yml config, RPN
                                  targets normalised, 4-D class-agnostic targets of every
                                  proposal): a net of the R-FCN dialect (PSROIPooling,
                                  OHEM layers) without Faster R-CNN's
Normalize          ``happynear``  happynear's (AM-Softmax): ``normalize_param``, or neither
                                  field in a net of the happynear dialect without SSD's;
                                  ``""``: SSD's (``norm_param``, a scale blob)
InnerProduct       ``happynear``  ``normalize: true`` (unit weight rows)
CenterLoss         ``happynear``  ``distance_type`` set, or the happynear dialect without
                                  caffe-face's; ``""``: ydwen/caffe-face's
DetectionOutput    ``yolov2``     gklz1982/caffe-yolov2's: one bottom, or YOLO's fields
                                  (side, num_box, coords, nms_threshold, biases,
                                  label_map_file) in ``detection_output_param``; ``""``: SSD's
RegionLoss         ``yolov2``     gklz1982's (the yolov2 dialect without eric612's);
                                  ``eric612``: MobileNet-YOLO's (dialect eric612 given);
                                  ``""``: the text cannot tell (both ports declare the same
                                  RegionLossParameter): the label's size decides when lowered
PriorBox           ``faceboxes``  FaceBoxes: the net's dialect has FaceBoxes (its PriorBox takes
                                  SSD's fields: min sizes 32 / 64 densified to 4x4 / 2x2
                                  priors, side - 1 for the min-size boxes)
PriorBox           ``textboxes``  TextBoxes++: ``denser_prior_boxes: true`` (each prior and a
                                  copy centred one step lower)
DetectionOutput    ``refinedet``  RefineDet: 4 bottoms (+ arm_conf: ``objectness_score``) or
                                  5 (+ arm_loc: the priors refined first)
DetectionOutput    ``textboxes``  TextBoxes++: ``use_polygon`` set, or unset in a net of the
                                  TextBoxes++ dialect (its default is true: 12 locations per
                                  prior, rows of 15)
MultiBoxLoss       ``refinedet``  RefineDet: 5 or 6 bottoms (+ arm_conf, arm_loc), or 4 with
                                  ``objectness_score`` set or in a net of the RefineDet
                                  dialect (the ARM's loss: labels >= 2 read as 1 with
                                  num_classes 2)
MultiBoxLoss       ``textboxes``  TextBoxes++: as DetectionOutput
=================  =============  ============================================================

Every other layer has form ``""``. PoolingParameter ``ceil_mode`` needs no form: the upgrade
turns it into ``round_mode``.
"""

from __future__ import annotations

from collections.abc import Callable

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.forks.dialect import Dialect

Param = caffe_pb2.LayerParameter

SEGNET_BN = ("scale_filler", "shift_filler", "bn_mode")
PSPNET_BN = ("slope_filler", "bias_filler", "momentum", "eps", "frozen", "engine")
SEGNET_UPSAMPLE = ("scale_h", "scale_w", "pad_out_h", "pad_out_w", "upsample_h", "upsample_w")
SSD_VIDEO = ("video_type", "device_id", "video_file", "skip_frames")


def _set(msg, names) -> list[str]:
    return [n for n in names if msg.HasField(n)]


def _bn(param: Param, dialect: Dialect) -> str:
    segnet, pspnet = _set(param.bn_param, SEGNET_BN), _set(param.bn_param, PSPNET_BN)
    if segnet and pspnet:
        raise ValueError(
            f"bn_param mixes SegNet's BN fields ({', '.join(segnet)}) with PSPNet's "
            f"({', '.join(pspnet)}); a BN layer is one or the other"
        )
    if segnet or pspnet:
        return "segnet" if segnet else "pspnet"
    if dialect.has("pspnet") != dialect.has("segnet", "enet"):
        return "pspnet" if dialect.has("pspnet") else "segnet"
    raise ValueError(
        "its bn_param sets none of SegNet's fields (bn_mode, scale_filler, shift_filler) or "
        "PSPNet's (slope_filler, bias_filler, momentum, eps, frozen), so it may be either BN "
        "layer; pass dialect='segnet' or dialect='pspnet'"
    )


def _upsample(param: Param, dialect: Dialect) -> str:
    if len(param.bottom) == 2:
        return "max_unpool"
    segnet = _set(param.upsample_param, SEGNET_UPSAMPLE)
    if segnet:
        raise ValueError(
            f"it sets SegNet's max-unpooling fields ({', '.join(segnet)}) but has "
            f"{len(param.bottom)} bottom(s); SegNet's Upsample takes two (the values and the "
            "Pooling layer's mask top), the YOLO ports' nearest-neighbour Upsample one and "
            "only `scale`"
        )
    return "nearest"


def _smooth_l1(param: Param, dialect: Dialect) -> str:
    if param.HasField("smooth_l1_loss_param") or len(param.bottom) == 4:
        return "rcnn"
    if len(param.bottom) == 3:
        return "ssd"
    ssd_like = dialect.has("ssd", "eric612", "darknet2caffe")
    return "ssd" if ssd_like and not dialect.has("frcnn", "rfcn") else "rcnn"


def _dropout(param: Param, dialect: Dialect) -> str:
    p = param.dropout_param
    if p.HasField("scale_train") and p.HasField("sample_weights_test"):
        raise ValueError(
            "dropout_param sets both Faster R-CNN's scale_train and SegNet's "
            "sample_weights_test; no fork has both"
        )
    if p.HasField("scale_train"):
        return "scale_train"
    return "sample_test" if p.HasField("sample_weights_test") else ""


def _softmax_loss(param: Param, dialect: Dialect) -> str:
    p = param.loss_param
    return "segnet" if p.HasField("weight_by_label_freqs") or len(p.class_weighting) else ""


def _video_data(param: Param, dialect: Dialect) -> str:
    if _set(param.video_data_param, SSD_VIDEO):
        return "ssd"
    return "c3d-v1.0" if dialect.has("c3d-v1.0") else "c3d"


def _c3d(param: Param, dialect: Dialect) -> str:
    return "c3d-v1.0" if dialect.has("c3d-v1.0") else ""


def _deeplab(param: Param, dialect: Dialect) -> str:
    v2 = dialect.has("deeplab-v2", "pspnet")
    return "deeplab-v1" if dialect.has("deeplab-v1") and not v2 else ""


def _interp(param: Param, dialect: Dialect) -> str:
    if param.interp_param.use_blob_size or len(param.bottom) == 2:
        return "blob_size"
    return _deeplab(param, dialect)


def _pooling(param: Param, dialect: Dialect) -> str:
    return "darknet2caffe" if dialect.has("darknet2caffe") else ""


#: Python layer modules whose py-R-FCN version differs from py-faster-rcnn's.
RFCN_MODULES = ("rpn.proposal_layer", "rpn.proposal_target_layer", "rpn.anchor_target_layer")


def _python(param: Param, dialect: Dialect) -> str:
    rfcn = dialect.has("rfcn") and not dialect.has("frcnn")
    return "rfcn" if rfcn and param.python_param.module in RFCN_MODULES else ""


def _normalize(param: Param, dialect: Dialect) -> str:
    if param.HasField("normalize_param") and param.HasField("norm_param"):
        raise ValueError(
            "it sets both happynear's normalize_param and SSD's norm_param; a Normalize layer "
            "is one or the other"
        )
    if param.HasField("normalize_param"):
        return "happynear"
    ssd_like = dialect.has("ssd", "eric612", "darknet2caffe")
    bare = not param.HasField("norm_param") and dialect.has("happynear") and not ssd_like
    return "happynear" if bare else ""


def _inner_product(param: Param, dialect: Dialect) -> str:
    return "happynear" if param.inner_product_param.normalize else ""


def _center_loss(param: Param, dialect: Dialect) -> str:
    if param.center_loss_param.HasField("distance_type"):
        return "happynear"
    return "happynear" if dialect.has("happynear") and not dialect.has("caffe-face") else ""


YOLOV2_OUTPUT = ("side", "num_box", "coords", "nms_threshold", "label_map_file")
SSD_OUTPUT = ("share_location", "background_label_id", "nms_param", "save_output_param",
              "code_type", "variance_encoded_in_target", "keep_top_k")  # fmt: skip


def _detection_output(param: Param, dialect: Dialect) -> str:
    p = param.detection_output_param
    yolo, ssd = _set(p, YOLOV2_OUTPUT) + (["biases"] if len(p.biases) else []), _set(p, SSD_OUTPUT)
    if yolo and ssd:
        raise ValueError(
            f"detection_output_param mixes caffe-yolov2's fields ({', '.join(yolo)}) with "
            f"SSD's ({', '.join(ssd)}); a DetectionOutput layer is one or the other"
        )
    if yolo or len(param.bottom) == 1:
        return "yolov2"
    return _ssd_head(param, dialect, p, (4, 5))


def _region_loss(param: Param, dialect: Dialect) -> str:
    if dialect.has("yolov2") and not dialect.has("eric612"):
        return "yolov2"
    if dialect.given and dialect.has("eric612") and not dialect.has("yolov2"):
        return "eric612"
    return ""  # lowering/forks/yolo_eric612.py: 30 (gklz1982) or 300 (eric612) truths


# -- SSD-derived detectors (FaceBoxes, RefineDet, TextBoxes++): lowering/forks/{faceboxes,
# refinedet,textboxes}.py


def _prior_box(param: Param, dialect: Dialect) -> str:
    denser = param.prior_box_param.denser_prior_boxes
    if denser and dialect.has("faceboxes"):
        raise ValueError("it sets TextBoxes++'s denser_prior_boxes in a FaceBoxes net; "
                         "no fork has both PriorBox forms")  # fmt: skip
    if denser:
        return "textboxes"
    return "faceboxes" if dialect.has("faceboxes") else ""


def _textboxes_polygon(p, dialect: Dialect) -> bool:
    return p.HasField("use_polygon") or dialect.has("textboxes")


def _ssd_head(param: Param, dialect: Dialect, p, arm: int) -> str:
    textboxes = _textboxes_polygon(p, dialect)
    if len(param.bottom) in arm and textboxes:
        raise ValueError("it has RefineDet's ARM bottoms and TextBoxes++'s use_polygon; "
                         "no fork has both")  # fmt: skip
    if len(param.bottom) in arm:
        return "refinedet"
    return "textboxes" if textboxes else ""


def _multibox_loss(param: Param, dialect: Dialect) -> str:
    p = param.multibox_loss_param
    form = _ssd_head(param, dialect, p, (5, 6))
    if not form and (p.HasField("objectness_score") or dialect.has("refinedet")):
        return "refinedet"  # the ARM's 4-bottom loss: RefineDet's GetGroundTruth
    return form


_RULES: dict[str, Callable[[Param, Dialect], str]] = {
    "BN": _bn,
    "Upsample": _upsample,
    "SmoothL1Loss": _smooth_l1,
    "Dropout": _dropout,
    "SoftmaxWithLoss": _softmax_loss,
    "VideoData": _video_data,
    "Convolution3D": _c3d,
    "Pooling3D": _c3d,
    "Interp": _interp,
    "ImageSegData": _deeplab,
    "Pooling": _pooling,
    "Python": _python,
    "Normalize": _normalize,
    "InnerProduct": _inner_product,
    "CenterLoss": _center_loss,
    "DetectionOutput": _detection_output,
    "RegionLoss": _region_loss,
    "PriorBox": _prior_box,
    "MultiBoxLoss": _multibox_loss,
}

#: The forms each type can take (documentation for the lowering; see the table above).
FORMS: dict[str, tuple[str, ...]] = {
    "BN": ("segnet", "pspnet"),
    "Upsample": ("max_unpool", "nearest"),
    "SmoothL1Loss": ("rcnn", "ssd"),
    "Dropout": ("", "scale_train", "sample_test"),
    "SoftmaxWithLoss": ("", "segnet"),
    "VideoData": ("c3d", "c3d-v1.0", "ssd"),
    "Convolution3D": ("", "c3d-v1.0"),
    "Pooling3D": ("", "c3d-v1.0"),
    "Interp": ("", "deeplab-v1", "blob_size"),
    "ImageSegData": ("", "deeplab-v1"),
    "Pooling": ("", "darknet2caffe"),
    "Python": ("", "rfcn"),
    "Normalize": ("", "happynear"),
    "InnerProduct": ("", "happynear"),
    "CenterLoss": ("", "happynear"),
    "DetectionOutput": ("", "yolov2", "refinedet", "textboxes"),
    "RegionLoss": ("", "yolov2", "eric612"),
    "PriorBox": ("", "faceboxes", "textboxes"),
    "MultiBoxLoss": ("", "refinedet", "textboxes"),
}
assert set(FORMS) == set(_RULES)


def layer_form(param: Param, dialect: Dialect) -> str:
    """The form of the layer ``param`` describes in a net of ``dialect`` ("" if only one).

    Raises ValueError (the problem, for the caller to locate) when the prototxt contradicts
    itself or cannot tell the forms apart.
    """
    rule = _RULES.get(param.type)
    return rule(param, dialect) if rule else ""


def check_form(param: Param, dialect: Dialect, where: str = "") -> str:
    """:func:`layer_form`, with its problems as a NetError naming the layer."""
    try:
        return layer_form(param, dialect)
    except ValueError as err:
        raise NetError(f"{where}layer '{param.name}' (type {param.type}): {err}") from None
