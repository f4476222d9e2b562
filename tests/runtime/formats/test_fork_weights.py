"""Fork .caffemodel files (runtime/formats/{weights,caffemodel,blobproto,convert}.py): only
names, types and blobs are read, so the forks' colliding parameter numbers never matter;
what a binary itself holds is read in its dialect (C3D v1.0's 5-D BlobProto, the V1 type
numbers of BVLC, C3D v1.0, DeepLab v1 and eric612), and a file in another dialect than the
one in use is refused naming the dialect to pass.

Every file here is written by hand with the fork's own numbers (tests/forks.py)."""

from __future__ import annotations

import io

import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import WeightsError
from caffe2jax.frontend.forks.dialect import get
from caffe2jax.runtime.formats.blobproto import Scanner, read_blob
from caffe2jax.runtime.formats.caffemodel import read_layers
from caffe2jax.runtime.formats.convert import convert_weights
from caffe2jax.runtime.formats.weights import load_weights
from tests.forks import bvlc_blob, c3d_blob, f32, ld, s, v, v1_layer, v2_layer

IP_NET = """
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
        inner_product_param { num_output: 2 } }
"""
W = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
B = np.array([0.5, -1.5], dtype=np.float32)


def _model(text: str = IP_NET):
    return caffe2jax.compile(text)


def _write(tmp_path, data: bytes, name: str = "w.caffemodel"):
    path = tmp_path / name
    path.write_bytes(s(1, "net") + data)
    return path


def _ip_blobs(blob) -> bytes:
    return ld(7, blob(W.shape, W.ravel())) + ld(7, blob(B.shape, B))


def _check(params):
    np.testing.assert_array_equal(np.asarray(params["ip"][0]), W)
    np.testing.assert_array_equal(np.asarray(params["ip"][1]), B)


@pytest.mark.parametrize(
    "fork_layer",
    [
        v2_layer("interp", "Interp", ld(143, v(3, 2))),  # PSPNet's 143: not BVLC's input_param
        v2_layer("up", "Upsample", ld(147, v(1, 2))),  # ENet's 147: not BVLC's swish_param
        v2_layer("roi", "ROIPooling", ld(147, v(1, 7) + v(2, 7) + f32(3, 0.0625))),  # R-FCN
        v2_layer("ctc", "CtcLoss", ld(200, v(1, 37))),  # CRNN's 200: not SSD's
        v2_layer("data", "AnnotatedData", ld(200, ld(1, v(4, 1)))),  # SSD's 200
        v2_layer("bn", "BN", ld(152, f32(3, 0.9))),  # PSPNet's BN (SegNet's is 45)
        v2_layer("pool", "Pooling", ld(121, v(13, 1))),  # ceil_mode: true (BVLC: FLOOR)
    ],
    ids=["143", "147-enet", "147-rfcn", "200-crnn", "200-ssd", "bn-pspnet", "13-ceil_mode"],
)
def test_layer_parameters_in_the_binary_are_never_read(tmp_path, fork_layer):
    """As OpenCV does: a layer's parameters come from the prototxt, so a fork's colliding
    numbers in the binary cannot be misread, whatever the dialect."""
    path = _write(tmp_path, fork_layer + v2_layer("ip", "InnerProduct", _ip_blobs(bvlc_blob)))
    for dialect in (None, "bvlc", "pspnet", "ssd+crnn"):
        _check(load_weights(path, _model(), dialect=dialect)[0])


def test_c3d_v10_blobs_are_read_in_their_own_numbers(tmp_path):
    dims = ((1, 1, 1, 2, 3), (1, 1, 1, 1, 2))  # legacy 5-D: num, channels, length, h, w
    blobs = ld(6, c3d_blob(dims[0], W.ravel())) + ld(6, c3d_blob(dims[1], B))
    path = _write(tmp_path, v1_layer("ip", 14, blobs))  # 14: INNER_PRODUCT in every dialect
    _check(load_weights(path, _model(), dialect="c3d-v1.0")[0])
    with pytest.raises(WeightsError) as err:
        load_weights(path, _model())  # the prototxt is BVLC's: a BVLC read would lose data
    message = str(err.value)
    assert "layer 'ip' blob 0: it is a C3D v1.0 (5-D) BlobProto, not a BVLC one" in message
    assert "pass dialect='c3d-v1.0'" in message


def test_bvlc_blobs_are_refused_in_the_c3d_dialect(tmp_path):
    path = _write(tmp_path, v2_layer("ip", "InnerProduct", _ip_blobs(bvlc_blob)))
    with pytest.raises(WeightsError, match="not a C3D v1.0 \\(5-D\\) one \\(pass dialect='bvlc'"):
        load_weights(path, _model(), dialect="c3d-v1.0")


