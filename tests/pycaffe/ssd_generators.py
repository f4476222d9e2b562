"""My own transcription of the call sequence of the SSD net generators (weiliu89/caffe@4817bf8
examples/ssd/ssd_pascal.py and ssd_coco.py; rocksat/caffe@a1a20ad examples/ssd/
ssd_pascal_mobilenet.py): the data layer, the base network, the extra layers, the multibox head
and the loss / detection tail, as those scripts call caffe.model_libs. Used by
tests/pycaffe/test_model_libs.py; no third-party file is kept in the repository."""

from __future__ import annotations

import math

import caffe2jax
from caffe2jax import model_libs as ml
from caffe2jax.pycaffe.model_libs.mobilenet import MobileNetBody
from caffe2jax.pycaffe.net_spec import layers as L
from caffe2jax.pycaffe.net_spec import params as P

pb = ml.caffe_pb2

#: (name, num_output, kernel, pad, stride) of AddExtraLayers in ssd_pascal.py / ssd_coco.py
VGG_EXTRAS = [("conv6_1", 256, 1, 0, 1), ("conv6_2", 512, 3, 1, 2), ("conv7_1", 128, 1, 0, 1),
              ("conv7_2", 256, 3, 1, 2), ("conv8_1", 128, 1, 0, 1), ("conv8_2", 256, 3, 0, 1),
              ("conv9_1", 128, 1, 0, 1), ("conv9_2", 256, 3, 0, 1)]  # fmt: skip
#: the same in ssd_pascal_mobilenet.py (after conv6/sep: 10 → 5 → 3 → 2 → 1)
MOBILENET_EXTRAS = [("conv7_1", 256, 1, 0, 1), ("conv7_2", 512, 3, 1, 2), ("conv8_1", 128, 1, 0, 1),
                    ("conv8_2", 256, 3, 1, 2), ("conv9_1", 128, 1, 0, 1), ("conv9_2", 256, 3, 1, 2),
                    ("conv10_1", 128, 1, 0, 1), ("conv10_2", 256, 3, 1, 2)]  # fmt: skip
VGG_SOURCES = ["conv4_3", "fc7", "conv6_2", "conv7_2", "conv8_2", "conv9_2"]
MOBILENET_SOURCES = ["conv5_5/sep", "conv6/sep", "conv7_2", "conv8_2", "conv9_2", "conv10_2"]


def prior_sizes(min_ratio: int, max_ratio: int, first: tuple, min_dim: int = 300) -> tuple:
    """The generators' min/max sizes: ratios from min_ratio to max_ratio in equal steps over
    the sources after the first, whose (min %, max %) is ``first`` (max None: no max_size)."""
    step = int(math.floor((max_ratio - min_ratio) / (len(VGG_SOURCES) - 2)))
    ratios = range(min_ratio, max_ratio + 1, step)
    mins = [min_dim * first[0] / 100.0] + [min_dim * r / 100.0 for r in ratios]
    head = [] if first[1] is None else min_dim * first[1] / 100.0
    return mins, [head] + [min_dim * (r + step) / 100.0 for r in ratios]


def _loss_param(num_classes: int, use_difficult_gt: bool) -> dict:
    return dict(
        loc_loss_type=P.MultiBoxLoss.SMOOTH_L1, conf_loss_type=P.MultiBoxLoss.SOFTMAX,
        loc_weight=1.0, num_classes=num_classes, share_location=True,
        match_type=P.MultiBoxLoss.PER_PREDICTION, overlap_threshold=0.5,
        use_prior_for_matching=True, background_label_id=0, use_difficult_gt=use_difficult_gt,
        mining_type=P.MultiBoxLoss.MAX_NEGATIVE, neg_pos_ratio=3.0, neg_overlap=0.5,
        code_type=P.PriorBox.CENTER_SIZE, ignore_cross_boundary_bbox=False,
    )  # fmt: skip


