"""frontend/forks/forms.py: which layer a fork type string names, decided once from the prototxt
(and the dialect where the text alone cannot tell), recorded on ir.Layer.form."""

from __future__ import annotations

import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.forks.forms import FORMS
from caffe2jax.frontend.pipeline import load_net
from tests.forks import FORK_MODELS

INPUT = 'layer { name: "in" type: "Input" top: "x" top: "m" top: "t" top: "w" }\n'


def _forms(text: str, dialect: str | None = None) -> dict[str, str]:
    net = load_net(INPUT + text, dialect=dialect)
    assert net.dialect == (dialect or net.dialect)
    return {layer.name: layer.form for layer in net.layers[1:]}


def test_bn_segnet_and_pspnet_forms():
    segnet = 'layer { name: "a" type: "BN" bottom: "x" top: "a" bn_param { bn_mode: INFERENCE } }'
    pspnet = 'layer { name: "b" type: "BN" bottom: "x" top: "b" bn_param { frozen: true } }'
    assert _forms(segnet + pspnet.replace("frozen: true", "scale_filler { value: 1 }")) == {
        "a": "segnet", "b": "segnet",
    }  # fmt: skip
    assert _forms(pspnet) == {"b": "pspnet"}
    mixed = pspnet.replace("frozen: true", "frozen: true bn_mode: LEARN")
    with pytest.raises(NetError, match="layer 'b' \\(type BN\\): bn_param mixes SegNet"):
        _forms(mixed)


def test_bare_bn_needs_the_dialect():
    bare = 'layer { name: "b" type: "BN" bottom: "x" top: "b" }'
    with pytest.raises(NetError, match="may be either BN layer; pass dialect='segnet' or"):
        _forms(bare)
    assert _forms(bare, "pspnet") == {"b": "pspnet"}
    assert _forms(bare, "enet") == {"b": "segnet"}


def test_upsample_forms():
    unpool = 'layer { name: "u" type: "Upsample" bottom: "x" bottom: "m" top: "u" }'
    nearest = (
        'layer { name: "n" type: "Upsample" bottom: "x" top: "n" upsample_param { scale: 2 } }'
    )
    assert _forms(unpool + nearest) == {"u": "max_unpool", "n": "nearest"}
    bad = nearest.replace("scale: 2", "upsample_h: 20")
    with pytest.raises(NetError, match="SegNet's max-unpooling fields \\(upsample_h\\)"):
        _forms(bad)


def test_smooth_l1_loss_forms():
    rcnn = 'layer { name: "r" type: "SmoothL1Loss" bottom: "x" bottom: "t" top: "r" ' \
        "smooth_l1_loss_param { sigma: 3 } }"  # fmt: skip
    four = 'layer { name: "f" type: "SmoothL1Loss" bottom: "x" bottom: "t" bottom: "w" ' \
        'bottom: "m" top: "f" }'  # fmt: skip
    three = 'layer { name: "s" type: "SmoothL1Loss" bottom: "x" bottom: "t" bottom: "w" top: "s" }'
    two = 'layer { name: "z" type: "SmoothL1Loss" bottom: "x" bottom: "t" top: "z" }'
    assert _forms(rcnn + four + three) == {"r": "rcnn", "f": "rcnn", "s": "ssd"}
    assert _forms(two) == {"z": "rcnn"}  # with two bottoms the forms compute the same
    assert _forms(two, "ssd") == {"z": "ssd"}


def test_dropout_and_softmax_loss_forms():
    rcnn = 'layer { name: "d" type: "Dropout" bottom: "x" top: "d" ' \
        "dropout_param { scale_train: false } }"  # fmt: skip
    segnet = 'layer { name: "e" type: "Dropout" bottom: "x" top: "e" ' \
        "dropout_param { sample_weights_test: true } }"  # fmt: skip
    plain = 'layer { name: "p" type: "Dropout" bottom: "x" top: "p" }'
    loss = 'layer { name: "l" type: "SoftmaxWithLoss" bottom: "x" bottom: "t" top: "l" ' \
        "loss_param { weight_by_label_freqs: true class_weighting: 0.2 } }"  # fmt: skip
    assert _forms(rcnn + segnet + plain + loss) == {
        "d": "scale_train", "e": "sample_test", "p": "", "l": "segnet",
    }  # fmt: skip


def test_development_set_forms():
    def forms(name, phase="TEST"):
        net = load_net(FORK_MODELS / name, phase)
        return {(x.type, x.form) for x in net.layers if x.form}

    assert forms("segnet_bayesian_inference.prototxt") == {
        ("BN", "segnet"), ("Upsample", "max_unpool"), ("Dropout", "sample_test"),
    }  # fmt: skip
    assert forms("pspnet101_cityscapes_713.prototxt") == {("BN", "pspnet")}
    assert forms("yolov3_darknet53_eric612.prototxt") == {("Upsample", "nearest")}
    assert forms("yolov3_spp_chenyingpeng.prototxt") == {
        ("Upsample", "nearest"), ("Pooling", "darknet2caffe"),
    }  # fmt: skip
    assert forms("c3d_v10_ucf101_finetune_train.prototxt", "TRAIN") == {
        ("VideoData", "c3d-v1.0"), ("Convolution3D", "c3d-v1.0"), ("Pooling3D", "c3d-v1.0"),
    }  # fmt: skip
    assert forms("faster_rcnn_vgg16_train.prototxt", "TRAIN") == {("SmoothL1Loss", "rcnn")}


def test_every_form_is_documented():
    assert {"segnet", "pspnet"} == set(FORMS["BN"])
    assert {"max_unpool", "nearest"} == set(FORMS["Upsample"])
