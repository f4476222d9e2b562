"""frontend/forks/upgrade.py: the forks' deprecated forms upgraded to what the lowering reads
(V1 fork types, ceil_mode, hole, C3D v1.0's 3-D layers, the YOLO Upsample's scale), and
template prototxts."""

from __future__ import annotations

import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import PrototxtError
from caffe2jax.frontend.parse import read_net
from caffe2jax.frontend.pipeline import load_param
from caffe2jax.frontend.upgrade import net_needs_upgrade, upgrade_net
from tests.forks import DEFINES, FORK_MODELS

Pool = caffe_pb2.PoolingParameter


def _upgrade(text: str, path: str = "net.prototxt") -> caffe_pb2.NetParameter:
    return upgrade_net(read_net(text), path, text)


def test_deeplab_v1_types_and_parameters():
    net = _upgrade("""
        layers { name: "data" type: IMAGE_SEG_DATA top: "data" top: "label"
                 image_data_param { source: "l.txt" label_type: PIXEL ignore_label: 255 } }
        layers { name: "up" type: INTERP bottom: "data" top: "up" interp_param { zoom_factor: 8 } }
        layers { name: "acc" type: SEG_ACCURACY bottom: "up" bottom: "label" top: "acc"
                 seg_accuracy_param { ignore_label: 255 } }
        layers { name: "w" type: MAT_WRITE bottom: "up" mat_write_param { prefix: "out/" } }
    """)
    data, up, acc, w = net.layer
    assert [x.type for x in net.layer] == ["ImageSegData", "Interp", "SegAccuracy", "MatWrite"]
    assert data.image_data_param.label_type == caffe_pb2.ImageDataParameter.PIXEL
    assert up.interp_param.zoom_factor == 8
    assert list(acc.seg_accuracy_param.ignore_label) == [255]
    assert w.mat_write_param.prefix == "out/"


def test_deeplab_v1_hole_is_dilation():
    net = _upgrade("""
        layers { name: "a" type: CONVOLUTION convolution_param { num_output: 2 kernel_size: 3
                 pad: 2 hole: 2 } }
        layers { name: "b" type: CONVOLUTION convolution_param { kernel_size: 3 hole_h: 2
                 hole_w: 4 } }
    """)
    a, b = (layer.convolution_param for layer in net.layer)
    assert list(a.dilation) == [2] and not a.HasField("hole")
    assert list(b.dilation) == [2, 4] and not b.HasField("hole_h")
    with pytest.raises(PrototxtError, match=r"net\.prototxt:2: layer 'c'.*hole and dilation"):
        _upgrade(
            '\nlayer { name: "c" type: "Convolution" convolution_param { hole: 2 dilation: 2 } }'
        )


def test_deeplab_v1_development_nets():
    net = load_param(FORK_MODELS / "deeplab_v1_vgg128_noup_train.prototxt", defines=DEFINES)
    convs = {x.name: x.convolution_param for x in net.layer if x.type == "Convolution"}
    assert list(convs["conv5_1"].dilation) == [2] and list(convs["fc6"].dilation) == [12]
    assert convs["fc8_${EXP}"].num_output == 21  # ${NUM_LABELS}, filled in
    assert {"ImageSegData", "Interp", "SegAccuracy"} <= {x.type for x in net.layer}


