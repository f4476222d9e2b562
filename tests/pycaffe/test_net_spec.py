"""caffe.net_spec and caffe.coord_map, checked against pycaffe's documented rules and Caffe's
own generator scripts (re-typed here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

import caffe2jax as caffe
from caffe2jax import layers as L
from caffe2jax import params as P
from caffe2jax.frontend.filter import layer_included, make_state
from caffe2jax.frontend.parse import read_net
from caffe2jax.proto import caffe_pb2
from caffe2jax.pycaffe import coord_map

MODELS = Path(__file__).resolve().parents[2].parent / "shared/caffe/models"
LENET = MODELS / "examples/mnist/lenet_train_test.prototxt"


def notebook_lenet(lmdb, batch_size):
    """examples/01-learning-lenet.ipynb's lenet(), as the notebook writes it."""
    n = caffe.NetSpec()
    n.data, n.label = L.Data(batch_size=batch_size, backend=P.Data.LMDB, source=lmdb,
                             transform_param=dict(scale=1.0 / 255), ntop=2)  # fmt: skip
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50,
                            weight_filler=dict(type="xavier"))  # fmt: skip
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.fc1 = L.InnerProduct(n.pool2, num_output=500, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.fc1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.score, n.label)
    return n.to_proto()


# What the notebook prints for lenet('mnist/mnist_train_lmdb', 64) (its layers, abridged to the
# fields that differ between layers of one type).
NOTEBOOK_TRAIN = """
layer { name: "data" type: "Data" top: "data" top: "label"
  transform_param { scale: 0.00392156862745 }
  data_param { source: "mnist/mnist_train_lmdb" batch_size: 64 backend: LMDB } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 20 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  convolution_param { num_output: 50 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "fc1" type: "InnerProduct" bottom: "pool2" top: "fc1"
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "fc1" top: "fc1" }
layer { name: "score" type: "InnerProduct" bottom: "fc1" top: "score"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss" }
"""


def test_notebook_lenet_matches_its_printed_prototxt():
    expected = text_format.Parse(NOTEBOOK_TRAIN, caffe_pb2.NetParameter())
    assert notebook_lenet("mnist/mnist_train_lmdb", 64) == expected


def lenet_train_test(phase):
    """lenet_train_test.prototxt written with NetSpec: one net per phase, as every NetSpec
    script makes (a NetSpec holds one top per name, so both phases' "data" cannot share it)."""
    train = phase == caffe.TRAIN
    source, batch = ("mnist_train_lmdb", 64) if train else ("mnist_test_lmdb", 100)
    lr = [dict(lr_mult=1), dict(lr_mult=2)]
    fill = dict(weight_filler=dict(type="xavier"), bias_filler=dict(type="constant"))
    n = caffe.NetSpec()
    n.data, n.label = L.Data(name="mnist", include=dict(phase=phase),
                             transform_param=dict(scale=0.00390625),
                             data_param=dict(source="examples/mnist/" + source, batch_size=batch,
                                             backend=P.Data.LMDB), ntop=2)  # fmt: skip
    n.conv1 = L.Convolution(n.data, param=lr, num_output=20, kernel_size=5, stride=1, **fill)
    n.pool1 = L.Pooling(n.conv1, pool=P.Pooling.MAX, kernel_size=2, stride=2)
    n.conv2 = L.Convolution(n.pool1, param=lr, num_output=50, kernel_size=5, stride=1, **fill)
    n.pool2 = L.Pooling(n.conv2, pool=P.Pooling.MAX, kernel_size=2, stride=2)
    n.ip1 = L.InnerProduct(n.pool2, param=lr, num_output=500, **fill)
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.ip2 = L.InnerProduct(n.relu1, param=lr, num_output=10, **fill)
    if not train:
        n.accuracy = L.Accuracy(n.ip2, n.label, include=dict(phase=caffe.TEST))
    n.loss = L.SoftmaxWithLoss(n.ip2, n.label)
    net = n.to_proto()
    net.name = "LeNet"
    return net


def stored_phase(path, phase):
    """The stored file's layers that Caffe keeps in ``phase`` (its include rules)."""
    net, state = read_net(path), make_state(phase)
    out = caffe_pb2.NetParameter(name=net.name)
    out.layer.extend(layer for layer in net.layer if layer_included(layer, state))
    return out


@pytest.mark.parametrize("phase", [caffe.TRAIN, caffe.TEST])
def test_lenet_generator_equals_stored_file_per_phase(phase):
    assert lenet_train_test(phase) == stored_phase(LENET, phase)


