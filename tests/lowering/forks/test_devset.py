"""The development set's segmentation and classification nets (../shared/forks/models) through
this branch's fork layers: every deploy net here compiles (shapes through every layer), and a
forward with random weights gives finite outputs (at a reduced input size where the net allows
it, so the suite stays fast). Data layers of the forks (DenseImageData) are replaced by Input
layers of the shapes they would produce; the nets are read in place, never copied.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.parse import read_net
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.forks import FORK_MODELS

#: deploy nets whose every layer this branch or BVLC lowers, and the fork types they use
NETS = {
    "enet_deploy_bn.prototxt": {"BN", "Upsample", "Python"},
    "segnet_bayesian_inference.prototxt": {"BN", "Upsample", "Dropout"},
    "pspnet101_cityscapes_713.prototxt": {"BN", "Interp"},
    "densenet201_shicai.prototxt": set(),  # ceil_mode pooling only
    "resnext101_32x4d_soeaver.prototxt": set(),
    "se_resnet101.prototxt": {"Axpy"},
    "se_resnext50.prototxt": {"Axpy"},
    "shufflenet_v1_2x_g3.prototxt": {"ShuffleChannel", "DepthwiseConvolution"},
    "shufflenet_v2_2x.prototxt": {"ShuffleChannel", "DepthwiseConvolution"},
    "yolov3_mobilenetv2_chenyingpeng.prototxt": {"ConvolutionDepthwise", "Upsample"},
    "yolov3_spp_chenyingpeng.prototxt": {"Upsample"},
    "yolov4_mish_chenyingpeng.prototxt": {"Mish", "Upsample"},
}
#: the data layers replaced by Input: tops and shapes (SegNet's 360×480 CamVid input)
DATA = {"DenseImageData": [(1, 3, 360, 480), (1, 1, 360, 480)]}
#: forwards run in the suite, with the input size (None: the net's own); the YOLO ports'
#: forwards (Mish, nearest Upsample, ConvolutionDepthwise: each covered by its own tests) take
#: minutes of XLA compilation on a CPU, so they are checked by compiling only
FORWARD = {
    "enet_deploy_bn.prototxt": {"data": (1, 3, 64, 128)},
    # 72 rows: 36, 18, 9, 5 pooled, so the deepest unpooling needs pad_out_h as at 360
    "segnet_basic_train.prototxt": {"data": (1, 3, 72, 64), "label": (1, 1, 72, 64)},
    "shufflenet_v2_2x.prototxt": None,
    "se_resnext50.prototxt": None,
    "pspnet101_cityscapes_713.prototxt": {"data": (1, 3, 137, 137)},  # see _small_pspnet
}


def _small_pspnet(net: caffe_pb2.NetParameter) -> None:
    """PSPNet's pyramid at a 137×137 input: its 18×18 features pooled by 18, 9, 6 and 3 (the
    net's 90, 45, 30, 15 at 713×713, a 90×90 map) and interpolated back to 18×18. At 713×713
    XLA:CPU needs over 11 GB for the forward."""
    for layer in net.layer:
        if layer.type == "Pooling" and layer.pooling_param.kernel_size in (90, 45, 30, 15):
            k = layer.pooling_param.kernel_size // 5
            layer.pooling_param.kernel_size = layer.pooling_param.stride = k
        if layer.type == "Interp" and layer.interp_param.height == 90:
            layer.interp_param.height = layer.interp_param.width = 18


def load(name: str, small: bool = False) -> caffe_pb2.NetParameter:
    """The development-set net, its fork data layers as Input layers (``small``: PSPNet's
    pyramid for a 137×137 input)."""
    net = read_net(FORK_MODELS / name)
    if small and name.startswith("pspnet"):
        _small_pspnet(net)
    for layer in net.layer:
        if layer.type in DATA:
            tops, shapes = list(layer.top), DATA[layer.type]
            layer.Clear()
            layer.name, layer.type = "data", "Input"
            layer.top.extend(tops)
            for shape in shapes[: len(tops)]:
                layer.input_param.shape.add().dim.extend(shape)
    return net


@pytest.mark.parametrize("name", sorted(NETS))
def test_deploy_net_compiles(name):
    model = compile_net(load(name))
    used = {layer.type for layer in model.net.layers}
    assert NETS[name] <= used
    assert all(np.prod(s) > 0 for s in model.graph.inputs.values())


def _sane_state(state) -> dict:
    """BatchNorm (mean 0, variance 1, factor 1) and PSPNet BN (variance 1) statistics a
    trained net would have: zeros would divide by √eps at every layer."""
    out = {}
    for name, blobs in state.items():
        blobs = list(blobs)
        if len(blobs) == 3 and blobs[2] is not None:  # BatchNorm
            blobs = [jnp.zeros_like(blobs[0]), jnp.ones_like(blobs[1]), jnp.ones_like(blobs[2])]
        elif len(blobs) == 4 and blobs[3] is not None:  # PSPNet BN
            blobs[3] = jnp.ones_like(blobs[3])
        out[name] = blobs
    return out


@pytest.mark.parametrize("name", sorted(FORWARD))
def test_forward_with_random_weights_is_finite(name):
    phase = "TRAIN" if "train" in name else "TEST"
    model = compile_net(load(name, small=True), phase=phase, input_shapes=FORWARD[name])
    params, state = model.init(0)
    rng = np.random.default_rng(0)
    feed = {
        k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in model.graph.inputs.items()
    }
    if "label" in feed:
        feed["label"] = jnp.asarray(rng.integers(0, 11, model.graph.inputs["label"]), jnp.float32)
    blobs, _ = jitted.forward(model, params, _sane_state(state), feed, jax.random.key(0))
    for layer in model.net.layers[-2:]:
        for top in layer.top_names:
            assert bool(jnp.all(jnp.isfinite(blobs[top]))), (name, layer.name)


MIXED = """
layer { name: "c1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 6 kernel_size: 3 pad: 1 } }
layer { name: "s1" type: "ShuffleChannel" bottom: "c1" top: "s1"
        shuffle_channel_param { group: 2 } }
layer { name: "d1" type: "ConvolutionDepthwise" bottom: "s1" top: "d1"
        convolution_param { num_output: 6 kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "r1" type: "ReLU6" bottom: "d1" top: "r1" }
layer { name: "p1" type: "Pooling" bottom: "r1" top: "p1"
        pooling_param { pool: MAX kernel_size: 3 stride: 2 ceil_mode: true } }
layer { name: "i1" type: "Interp" bottom: "p1" top: "i1" interp_param { zoom_factor: 3 } }
"""


def test_a_net_of_the_fork_layers_opencv_has_agrees_with_it():
    """Convolution → ShuffleChannel → ConvolutionDepthwise → ReLU6 → ceil_mode MAX pooling →
    Interp, one net run by both with the same weights. (Not Mish: it makes the net a
    darknet2caffe one, whose 3×3/2 pooling has an extra row and column.)"""
    from tests.lowering.fork_nets import max_rel, net, opencv, ours

    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 13, 11)).astype(np.float32)
    weights = {
        "c1": [rng.standard_normal((6, 3, 3, 3)).astype(np.float32), np.zeros(6, np.float32)],
        "d1": [rng.standard_normal((6, 1, 3, 3)).astype(np.float32), np.ones(6, np.float32)],
    }
    text = net(MIXED, {"x": x.shape})
    mine = ours(text, {"x": x}, weights)
    theirs = opencv(text, {"x": x}, ["p1", "i1"], weights)
    assert max_rel(mine["p1"], theirs["p1"][0]) < 1e-4
    assert max_rel(mine["i1"], theirs["i1"][0]) < 1e-4
