"""frontend/forks/user_proto.py and proto_merge.py: a fork's caffe.proto as a dialect."""

from __future__ import annotations

import logging

import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.frontend.forks import dialect, schema, user_proto
from caffe2jax.frontend.forks.dialect import DialectError
from caffe2jax.frontend.parse import read_net
from caffe2jax.frontend.pipeline import load_net
from tests.golden import ROOT

EXAMPLE = ROOT / "examples" / "fork_rcf"
RCF = EXAMPLE / "rcf.proto"

FORK = """syntax = "proto2";
package caffe;
message GateParameter {
  optional float bias = 1 [default = 0.5];
  enum Mode { SOFT = 0; HARD = 1; }
  optional Mode mode = 2 [default = HARD];
}
message ConvolutionParameter {
  optional uint32 num_output = 1;
  optional bool gated = 90;
}
message LayerParameter {
  optional string name = 1;
  optional string type = 2;
  repeated string bottom = 3;
  repeated string top = 4;
  optional ConvolutionParameter convolution_param = 106;
  optional GateParameter gate_param = 4000;
}
"""

NET = """name: "n"
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 dim: 3 dim: 3 } } }
layer { name: "g" type: "Gate" bottom: "x" top: "y" gate_param { mode: SOFT } }
layer { name: "c" type: "Convolution" bottom: "y" top: "z"
  convolution_param { num_output: 1 kernel_size: 1 gated: true } }
"""


@pytest.fixture
def fork(tmp_path):
    path = tmp_path / "caffe.proto"
    path.write_text(FORK)
    return path


def test_fork_fields_parse_by_name_and_stay_in_the_layer(fork):
    net = load_net(NET, dialect=str(fork))
    gate = user_proto.readable_param(net.layer("g").param)
    assert gate.gate_param.mode == gate.gate_param.SOFT
    assert gate.gate_param.bias == pytest.approx(0.5)  # the fork's default
    conv = user_proto.readable_param(net.layer("c").param)
    assert conv.convolution_param.gated and conv.convolution_param.kernel_size[0] == 1
    assert isinstance(net.layer("c").param, caffe_pb2.LayerParameter)
    assert net.dialect == str(fork.resolve())


def test_fork_numbers_make_its_dialect(fork):
    d = dialect.get(str(fork))
    assert d.given and d.key == str(fork.resolve()) and not d.conflicts
    (mine,) = d.forks
    assert mine.adds["LayerParameter"] == {"gate_param": 4000}
    assert mine.adds["ConvolutionParameter"] == {"gated": 90}
    assert "caffe.proto" in dialect.describe(d)


def test_without_the_fork_its_fields_are_unknown(fork):
    with pytest.raises(CaffeError, match=r"<string>:3:.*gate_param"):
        read_net(NET)


def test_collision_with_built_in_dialects_is_one_line(caplog):
    with caplog.at_level(logging.WARNING, "caffe2jax"):
        fork = user_proto.load(RCF)
    (line,) = fork.collisions
    assert line == (
        f"{RCF.resolve()}:19: LayerParameter field 147 (auto_crop_param here) is swish_param "
        "in BVLC Caffe, upsample_param in ENet, domain_transform_param in DeepLab v2, "
        "domain_transform_param in PSPNet, roi_pooling_param in R-FCN, "
        "margin_inner_product_param in SphereFace, center_loss_param in center loss (caffe-face), "
        "reorg_param in caffe-yolov2 (gklz1982)"
    )


def test_combined_with_a_clashing_fork_a_binary_net_is_refused():
    combined = dialect.get(f"{RCF}+enet")
    assert combined.conflicts == (
        "LayerParameter field 147 is auto_crop_param in the fork of rcf.proto, "
        "upsample_param in ENet",
    )
    with pytest.raises(DialectError, match="numbers clash"):
        schema.decode_net(b"", combined, "n.caffemodel")


def test_binary_net_of_the_fork_decodes_with_its_own_numbers(fork):
    own = user_proto.load(fork).own_class("NetParameter")()
    layer = own.layer.add(name="g", type="Gate")
    layer.gate_param.bias = 2.0
    net = read_net(own.SerializeToString(), dialect=str(fork))
    assert user_proto.readable_param(net.layer[0]).gate_param.bias == 2.0


def test_bad_proto_is_one_line_with_file_line(tmp_path):
    bad = tmp_path / "bad.proto"
    bad.write_text('syntax = "proto2";\npackage caffe;\nmessage LayerParameter {\n'
                   "  optional string name = 1\n}\n")  # fmt: skip
    with pytest.raises(user_proto.ForkProtoError) as err:
        dialect.get(str(bad))
    assert str(err.value).startswith(f'{bad}:5:1: Expected ";"')
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("package caffe;\nmessage Other { optional int32 a = 1; }\n", "declares no message"),
        ("package caffe;\nmessage LayerParameter {\n  optional string type = 2;\n"
         "  optional string name = 9;\n}\n", ":5: LayerParameter.name is 9 here, 1 in BVLC"),
        ("package caffe;\nmessage LayerParameter {\n  optional float top = 4;\n}\n",
         ":4: LayerParameter.top is optional float here but repeated string"),
    ],
)  # fmt: skip
def test_unusable_fork_is_one_line(tmp_path, text, expected):
    path = tmp_path / "f.proto"
    path.write_text('syntax = "proto2";\n' + text)
    with pytest.raises(CaffeError, match=expected.replace(".", r"\.")):
        user_proto.load(path)


def test_missing_proto(tmp_path):
    with pytest.raises(user_proto.ForkProtoError, match="not found"):
        dialect.get(str(tmp_path / "none.proto"))