def test_lenet_generator_phases_merge_to_stored_file():
    """The two phase nets interleave into exactly the stored two-phase message."""
    train, test = lenet_train_test(caffe.TRAIN), lenet_train_test(caffe.TEST)
    merged = caffe_pb2.NetParameter(name="LeNet")
    merged.layer.extend([train.layer[0], test.layer[0], *train.layer[1:-1], test.layer[-2]])
    merged.layer.append(train.layer[-1])
    assert merged == read_net(LENET)
    assert test.layer[-2].type == "Accuracy" and list(test.layer[-2].bottom) == ["ip2", "label"]


def conv_relu(bottom, ks, nout, stride=1, pad=0, group=1):
    conv = L.Convolution(bottom, kernel_size=ks, stride=stride, num_output=nout, pad=pad,
                         group=group)  # fmt: skip
    return conv, L.ReLU(conv, in_place=True)


def fc_relu(bottom, nout):
    fc = L.InnerProduct(bottom, num_output=nout)
    return fc, L.ReLU(fc, in_place=True)


def max_pool(bottom, ks, stride=1):
    return L.Pooling(bottom, pool=P.Pooling.MAX, kernel_size=ks, stride=stride)


def caffenet(lmdb, batch_size=256, include_acc=False):
    """examples/pycaffe/caffenet.py's caffenet() (no NetSpec: every name is automatic)."""
    data, label = L.Data(source=lmdb, backend=P.Data.LMDB, batch_size=batch_size, ntop=2,
                         transform_param=dict(crop_size=227, mean_value=[104, 117, 123],
                                              mirror=True))  # fmt: skip
    conv1, relu1 = conv_relu(data, 11, 96, stride=4)
    pool1 = max_pool(relu1, 3, stride=2)
    norm1 = L.LRN(pool1, local_size=5, alpha=1e-4, beta=0.75)
    conv2, relu2 = conv_relu(norm1, 5, 256, pad=2, group=2)
    pool2 = max_pool(relu2, 3, stride=2)
    norm2 = L.LRN(pool2, local_size=5, alpha=1e-4, beta=0.75)
    conv3, relu3 = conv_relu(norm2, 3, 384, pad=1)
    conv4, relu4 = conv_relu(relu3, 3, 384, pad=1, group=2)
    conv5, relu5 = conv_relu(relu4, 3, 256, pad=1, group=2)
    pool5 = max_pool(relu5, 3, stride=2)
    fc6, relu6 = fc_relu(pool5, 4096)
    drop6 = L.Dropout(relu6, in_place=True)
    fc7, relu7 = fc_relu(drop6, 4096)
    drop7 = L.Dropout(relu7, in_place=True)
    fc8 = L.InnerProduct(drop7, num_output=1000)
    loss = L.SoftmaxWithLoss(fc8, label)
    if include_acc:
        acc = L.Accuracy(fc8, label)
        return caffe.to_proto(loss, acc)
    return caffe.to_proto(loss)


def test_caffenet_generator_auto_names():
    net = caffenet("ilsvrc12_train_lmdb", include_acc=True)
    names = [layer.name for layer in net.layer]
    assert names[:6] == ["Data1", "Convolution1", "ReLU1", "Pooling1", "LRN1", "Convolution2"]
    assert names[-3:] == ["InnerProduct3", "SoftmaxWithLoss1", "Accuracy1"]
    by = {layer.name: layer for layer in net.layer}
    assert list(by["Data1"].top) == ["Data1", "Data2"]
    assert list(by["ReLU1"].bottom) == list(by["ReLU1"].top) == ["Convolution1"]
    assert list(by["SoftmaxWithLoss1"].bottom) == ["InnerProduct3", "Data2"]
    assert list(by["Dropout2"].top) == ["InnerProduct2"]
    assert list(by["Data1"].transform_param.mean_value) == [104, 117, 123]


def test_caffenet_generator_has_the_stored_caffenets_layers():
    """Same layer types, wiring and geometry as bvlc_reference_caffenet/train_val.prototxt
    (TRAIN); the script leaves out the names, fillers and lr_mults the stored file has."""
    ours = caffenet("examples/imagenet/ilsvrc12_train_lmdb")
    path = MODELS / "models/bvlc_reference_caffenet/train_val.prototxt"
    stored = stored_phase(path, "TRAIN")
    assert [x.type for x in ours.layer] == [x.type for x in stored.layer]
    rename = {}
    for a, b in zip(ours.layer, stored.layer):
        rename.update(zip(a.top, b.top))
        assert [rename[t] for t in a.bottom] == list(b.bottom)
        for field in ("convolution_param", "pooling_param", "lrn_param", "inner_product_param"):
            mine, theirs = getattr(a, field), getattr(b, field)
            for f in ("num_output", "kernel_size", "stride", "pad", "group", "pool",
                      "local_size", "alpha", "beta"):  # fmt: skip
                if f in mine.DESCRIPTOR.fields_by_name:
                    assert _value(mine, f) == _value(theirs, f), (a.name, f)