def _tail(net, mbox: list, phase: str, num_classes: int, name_size_file: str) -> None:
    """MultiBoxLoss (train) or softmax + DetectionOutput + DetectionEvaluate (test)."""
    if phase == "train":
        net.mbox_loss = L.MultiBoxLoss(
            *mbox,
            net.label,
            multibox_loss_param=_loss_param(num_classes, num_classes == 21),
            loss_param=dict(normalization=P.Loss.VALID),
            include=dict(phase=pb.Phase.Value("TRAIN")),
            propagate_down=[True, True, False, False],
        )
        return  # fmt: skip
    net.mbox_conf_reshape = L.Reshape(net.mbox_conf, shape=dict(dim=[0, -1, num_classes]))
    net.mbox_conf_softmax = L.Softmax(net.mbox_conf_reshape, axis=2)
    net.mbox_conf_flatten = L.Flatten(net.mbox_conf_softmax, axis=1)
    test = dict(phase=pb.Phase.Value("TEST"))
    net.detection_out = L.DetectionOutput(
        mbox[0],
        net.mbox_conf_flatten,
        mbox[2],
        include=test,
        detection_output_param=dict(
            num_classes=num_classes,
            share_location=True,
            background_label_id=0,
            keep_top_k=200,
            nms_param=dict(nms_threshold=0.45, top_k=400),
            confidence_threshold=0.01,
            code_type=P.PriorBox.CENTER_SIZE,
        ),
    )
    net.detection_eval = L.DetectionEvaluate(
        net.detection_out, net.label, include=test,
        detection_evaluate_param=dict(num_classes=num_classes, background_label_id=0,
                                      overlap_threshold=0.5, evaluate_difficult_gt=False,
                                      name_size_file=name_size_file))  # fmt: skip


def ssd_net(kind: str, phase: str, name_size_file: str = "test_name_size.txt"):
    """The ``phase`` ("train", "test", "deploy") net of generator ``kind`` ("voc", "coco",
    "mobilenet") as a NetParameter."""
    num_classes = 81 if kind == "coco" else 21
    net = caffe2jax.NetSpec()
    net.data, net.label = ml.CreateAnnotatedDataLayer(
        "train_lmdb" if phase == "train" else "test_lmdb", batch_size=8,
        train=phase == "train", label_map_file="labelmap.prototxt",
        transform_param=dict(mean_value=[104, 117, 123]))  # fmt: skip
    if kind == "mobilenet":
        MobileNetBody(net, from_layer="data")
        extras, sources = MOBILENET_EXTRAS, MOBILENET_SOURCES
    else:
        ml.VGGNetBody(net, from_layer="data", fully_conv=True, reduced=True, dilated=True,
                      dropout=False)  # fmt: skip
        extras, sources = VGG_EXTRAS, VGG_SOURCES
    previous = net.keys()[-1]
    for name, num_output, kernel, pad, stride in extras:
        ml.ConvBNLayer(net, previous, name, False, True, num_output, kernel, pad, stride, lr_mult=1)
        previous = name
    mbox = ml.CreateMultiBoxHead(net, data_layer="data", from_layers=sources, use_batchnorm=False,
                                 num_classes=num_classes, share_location=True, flip=True,
                                 prior_variance=[0.1, 0.1, 0.2, 0.2], kernel_size=3, pad=1,
                                 **HEADS[kind])  # fmt: skip
    _tail(net, mbox, "train" if phase == "train" else "test", num_classes, name_size_file)
    out = net.to_proto()
    if phase == "deploy":  # the generators' deploy: the test net without its first and last layer
        del out.layer[0]
        del out.layer[-1]
        out.input.extend(["data"])
        out.input_shape.extend([pb.BlobShape(dim=[1, 3, 300, 300])])
    return out


_VGG_HEAD = dict(
    steps=[8, 16, 32, 64, 100, 300], normalizations=[20, -1, -1, -1, -1, -1],
    aspect_ratios=[[2], [2, 3], [2, 3], [2, 3], [2], [2]], clip=False, lr_mult=1,
)  # fmt: skip
HEADS = {
    "voc": dict(zip(("min_sizes", "max_sizes"), prior_sizes(20, 90, (10, 20))), **_VGG_HEAD),
    "coco": dict(zip(("min_sizes", "max_sizes"), prior_sizes(15, 90, (7, 15))), **_VGG_HEAD),
    "mobilenet": dict(zip(("min_sizes", "max_sizes"), prior_sizes(20, 95, (10, None))),
                      aspect_ratios=[[2]] + [[2, 3]] * 5, clip=True),
}  # fmt: skip
