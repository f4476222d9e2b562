"""The forks' development set (../shared/forks/models, read in place) as the ONNX tests run it:
each net at a test size (reduced where the net allows it), random weights as
tests/fork_runs.py draws them, and which blobs are discontinuous functions of their bottoms.

A MAX pooling's argmax mask, the boxes NMS keeps and the rois a proposal layer picks change
at once when a near tie flips; the two runtimes' float32 rounding (~1e-7 relative) flips such
near ties now and then (seen: 2 of ENet's 131 072 mask entries). The tests therefore compare
every blob not downstream of such a layer directly, and run the model again with the
bottoms of those layers (:func:`pins`) given caffe2jax's values, comparing everything after
them: each conversion is checked on identical inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf import text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.model import Model
from caffe2jax.runtime.onnx.registry import type_key
from tests.forks import DEFINES, FORK_MODELS

#: Layer types whose tops jump when a near tie among their bottoms flips.
DISCONTINUOUS = {"DetectionOutput", "YoloDetectionOutput", "Yolov3DetectionOutput",
                 "Python:rpn.proposal_layer.ProposalLayer", "ROIPooling"}  # fmt: skip


def _jumps(layer) -> bool:
    return type_key(layer) in DISCONTINUOUS


@dataclass(frozen=True)
class Case:
    """One net: its input shapes for the test, the blobs exported (None: the outputs) and
    whether its batch can be symbolic."""

    shapes: dict | None = None
    outputs: tuple[str, ...] | None = None
    dynamic: bool = True
    per_item: bool = True  # items of a batch do not interact: batch 4 = 4 × batch 1
    source: str = "deploy"  # "deploy", "annotated" (AnnotatedData → Input), "devset"
    extra: dict = field(default_factory=dict)


CASES = {
    "densenet201_shicai.prototxt": Case({"data": (1, 3, 96, 96)}),
    "resnext101_32x4d_soeaver.prototxt": Case({"data": (1, 3, 96, 96)}),
    "se_resnet101.prototxt": Case(),  # a 7×7 pool5: 224 × 224 only
    "se_resnext50.prototxt": Case(),
    "shufflenet_v1_2x_g3.prototxt": Case(),
    "shufflenet_v2_2x.prototxt": Case(),
    "ssd_mobilenetv2_ssdlite_deploy.prototxt": Case({"data": (1, 3, 160, 160)}, per_item=False),
    "ssd_mobilenet_voc_test.prototxt": Case(
        outputs=("detection_out",), source="annotated", per_item=False
    ),
    "yolov3_mobilenetv3_test_eric612.prototxt": Case(
        outputs=("detection_out",), dynamic=False, source="annotated"
    ),
    "yolov2_darknet19_eric612.prototxt": Case({"data": (1, 3, 160, 160)}, dynamic=False),
    "yolov3_darknet53_eric612.prototxt": Case({"data": (1, 3, 160, 160)}, dynamic=False),
    "yolov3_mobilenetv2_chenyingpeng.prototxt": Case({"data": (1, 3, 160, 160)}),
    "yolov3_spp_chenyingpeng.prototxt": Case({"data": (1, 3, 160, 160)}),
    "yolov4_mish_chenyingpeng.prototxt": Case({"data": (1, 3, 160, 160)}),
    "faster_rcnn_vggm1024_coco_test.prototxt": Case(dynamic=False),
    "faster_rcnn_air101_voc_deploy.prototxt": Case(
        {"data": (1, 3, 160, 160), "im_info": (1, 3)}, dynamic=False
    ),  # fmt: skip
    "rfcn_resnet101_voc_test.prototxt": Case(
        {"data": (1, 3, 160, 160), "im_info": (1, 3)}, dynamic=False
    ),  # fmt: skip
    "enet_deploy_bn.prototxt": Case({"data": (1, 3, 64, 128)}),
    "pspnet101_cityscapes_713.prototxt": Case({"data": (1, 3, 137, 137)}, source="devset"),
    "segnet_bayesian_inference.prototxt": Case(source="devset"),
    # the TEST nets of the C3D and CRNN train prototxts (their data layers as inputs)
    "c3d_v11_ucf101_train_simple.prototxt": Case(
        {"data": (1, 3, 16, 56, 56), "label": (1,)}, source="stage:test-on-val"
    ),  # fmt: skip
    "crnn_train.prototxt": Case(
        {"data": (2, 1, 32, 128), "label": (2, 13)}, ("fc1",), dynamic=False, source="crnn"
    ),  # fmt: skip
}


def deploy_form(name: str, side: int) -> caffe_pb2.NetParameter:
    """A test net with its AnnotatedData layer an Input of (1, 3, side, side) and the layers
    reading the label (DetectionEvaluate) left out."""
    net = text_format.Parse((FORK_MODELS / name).read_text(), caffe_pb2.NetParameter())
    layers = []
    for layer in net.layer:
        if layer.type == "AnnotatedData":
            new = caffe_pb2.LayerParameter(name=layer.name, type="Input", top=[layer.top[0]])
            new.input_param.shape.add(dim=[1, 3, side, side])
            layers.append(new)
        elif "label" not in layer.bottom:
            layers.append(layer)
    del net.layer[:]
    net.layer.extend(layers)
    return net


def compile_case(name: str) -> Model:
    """The TEST model of ``name`` at its test size."""
    case = CASES[name]
    if case.source == "annotated":
        net = deploy_form(name, 160)
        return Model(load_net(net, "TEST"), case.shapes)
    if case.source == "devset":
        from tests.lowering.forks.test_devset import load

        return Model(load_net(load(name, small=True), "TEST"), case.shapes)
    if case.source.startswith("stage:"):
        net = load_net(FORK_MODELS / name, "TEST", stages=(case.source[6:],))
        return Model(net, case.shapes)
    if case.source == "crnn":  # its 523-sequence batch (LSTM streams included) cut to 2
        text = (FORK_MODELS / name).read_text().replace("523", "2")
        return Model(load_net(text, "TEST"), case.shapes)
    model = Model(load_net(FORK_MODELS / name, "TEST", defines=DEFINES))
    return model.reshape(case.shapes) if case.shapes else model


def pins(model: Model) -> set[str]:
    """The blobs pinned to caffe2jax's values in the second run: the bottoms of every
    discontinuous layer, a MAX pooling's mask top, and ROIPooling's top (checked on its own
    against the fork's C++ loop in test_rcnn.py, see there)."""
    out = set()
    for layer in model.net.layers:
        if _jumps(layer):
            out.update(b for b in layer.bottoms if b not in model.graph.input_versions.values())
        if layer.type == "ROIPooling":
            out.update(layer.tops)
        if layer.type == "Pooling" and len(layer.tops) == 2:
            out.add(layer.tops[1])
    return out


def tainted(model: Model) -> set[str]:
    """The blobs downstream of a discontinuous layer (or a pooling mask)."""
    bad: set[str] = set()
    for layer in model.net.layers:
        jumps = _jumps(layer)
        if jumps or any(b in bad for b in layer.bottoms):
            bad.update(layer.tops)
        if layer.type == "Pooling" and len(layer.tops) == 2:
            bad.add(layer.tops[1])
    return bad


def uses_random_dropout(model: Model) -> bool:
    """Bayesian SegNet: Dropout with sample_weights_test draws a new mask on every run."""
    return any(layer.type == "Dropout" and layer.form == "sample_test"
               and layer.param.dropout_param.sample_weights_test
               for layer in model.net.layers)  # fmt: skip