def _value(message, field):
    """A field's effective value: an empty repeated pad/stride is Caffe's default 0/1."""
    value = getattr(message, field)
    if not hasattr(value, "extend"):
        return value
    return list(value) or {"pad": [0], "stride": [1]}.get(field, [])


def test_naming_and_parameter_rules():
    n = caffe.NetSpec()
    n.data = L.Input(shape=[dict(dim=[2, 3, 8, 8])])
    unnamed = L.Convolution(n.data, num_output=4, kernel_size=3)
    n.out = L.Eltwise(unnamed, L.Convolution(n.data, num_output=4, kernel_size=3),
                      loss_weight=0.5, propagate_down=[True, False])  # fmt: skip
    n.silence = L.Silence(n.out, ntop=0)
    net = n.to_proto()
    assert [x.name for x in net.layer] == ["data", "Convolution1", "Convolution2", "out", "silence"]
    assert list(net.layer[0].input_param.shape[0].dim) == [2, 3, 8, 8]
    assert list(net.layer[3].bottom) == ["Convolution1", "Convolution2"]
    assert list(net.layer[3].loss_weight) == [0.5]  # not an EltwiseParameter field
    assert list(net.layer[3].propagate_down) == [True, False]
    assert list(net.layer[4].top) == [] and list(net.layer[4].bottom) == ["out"]
    assert n.keys() == ["data", "out", "silence"]
    n.update("out", dict(operation=P.Eltwise.MAX))
    assert n.to_proto().layer[3].eltwise_param.operation == caffe_pb2.EltwiseParameter.MAX


def test_python_layer_and_explicit_param_messages():
    n = caffe.NetSpec()
    n.data, n.label = L.Python(module="voc_layers", layer="VOCDataLayer", ntop=2,
                               param_str="{'split': 'train'}")  # fmt: skip
    n.up = L.Deconvolution(n.data, convolution_param=dict(num_output=3, kernel_size=4, stride=2))
    net = n.to_proto()
    assert net.layer[0].python_param.layer == "VOCDataLayer"
    assert net.layer[0].python_param.param_str == "{'split': 'train'}"
    assert net.layer[1].convolution_param.stride == [2]


def test_errors_as_pycaffe():
    with pytest.raises(TypeError, match="Convolution input 0 is not a Top"):
        L.Convolution(np.zeros(3))
    with pytest.raises(AttributeError, match="Convolution1.*no field 'no_such_field'"):
        L.Convolution(L.Input(), no_such_field=1).to_proto()
    with pytest.raises(AttributeError, match="Deconvolution1.*'num_output'.*convolution_param"):
        L.Deconvolution(L.Input(), num_output=1).to_proto()
    with pytest.raises(AttributeError):
        caffe.NetSpec().missing  # noqa: B018


def coord_net(pool=2, dstride=2):
    """data → 3×3 conv → pool → deconv (kernel 2·stride): pycaffe's coord_map test net."""
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 1, 100, 100]))
    n.conv = L.Convolution(n.data, num_output=10, kernel_size=3, stride=1, pad=0)
    n.relu = L.ReLU(n.conv, in_place=True)
    n.pool = L.Pooling(n.relu, pool=P.Pooling.MAX, kernel_size=pool, stride=pool)
    n.deconv = L.Deconvolution(
        n.pool, convolution_param=dict(num_output=10, kernel_size=2 * dstride, stride=dstride)
    )
    return n


def test_coord_map_through_conv_pool_deconv():
    n = coord_net()
    ax, a, b = coord_map.coord_map_from_to(n.deconv, n.data)
    assert (ax, np.ravel(a).tolist(), np.ravel(b).tolist()) == (1, [1.0], [0.0])
    n = coord_net(pool=4, dstride=4)
    ax, a, b = coord_map.coord_map_from_to(n.deconv, n.data)
    assert (ax, np.ravel(a).tolist(), np.ravel(b).tolist()) == (1, [1.0], [-1.0])


def test_crop_makes_a_crop_layer_at_the_offset():
    n = coord_net(pool=4, dstride=4)
    n.crop = coord_map.crop(n.deconv, n.data)
    layer = n.to_proto().layer[-1]
    assert layer.type == "Crop" and list(layer.bottom) == ["deconv", "data"]
    assert layer.crop_param.axis == 2 and list(layer.crop_param.offset) == [1]


def test_crop_refuses_what_it_cannot_align():
    n = coord_net()
    with pytest.raises(AssertionError, match="scale mismatch"):  # pycaffe asserts
        coord_map.crop(n.pool, n.data)
    other = L.Input(shape=dict(dim=[1, 1, 5, 5]))
    with pytest.raises(RuntimeError, match="Could not compute map"):
        coord_map.coord_map_from_to(n.deconv, L.InnerProduct(other, num_output=2))