def test_c3d_v10_layers_move_to_c3d_v11_parameters():
    net = _upgrade("""
        layers { name: "data" type: VIDEO_DATA top: "data" top: "label"
          image_data_param { source: "l.lst" use_image: true mean_file: "m.binaryproto"
            batch_size: 30 crop_size: 112 mirror: true show_data: 0 new_height: 128
            new_width: 171 new_length: 16 shuffle: true } }
        layers { name: "conv1a" type: CONVOLUTION3D bottom: "data" top: "conv1a"
          convolution_param { num_output: 64 kernel_size: 3 kernel_depth: 3 pad: 1
            temporal_pad: 1 weight_filler { type: "gaussian" std: 0.01 } } }
        layers { name: "pool1" type: POOLING3D bottom: "conv1a" top: "pool1"
          pooling_param { pool: MAX kernel_size: 2 kernel_depth: 1 stride: 2
            temporal_stride: 1 } }
        layers { name: "prod" type: ELTWISE_PRODUCT bottom: "pool1" bottom: "pool1" top: "p" }
    """)
    data, conv, pool, prod = net.layer
    assert data.type == "VideoData" and not data.HasField("image_data_param")
    video = data.video_data_param
    assert (video.source, video.batch_size, video.new_length, video.new_height) == (
        "l.lst", 30, 16, 128,
    )  # fmt: skip
    assert video.use_image and video.shuffle and not video.show_data
    assert data.transform_param.crop_size == 112 and data.transform_param.mirror
    assert data.transform_param.mean_file == "m.binaryproto"
    c = conv.convolution3d_param
    assert conv.type == "Convolution3D" and not conv.HasField("convolution_param")
    assert (c.num_output, c.kernel_size, c.kernel_depth, c.pad, c.temporal_pad) == (64, 3, 3, 1, 1)
    assert c.weight_filler.std == pytest.approx(0.01)
    p = pool.pooling3d_param
    assert (pool.type, p.kernel_size, p.kernel_depth, p.stride) == ("Pooling3D", 2, 1, 2)
    assert prod.type == "Eltwise"
    assert prod.eltwise_param.operation == caffe_pb2.EltwiseParameter.PROD


def test_eric612_relu6():
    (layer,) = _upgrade("layers { name: 'r' type: RELU6 relu6_param { negative_slope: 0 } }").layer
    assert layer.type == "ReLU6" and layer.HasField("relu6_param")


@pytest.mark.parametrize(("ceil", "mode"), [("true", Pool.CEIL), ("false", Pool.FLOOR)])
def test_ceil_mode_is_round_mode(ceil, mode):
    text = f'layer {{ name: "p" type: "Pooling" pooling_param {{ ceil_mode: {ceil} }} }}'
    net = read_net(text)
    assert net_needs_upgrade(net)
    (layer,) = upgrade_net(net).layer
    assert layer.pooling_param.round_mode == mode and not layer.pooling_param.HasField("ceil_mode")
    agree = Pool.RoundMode.Name(mode)
    text = text.replace("} }", f"round_mode: {agree} }} }}")
    assert upgrade_net(read_net(text)).layer[0].pooling_param.round_mode == mode


def test_ceil_mode_conflicting_with_round_mode_is_refused_with_file_and_line():
    text = 'name: "n"\nlayer {\n  name: "pool1"\n  type: "Pooling"\n' \
        "  pooling_param { ceil_mode: false round_mode: CEIL }\n}\n"  # fmt: skip
    with pytest.raises(PrototxtError) as err:
        _upgrade(text, "dense.prototxt")
    message = str(err.value)
    assert message.startswith("dense.prototxt:3: layer 'pool1' (type Pooling): ceil_mode: false")
    assert "round_mode: FLOOR" in message and "round_mode: CEIL is given" in message


def test_ceil_mode_development_nets_round_mode():
    net = load_param(FORK_MODELS / "densenet201_shicai.prototxt")
    pools = [x.pooling_param for x in net.layer if x.type == "Pooling"]
    assert pools and not any(p.HasField("ceil_mode") for p in pools)
    assert {p.round_mode for p in pools if p.HasField("round_mode")} == {Pool.FLOOR}


def test_yolo_upsample_default_scale_is_written_out():
    net = _upgrade("""
        layer { name: "in" type: "Input" top: "x" top: "m" }
        layer { name: "y" type: "Upsample" bottom: "x" top: "y" }
        layer { name: "s" type: "Upsample" bottom: "x" bottom: "m" top: "s" }
    """)
    _, yolo, segnet = net.layer
    assert yolo.upsample_param.scale == 1  # the YOLO ports' default
    assert not segnet.upsample_param.HasField("scale")  # SegNet's default (2) stays implicit


def test_template_variables():
    text = 'layer { name: "c" type: "Convolution" convolution_param { num_output: ${N} } }'
    where = r"1:\d+: layer 'c' \(type Convolution\): "
    with pytest.raises(PrototxtError, match=where + r"template variable \$\{N\}.*--define N="):
        read_net(text)
    assert read_net(text, defines={"N": 5}).layer[0].convolution_param.num_output == 5