def test_c3d_5d_blob_shapes():
    data = c3d_blob((64, 3, 3, 3, 3), np.zeros(64 * 81, np.float32))
    raw = read_blob(Scanner(io.BytesIO(data), len(data)), 0, len(data))
    assert raw.legacy and raw.dims == (64, 3, 3, 3, 3)
    assert raw.shape_equals((64, 3, 3, 3, 3)) and not raw.shape_equals((64, 3, 3, 3))
    bias = c3d_blob((1, 1, 1, 1, 64), np.zeros(64, np.float32))
    assert read_blob(Scanner(io.BytesIO(bias), len(bias)), 0, len(bias)).shape_equals((64,))


DECONV_NET = """
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 1 dim: 2 dim: 2 } } }
layer { name: "up" type: "Deconvolution" bottom: "x" top: "y"
        convolution_param { num_output: 1 kernel_size: 1 bias_term: false } }
"""


def test_v1_type_numbers_that_name_the_net_layer_only_in_another_fork(tmp_path):
    # V1 39 is BVLC's DECONVOLUTION, DeepLab v1's IMAGE_SEG_DATA, C3D v1.0's VOXEL_CUSTOM_LOSS.
    path = _write(tmp_path, v1_layer("up", 39, ld(6, bvlc_blob((1, 1, 1, 1), [2.0]))))
    params, _ = load_weights(path, _model(DECONV_NET))
    assert float(np.asarray(params["up"][0]).ravel()[0]) == 2.0
    with pytest.raises(WeightsError) as err:
        load_weights(path, _model(DECONV_NET), dialect="deeplab-v1")
    message = str(err.value)
    assert "V1 type number 39 is ImageSegData in DeepLab v1's numbering" in message
    assert "Deconvolution in BVLC Caffe's" in message and "pass dialect='bvlc'" in message


def test_v1_type_names_follow_the_files_dialect(tmp_path):
    data = s(1, "n") + v1_layer("r", 61) + v1_layer("i", 41) + v1_layer("c", 33)
    scan = Scanner(io.BytesIO(data), len(data))
    assert [x.type for x in read_layers(scan, get("bvlc"))[1]] == [
        "V1 type 61", "V1 type 41", "Slice",
    ]  # fmt: skip
    assert [x.type for x in read_layers(scan, get("eric612+deeplab-v1"))[1]] == [
        "ReLU6", "Interp", "Slice",
    ]  # fmt: skip
    assert [x.type for x in read_layers(scan, get("c3d-v1.0"))[1]][2] == "VideoData"
    assert [x.type for x in read_layers(scan)[1]] == ["ReLU6", "Interp", "Slice"]  # own bytes
    c3d = s(1, "n") + v1_layer("c", 30, ld(6, c3d_blob((1, 1, 1, 1, 1), [1.0])))
    scan = Scanner(io.BytesIO(c3d), len(c3d))
    assert read_layers(scan)[1][0].type == "Convolution3D"  # 30: BVLC's ARGMAX


def test_convert_without_a_net_rewrites_c3d_blobs_in_bvlc_numbers(tmp_path):
    blob = c3d_blob((2, 1, 1, 1, 3), W.ravel())
    source = _write(tmp_path, v1_layer("conv1a", 30, ld(6, blob)), "c3d.caffemodel")
    dest = convert_weights(source, tmp_path / "out.caffemodel")
    data = dest.read_bytes()
    scan = Scanner(io.BytesIO(data), len(data))
    _, layers = read_layers(scan)
    assert layers[0].type == "Convolution3D"
    raw = read_blob(scan, *layers[0].blobs[0], layout="bvlc")
    assert raw.dims == (2, 1, 1, 1, 3) and not raw.legacy
    np.testing.assert_array_equal(raw.values, W.ravel())


def test_pycaffe_net_takes_a_dialect(tmp_path):
    dims = ((1, 1, 1, 2, 3), (1, 1, 1, 1, 2))
    blobs = ld(6, c3d_blob(dims[0], W.ravel())) + ld(6, c3d_blob(dims[1], B))
    path = _write(tmp_path, v1_layer("ip", 14, blobs))
    proto = tmp_path / "ip.prototxt"
    proto.write_text(IP_NET)
    net = caffe2jax.Net(str(proto), caffe2jax.TEST, weights=str(path), dialect="c3d-v1.0")
    np.testing.assert_array_equal(net.params["ip"][0].data, W)
