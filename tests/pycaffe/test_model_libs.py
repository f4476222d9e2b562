"""caffe2jax.model_libs (caffe2jax/pycaffe/model_libs/): the SSD fork's net builders.

The generators' call sequence is transcribed in tests/pycaffe/ssd_generators.py. The facts
asserted here were read from the published nets: weiliu89's SSD300 VGG16 VOC0712
train/test/deploy prototxts (as republished in xzgz/caffe-ssd@1300c25
models/VGGNet/VOC0712/SSD_300x300/), the COCO SSD300 deploy (zhangkaij/ssd_caffe@a5277de), and
rocksat/caffe@6847ff7 jobs/MobileNet/ssd_mobilenet_1.0_voc0712_2017_07_11/SSD_300x300/; the
digests are SHA-1s of those files' layers: (name, type, bottoms, tops) per layer, and the
serialized layers but the data and detection ones (whose paths and batch sizes are the user's).
Running the real scripts unchanged is recorded in docs (they cannot live in the repository)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap

import pytest

import caffe2jax
from caffe2jax import model_libs as ml
from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.pycaffe.model_libs import mobilenet
from caffe2jax.pycaffe.net_spec import layers as L
from tests.pycaffe.ssd_generators import ssd_net

DETECTION = {"AnnotatedData", "DetectionOutput", "DetectionEvaluate"}

#: (layers, topology digest, parameter digest) of the published nets
PUBLISHED = {
    ("voc", "deploy"): (101, "a260ea8db7b44550", "01e32cbf56e7f96c"),
    ("voc", "train"): (99, "d9cb8d7f59206847", "c76478891e483569"),
    ("voc", "test"): (103, "833be71e4536e295", "01e32cbf56e7f96c"),
    # rocksat's own ConvBNLayer also wrote group: 1 and engine: DEFAULT on every convolution;
    # the digest is taken with those two default values cleared
    ("mobilenet", "deploy"): (173, "56be6ce0b50303a6", "b060863772df4fed"),
    ("mobilenet", "train"): (171, "5e6745d3cf5c5067", "0b26104a0f4546ac"),
    ("mobilenet", "test"): (175, "2f6bb784f36b09ae", None),
}


def _topology(net) -> str:
    rows = [f"{x.name}|{x.type}|{','.join(x.bottom)}|{','.join(x.top)}" for x in net.layer]
    return hashlib.sha1("\n".join(rows).encode()).hexdigest()[:16]


def _params(net) -> str:
    digest = hashlib.sha1()
    for layer in net.layer:
        if layer.type in DETECTION:
            continue
        layer = caffe_pb2.LayerParameter.FromString(layer.SerializeToString())
        conv = layer.convolution_param
        if layer.type == "Convolution" and conv.HasField("group") and conv.group == 1:
            conv.ClearField("group")
        if layer.type == "Convolution" and conv.HasField("engine") and conv.engine == 0:
            conv.ClearField("engine")
        digest.update(layer.SerializeToString(deterministic=True))
    return digest.hexdigest()[:16]


@pytest.mark.parametrize("kind, phase", sorted(PUBLISHED))
def test_generated_nets_equal_the_published_ones(kind, phase):
    net = ssd_net(kind, phase)
    count, topology, params = PUBLISHED[kind, phase]
    assert len(net.layer) == count
    assert _topology(net) == topology
    if params is not None:
        assert _params(net) == params


def _layer(net, name):
    return next(x for x in net.layer if x.name == name)


@pytest.mark.parametrize(
    "kind, sizes, loc, conf",
    [
        ("voc", [(30, 60), (60, 111), (111, 162), (162, 213), (213, 264), (264, 315)],
         [16, 24, 24, 24, 16, 16], [84, 126, 126, 126, 84, 84]),
        ("coco", [(21, 45), (45, 99), (99, 153), (153, 207), (207, 261), (261, 315)],
         [16, 24, 24, 24, 16, 16], [324, 486, 486, 486, 324, 324]),
    ],
)  # fmt: skip
def test_vgg_multibox_head_per_source(kind, sizes, loc, conf):
    net = ssd_net(kind, "deploy")
    sources = ["conv4_3_norm", "fc7", "conv6_2", "conv7_2", "conv8_2", "conv9_2"]
    for i, source in enumerate(sources):
        prior = _layer(net, f"{source}_mbox_priorbox").prior_box_param
        assert (list(prior.min_size), list(prior.max_size)) == ([sizes[i][0]], [sizes[i][1]])
        assert list(prior.aspect_ratio) == ([2] if i in (0, 4, 5) else [2, 3])
        assert prior.step == [8, 16, 32, 64, 100, 300][i] and prior.flip and not prior.clip
        assert prior.offset == 0.5 and len(prior.variance) == 4
        assert list(_layer(net, f"{source}_mbox_priorbox").bottom) == [source, "data"]
        assert _layer(net, f"{source}_mbox_loc").convolution_param.num_output == loc[i]
        assert _layer(net, f"{source}_mbox_conf").convolution_param.num_output == conf[i]
    norm = _layer(net, "conv4_3_norm")
    assert norm.type == "Normalize" and norm.norm_param.scale_filler.value == 20
    fc6 = _layer(net, "fc6").convolution_param
    assert (fc6.num_output, fc6.kernel_size, fc6.pad, fc6.dilation) == (1024, [3], [6], [6])


def test_ssd300_nets_compile(tmp_path):
    """The generated deploy, train and test nets compile: 8732 priors, detections 200 × 7."""
    names = tmp_path / "test_name_size.txt"
    names.write_text("000001 300 400\n")
    deploy = caffe2jax.compile(ssd_net("voc", "deploy"))
    shapes = {k: deploy.net.shapes[deploy.net.blob_names[k]] for k in deploy.outputs}
    blob = deploy.net.shapes
    assert blob[deploy.net.blob_names["mbox_priorbox"]] == (1, 2, 8732 * 4)
    assert blob[deploy.net.blob_names["mbox_conf_flatten"]] == (1, 8732 * 21)
    assert shapes == {"detection_out": (1, 1, 200, 7)}
    label = {"data": (2, 3, 300, 300), "label": (1, 1, 4, 8)}
    train = caffe2jax.compile(ssd_net("voc", "train"), phase="TRAIN", input_shapes=label)
    assert train.outputs == ("mbox_loss",)
    test = caffe2jax.compile(ssd_net("voc", "test", str(names)), input_shapes=label)
    assert test.outputs == ("detection_eval",)


def test_mobilenet_ssd_compiles_with_its_priors():
    """conv5_5/sep 19², conv6/sep 10², then 5², 3², 2², 1²: 3 priors on the first (no max
    size), 6 on the others (ratios 2 and 3, flipped): 1917 priors."""
    net = ssd_net("mobilenet", "deploy")
    first = _layer(net, "conv5_5/sep_mbox_priorbox").prior_box_param
    assert list(first.max_size) == [] and first.clip
    assert _layer(net, "conv5_5/sep_mbox_loc").convolution_param.num_output == 12
    dw = _layer(net, "conv2_2/dw").convolution_param
    assert (dw.group, dw.engine, dw.stride) == (64, caffe_pb2.ConvolutionParameter.CAFFE, [2])
    model = caffe2jax.compile(net)
    priors = 19 * 19 * 3 + (100 + 25 + 9 + 4 + 1) * 6
    assert model.net.shapes[model.net.blob_names["mbox_priorbox"]] == (1, 2, priors * 4)


def _input_net(size: int):
    net = caffe2jax.NetSpec()
    net.data = L.Input(shape=dict(dim=[1, 3, size, size]))
    return net


@pytest.mark.parametrize(
    "build, size, layers, top, shape",
    [
        (lambda n: ml.ResNet101Body(n, "data"), 224, 448, "pool5", (1, 2048, 1, 1)),
        (lambda n: ml.ResNet152Body(n, "data", use_pool5=False), 224, 668, "res5c",
         (1, 2048, 7, 7)),
        (lambda n: ml.InceptionV3Body(n, "data", output_pred=True), 299, 408, "softmax_prob",
         (1, 1008)),
        (lambda n: ml.VGGNetBody(n, "data"), 224, 38, "fc7", (1, 4096)),
        (lambda n: ml.ZFNetBody(n, "data", fully_conv=True, need_fc8=True), 224, 24, "prob",
         (1, 1000, 7, 7)),  # pool5 8² (ceil), fc6 6×6 pad 2: 7²
        (lambda n: mobilenet.MobileNetBody(n, "data"), 224, 109, "conv6/sep", (1, 1024, 7, 7)),
    ],
)  # fmt: skip
def test_base_networks_compile_to_their_shapes(build, size, layers, top, shape):
    net = build(_input_net(size)).to_proto()
    assert len(net.layer) == layers
    model = caffe2jax.compile(net)
    assert model.net.shapes[model.net.blob_names[top]] == shape


def test_conv_bn_layer_names_and_parameters():
    net = _input_net(8)
    ml.ConvBNLayer(net, "data", "c", True, True, 4, [1, 3], [0, 1], 1, dilation=2, eps=0.01,
                   use_global_stats=True)  # fmt: skip
    ml.ConvBNLayer(net, "c", "d", True, False, 4, 3, 1, 2, use_scale=False, lr_mult=3)
    out = {x.name: x for x in net.to_proto().layer}
    assert list(out) == ["data", "c", "c_bn", "c_scale", "c_relu", "d", "d_bn", "d_bias"]
    conv = out["c"].convolution_param
    assert (conv.kernel_h, conv.kernel_w, conv.pad_w, list(conv.dilation)) == (1, 3, 1, [2])
    assert not conv.bias_term and conv.weight_filler.std == pytest.approx(0.01)
    bn = out["c_bn"].batch_norm_param
    assert bn.use_global_stats and not bn.HasField("moving_average_fraction")
    assert [p.lr_mult for p in out["c_scale"].param] == [0, 0]  # global stats: terms frozen
    assert out["d_bn"].batch_norm_param.moving_average_fraction == pytest.approx(0.999)
    assert [p.lr_mult for p in out["d_bias"].param] == [3] and out["d"].param[0].lr_mult == 3
    assert list(out["d"].top) == ["d"] and list(out["d_bias"].top) == ["d"]


def test_builders_refuse_bad_arguments_with_the_project_error():
    with pytest.raises(CaffeError, match="1 or 2"):
        ml.UnpackVariable([1, 2, 3], 2)
    net = _input_net(8)
    with pytest.raises(CaffeError, match="num_classes"):
        ml.CreateMultiBoxHead(net, from_layers=["data"], min_sizes=[4])
    with pytest.raises(CaffeError, match="steps"):
        ml.CreateMultiBoxHead(net, num_classes=2, from_layers=["data"], min_sizes=[4], steps=[1, 2])


def test_python2_caffe_pb2_of_the_star_import():
    """5000 / 8 was 625 in the generators' Python 2; the star import's caffe_pb2 takes 625.0
    for an integer field, refuses 619.125 naming the field, and builds the real messages."""
    solver = ml.caffe_pb2.SolverParameter(test_iter=[5000 / 8], iter_size=32 / 32, base_lr=0.5)
    assert list(solver.test_iter) == [625] and solver.iter_size == 1
    assert type(solver) is caffe_pb2.SolverParameter
    assert isinstance(solver, ml.caffe_pb2.SolverParameter)
    assert ml.caffe_pb2.EmitConstraint.CENTER == caffe_pb2.EmitConstraint.CENTER
    assert ml.caffe_pb2.Phase.Value("TEST") == 1
    shape = ml.caffe_pb2.BlobShape(dim=[1.0, 3, 300.0, 300])
    assert list(shape.dim) == [1, 3, 300, 300]
    with pytest.raises(CaffeError, match="SolverParameter.test_iter"):
        ml.caffe_pb2.SolverParameter(test_iter=[4953 / 8])
    with pytest.raises(TypeError):  # caffe.proto.caffe_pb2 itself is untouched
        caffe_pb2.SolverParameter(test_iter=[625.0])
    assert list(ml.xrange(20, 91, 17)) == [20, 37, 54, 71, 88]


#: every public name of weiliu89's python/caffe/model_libs.py (and what it imports)
FORK_NAMES = (
    "check_if_exist make_if_not_exist UnpackVariable ConvBNLayer ResBody InceptionTower "
    "CreateAnnotatedDataLayer ZFNetBody VGGNetBody ResNet101Body ResNet152Body InceptionV3Body "
    "CreateMultiBoxHead os caffe L P caffe_pb2"
).split()

ALIAS = """
import sys, caffe2jax
sys.modules["caffe"] = caffe2jax
import caffe
from caffe.model_libs import *
from caffe.mobilenet import MobileNetBody
import caffe.model_libs, caffe.mobilenet
import caffe2jax.pycaffe.model_libs as own
assert caffe.model_libs is own and caffe2jax.model_libs is own
assert caffe.mobilenet is own.mobilenet and MobileNetBody is own.mobilenet.MobileNetBody
names = {names}
assert all(name in globals() for name in names), [n for n in names if n not in globals()]
net = caffe.NetSpec()
net.data, net.label = CreateAnnotatedDataLayer("lmdb", train=False)
VGGNetBody(net, from_layer="data", fully_conv=True, reduced=True, dilated=True, dropout=False)
assert net.keys()[-1] == "relu7" and L is caffe.layers and P is caffe.params
solver = caffe_pb2.SolverParameter(test_iter=[5000 / 8], stepvalue=[x for x in xrange(1, 3)])
print(len(net.to_proto().layer), solver.test_iter[0])
"""


def test_caffe_model_libs_through_the_alias():
    code = textwrap.dedent(ALIAS).format(names=FORK_NAMES + ["xrange"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == ["36", "625"], done.stderr[-3000:]


def test_vgg_nopool_takes_dilation_one_where_the_fork_fails():
    """The fork's VGGNetBody(nopool=True) reads an unset dilation; caffe2jax's takes 1:
    stride-2 convolutions conv1_3 … conv4_4 and conv5_4 replace the pools."""
    net = ml.VGGNetBody(_input_net(224), "data", nopool=True, fully_conv=True, dilated=True)
    out = {x.name: x for x in net.to_proto().layer}
    assert all(f"conv{s}" in out and f"pool{s[0]}" not in out
               for s in ("1_3", "2_3", "3_4", "4_4", "5_4"))  # fmt: skip
    assert list(out["conv5_1"].convolution_param.dilation) == [1]
    assert list(out["fc6"].convolution_param.dilation) == [2]
    assert list(out["conv5_4"].convolution_param.stride) == [1]
