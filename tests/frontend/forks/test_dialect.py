"""Dialects (frontend/forks/dialect.py, frontend/forks/schema.py): each fork's binary numbers,
chosen from the prototxt or the bytes, and a test per number collision: the right fork's
numbers decode the field; the wrong ones refuse, never misread.

Binary files are written here by hand with the fork's numbers (tests/forks.py)."""

from __future__ import annotations

import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.frontend.forks.dialect import (
    DialectError,
    describe,
    detect,
    dialect_names,
    get,
)
from caffe2jax.frontend.forks.schema import decode, decode_net, detect_binary, encode, schema
from caffe2jax.frontend.parse import read_net
from tests.forks import DEFINES, FORK_MODELS, c3d_blob, f32, ld, s, v, v1_layer, v2_layer

EXPECTED = {
    "c3d_v10_ucf101_finetune_train.prototxt": "c3d-v1.0",
    "c3d_v11_ucf101_train_simple.prototxt": "c3d-v1.1",
    "crnn_train.prototxt": "crnn",
    "deeplab_v1_vgg128_noup_test.prototxt": "deeplab-v1",
    "deeplab_v1_vgg128_noup_train.prototxt": "deeplab-v1",
    "densenet201_shicai.prototxt": "ceil_mode",
    "enet_deploy_bn.prototxt": "enet",
    "enet_encoder_train.prototxt": "enet",
    "faster_rcnn_air101_voc_deploy.prototxt": "frcnn+ceil_mode",
    "faster_rcnn_vgg16_train.prototxt": "frcnn",
    "faster_rcnn_vggm1024_coco_test.prototxt": "frcnn",
    "pspnet101_cityscapes_713.prototxt": "pspnet",
    "resnext101_32x4d_soeaver.prototxt": "ceil_mode",
    "rfcn_resnet101_voc_test.prototxt": "rfcn",
    "rfcn_resnet50_voc_train_ohem.prototxt": "rfcn",
    "se_resnet101.prototxt": "senet",
    "se_resnext50.prototxt": "senet",
    "segnet_basic_train.prototxt": "segnet",
    "segnet_bayesian_inference.prototxt": "segnet",
    "shufflenet_v1_2x_g3.prototxt": "shufflenet+depthwise",
    "shufflenet_v2_2x.prototxt": "shufflenet+depthwise",
    "ssd_mobilenet_train.prototxt": "ssd",
    "ssd_mobilenet_voc_test.prototxt": "ssd",
    "ssd_mobilenetv2_ssdlite_deploy.prototxt": "ssd+depthwise",
    "yolov2_darknet19_eric612.prototxt": "eric612",
    "yolov3_darknet53_eric612.prototxt": "eric612",
    "yolov3_mobilenetv2_chenyingpeng.prototxt": "darknet2caffe+mobilenet",
    "yolov3_mobilenetv3_test_eric612.prototxt": "eric612",
    "yolov3_spp_chenyingpeng.prototxt": "darknet2caffe",
    "yolov4_mish_chenyingpeng.prototxt": "darknet2caffe",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dialect_of_each_development_net(name):
    dialect = detect(read_net(FORK_MODELS / name, defines=DEFINES))
    assert dialect.key == EXPECTED[name]
    assert not dialect.conflicts
    assert dialect.key in describe(dialect)


def test_given_dialects():
    assert get(None).key == "bvlc" and get("BVLC").key == "bvlc"
    assert get("ceil_mode+frcnn").key == "frcnn+ceil_mode"  # priority order
    assert get("c3d-v1.0").blob_layout == "c3d-v1.0" and get("ssd").blob_layout == "bvlc"
    assert get("caffe2jax").merged
    with pytest.raises(DialectError, match="unknown dialect 'pspnt'.*pspnet"):
        get("pspnt")
    assert {"bvlc", "ssd", "pspnet", "c3d-v1.0", "caffe2jax"} <= set(dialect_names())


def test_ssd_and_crnn_clash_on_200_to_203():
    both = get("ssd+crnn")
    assert any("field 200 is annotated_data_param in SSD, ctc_loss_param in CRNN" in c
               for c in both.conflicts)  # fmt: skip
    with pytest.raises(DialectError, match="clash"):
        decode_net(v2_layer("x", "CtcLoss"), both)


# --------------------------------------------------------------------------------------------
# One binary per collision, with the fork's own numbers


def _net(*layers: bytes) -> bytes:
    return s(1, "net") + b"".join(layers)


def _decodes(data: bytes, dialect: str | None = None) -> caffe_pb2.NetParameter:
    return decode_net(data, dialect)


def test_143_pspnet_interp_param_vs_bvlc_input_param():
    interp = ld(143, v(3, 2) + v(5, 0))  # InterpParameter zoom_factor 2, pad_beg 0
    data = _net(v2_layer("up", "Interp", interp, bottoms=["x"], tops=["y"]))
    assert detect_binary(data).key == "deeplab-v2"
    for key in (None, "pspnet", "deeplab-v2"):
        layer = _decodes(data, key).layer[0]
        assert layer.interp_param.zoom_factor == 2 and not layer.HasField("input_param")
    with pytest.raises(DialectError, match="input_param holds field number 3 .*dialect bvlc"):
        _decodes(data, "bvlc")  # 143 read as input_param: its field 1 has the wrong wire type
    bvlc = _net(v2_layer("in", "Input", ld(143, ld(1, ld(1, b"\x03")))))  # shape { dim: 3 }
    assert list(_decodes(bvlc).layer[0].input_param.shape[0].dim) == [3]


def test_147_swish_vs_enet_upsample_vs_rfcn_roi_pooling():
    enet = _net(v2_layer("u", "Upsample", ld(147, v(1, 2)), bottoms=["x", "mask"]))
    rfcn = _net(v2_layer("r", "ROIPooling", ld(147, v(1, 7) + v(2, 7) + f32(3, 0.0625))))
    swish = _net(v2_layer("s", "Swish", ld(147, f32(1, 2.0))))
    assert _decodes(enet).layer[0].upsample_param.scale == 2
    assert detect_binary(enet).key == "enet"
    roi = _decodes(rfcn).layer[0].roi_pooling_param
    assert (roi.pooled_h, roi.pooled_w, roi.spatial_scale) == (7, 7, 0.0625)
    assert _decodes(swish).layer[0].swish_param.beta == 2.0
    for data, wrong in ((enet, "rfcn"), (rfcn, "enet"), (swish, "enet"), (enet, "bvlc")):
        with pytest.raises(DialectError):
            _decodes(data, wrong)


def test_148_clip_vs_rfcn_smooth_l1_vs_pspnet_adaptive_bias():
    clip = _net(v2_layer("c", "Clip", ld(148, f32(1, -1.0) + f32(2, 1.0))))
    psroi = ld(149, f32(1, 0.0625) + v(2, 7) + v(3, 3))
    sl1 = _net(v2_layer("l", "SmoothL1Loss", ld(148, f32(1, 3.0))),
               v2_layer("p", "PSROIPooling", psroi))  # fmt: skip
    assert _decodes(clip).layer[0].clip_param.max == 1.0
    # An R-FCN file: 148 is SmoothL1LossParameter (sigma), 149 PSROIPoolingParameter
    net = _decodes(sl1)
    assert net.layer[0].smooth_l1_loss_param.sigma == 3.0
    assert net.layer[1].psroi_pooling_param.output_dim == 7
    with pytest.raises(DialectError):
        _decodes(sl1, "frcnn")  # 148/149 are BVLC's clip_param and nothing there
    abc = _net(v2_layer("a", "AdaptiveBiasChannel", ld(148, v(1, 4))))
    assert _decodes(abc).layer[0].adaptive_bias_channel_param.num_iter == 4
    with pytest.raises(DialectError):
        _decodes(abc, "rfcn")  # 148 as SmoothL1LossParameter: field 1 is a float there


def test_149_150_four_forks():
    cases = {
        "rfcn": (v2_layer("p", "PSROIPooling", ld(149, f32(1, 0.0625) + v(2, 21) + v(3, 7))),
                 lambda lay: lay.psroi_pooling_param.group_size == 7),
        "eric612": (v2_layer("r", "Reorg", ld(149, v(1, 2))),
                    lambda lay: lay.reorg_param.stride == 2),
        "darknet2caffe": (v2_layer("m", "Mish", ld(150, v(2, 1))),
                          lambda lay: lay.mish_param.engine == 1),
        "deeplab-v2": (v2_layer("b", "BiasChannel", ld(149, f32(1, 0.5))),
                       lambda lay: lay.bias_channel_param.bg_bias == 0.5),
    }  # fmt: skip
    for key, (layer, check) in cases.items():
        data = _net(layer)
        assert detect_binary(data).key == key
        assert check(_decodes(data).layer[0])
        others = [k for k in cases if k != key]
        assert not any(_decodes_ok(data, k, check) for k in others)


def _decodes_ok(data: bytes, key: str, check) -> bool:
    try:
        return check(_decodes(data, key).layer[0])
    except CaffeError:
        return False


def test_200_to_203_ssd_vs_crnn():
    ssd = _net(v2_layer("p", "PriorBox", ld(203, f32(1, 30.0) + v(4, 1))))
    crnn = _net(v2_layer("c", "CtcLoss", ld(200, v(1, 37) + v(4, 0))))
    assert detect_binary(ssd).key == "ssd" and detect_binary(crnn).key == "crnn"
    assert list(_decodes(ssd).layer[0].prior_box_param.min_size) == [30.0]
    assert _decodes(crnn).layer[0].ctc_loss_param.alphabet_size == 37
    with pytest.raises(DialectError):
        _decodes(crnn, "ssd")  # 200 as AnnotatedDataParameter: field 1 is a message there
    with pytest.raises(DialectError):
        _decodes(ssd, "crnn")  # CRNN has no field 203 of that shape


def test_137_138_segnet_vs_bvlc_embed_tile():
    segnet = _net(
        v2_layer("u", "Upsample", ld(137, v(1, 2) + v(4, 1)), bottoms=["x", "m"]),
        v2_layer("d", "DenseImageData", ld(138, s(1, "train.txt") + v(2, 4))),
    )
    bvlc = _net(v2_layer("t", "Tile", ld(138, v(1, 1) + v(2, 3))),
                v2_layer("e", "Embed", ld(137, v(1, 8) + v(2, 100))))  # fmt: skip
    net = _decodes(segnet)
    assert (
        net.layer[0].upsample_param.pad_out_h
        and net.layer[1].dense_image_data_param.batch_size == 4
    )
    assert detect_binary(segnet).key == "segnet"
    net = _decodes(bvlc)
    assert net.layer[0].tile_param.tiles == 3 and net.layer[1].embed_param.input_dim == 100
    with pytest.raises(DialectError):
        _decodes(segnet, "bvlc")  # 138's field 1 is a string, TileParameter's an int


def test_bn_two_forms():
    segnet = _net(v2_layer("bn", "BN", ld(45, v(3, 1))))  # bn_mode: INFERENCE
    pspnet = _net(v2_layer("bn", "BN", ld(152, f32(3, 0.95) + f32(4, 1e-5) + v(5, 1))))
    assert detect_binary(segnet).key == "segnet" and detect_binary(pspnet).key == "pspnet"
    assert _decodes(segnet).layer[0].bn_param.bn_mode == caffe_pb2.BNParameter.INFERENCE
    bn = _decodes(pspnet).layer[0].bn_param
    assert bn.momentum == pytest.approx(0.95) and bn.frozen and not bn.HasField("bn_mode")
    with pytest.raises(DialectError):
        _decodes(_net(v2_layer("bn", "BN", ld(45, f32(3, 0.95)))), "segnet")


def test_dropout_field_2_scale_train_vs_sample_weights_test():
    data = _net(v2_layer("d", "Dropout", ld(108, f32(1, 0.5) + v(2, 0))))
    assert not _decodes(data, "frcnn").layer[0].dropout_param.scale_train
    p = _decodes(data, "segnet").layer[0].dropout_param
    assert p.HasField("sample_weights_test") and not p.HasField("scale_train")
    with pytest.raises(DialectError):
        _decodes(data, "bvlc")


def test_loss_parameter_segnet_and_rfcn():
    data = _net(v2_layer("l", "SoftmaxWithLoss", ld(101, v(3, 1) + f32(4, 2.0))))
    loss = _decodes(data, "segnet").layer[0].loss_param
    assert loss.weight_by_label_freqs and list(loss.class_weighting) == [2.0]
    assert not loss.HasField("normalization")
    norm = caffe_pb2.LossParameter
    rfcn = _net(v2_layer("l", "SoftmaxWithLossOHEM", ld(101, v(3, 3) + f32(4, 128.0))))
    loss = _decodes(rfcn).layer[0].loss_param
    assert loss.normalization == norm.PRE_FIXED and loss.pre_fixed_normalizer == 128.0
    none = _net(v2_layer("l", "SoftmaxWithLossOHEM", ld(101, v(3, 4))))
    assert _decodes(none).layer[0].loss_param.normalization == norm.NONE
    assert (
        _decodes(_net(v2_layer("l", "SoftmaxWithLoss", ld(101, v(3, 3)))))
        .layer[0]
        .loss_param.normalization
        == norm.NONE
    )  # BVLC's 3


def test_round_mode_vs_ceil_mode_field_13():
    data = _net(v2_layer("p", "Pooling", ld(121, v(2, 3) + v(13, 0))))  # 13 = 0
    bvlc = _decodes(data, "bvlc").layer[0].pooling_param
    patch = _decodes(data, "ceil_mode").layer[0].pooling_param
    assert bvlc.round_mode == caffe_pb2.PoolingParameter.CEIL
    assert patch.HasField("ceil_mode") and not patch.ceil_mode  # false: FLOOR
    with pytest.raises(DialectError, match="field 13.*round_mode.*ceil_mode"):
        _decodes(data)  # nothing in the bytes tells them apart


def test_c3d_v10_blob_and_v1_types():
    data = _net(v1_layer("conv1a", 30, ld(6, c3d_blob((1, 1, 2, 1, 1), [0.5, -1.0]))))
    assert detect_binary(data).key == "c3d-v1.0"
    layer = _decodes(data).layers[0]
    assert layer.type == caffe_pb2.V1LayerParameter.CONVOLUTION3D
    assert (layer.blobs[0].length, layer.blobs[0].height) == (2, 1)
    assert len(layer.blobs[0].data) == 2
    with pytest.raises(CaffeError):
        _decodes(data, "bvlc")


def test_deeplab_v1_v1_types():
    data = _net(v1_layer("fc8_interp", 41, ld(43, v(3, 8))))  # INTERP, interp_param
    assert detect_binary(data).key == "deeplab-v1"
    layer = _decodes(data).layers[0]
    assert layer.type == caffe_pb2.V1LayerParameter.INTERP and layer.interp_param.zoom_factor == 8
    bvlc = _net(v1_layer("up", 39))  # 39: BVLC's DECONVOLUTION, DeepLab v1's IMAGE_SEG_DATA
    assert _decodes(bvlc).layers[0].type == caffe_pb2.V1LayerParameter.DECONVOLUTION
    assert _decodes(bvlc, "deeplab-v1").layers[0].type == caffe_pb2.V1LayerParameter.IMAGE_SEG_DATA


def test_eric612_relu6_v1():
    data = _net(v1_layer("r", 61, ld(61, f32(1, 0.0))))
    assert detect_binary(data).key == "eric612"
    assert _decodes(data).layers[0].type == caffe_pb2.V1LayerParameter.RELU6


def test_ssd_solver_eval_type_vs_bvlc_layer_wise_reduce():
    data = s(41, "detection") + s(42, "11point") + v(44, 1)
    solver = decode(data, "SolverParameter", "ssd")
    assert (solver.eval_type, solver.ap_version, solver.show_per_class_result) == (
        "detection", "11point", True,
    )  # fmt: skip
    with pytest.raises(DialectError):
        decode(data, "SolverParameter", "bvlc")
    eric = decode(s(52, "detection"), "SolverParameter", "eric612")
    assert eric.eval_type == "detection"


def test_files_caffe2jax_writes_decode_in_its_own_numbering():
    net = caffe_pb2.NetParameter(name="n")
    layer = net.layer.add(name="up", type="Interp")
    layer.interp_param.zoom_factor = 2
    data = net.SerializeToString()
    assert detect_binary(data).merged
    assert decode_net(data) == net


@pytest.mark.parametrize("key", [k for k in dialect_names() if k != "caffe2jax"])
def test_encode_decode_round_trip(key):
    layer = caffe_pb2.LayerParameter(name="l", type="Convolution")
    layer.convolution_param.num_output = 4
    layer.convolution_param.weight_filler.type = "xavier"
    blob = layer.blobs.add()
    blob.shape.dim.extend([2])
    blob.data.extend([1.5, -2.0])
    net = caffe_pb2.NetParameter(name="n", layer=[layer] if key not in ("c3d-v1.0",) else [])
    if key == "c3d-v1.0":
        v1 = net.layers.add(name="l", type=caffe_pb2.V1LayerParameter.CONVOLUTION3D)
        v1.convolution_param.kernel_depth = 3
        v1.blobs.add(num=1, channels=1, length=1, height=1, width=2, data=[1.5, -2.0])
    data = encode(net, key)
    assert decode(data, "NetParameter", key) == net
    assert schema(key, "NetParameter").FromString(data).name == "n"
