"""IR building: SSA blobs, loss weights, wiring errors, and Caffe's need-backward analysis."""

from __future__ import annotations

import pytest

from caffe2jax.frontend import ir
from caffe2jax.frontend.backward import resolve_backward
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.pipeline import load_net

NET = """
name: "tiny"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 4 } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "drop1" type: "Dropout" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        param { lr_mult: 0 } param { lr_mult: 0 } inner_product_param { num_output: 3 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip2" bottom: "label" top: "acc" }
"""


def test_in_place_blobs_become_ssa_versions():
    net = load_net(NET)
    ip1, relu, drop, ip2 = (net.layer(n) for n in ("ip1", "relu1", "drop1", "ip2"))
    assert ip1.tops == ("ip1@ip1",)
    assert relu.bottoms == ("ip1@ip1",) and relu.tops == ("ip1@relu1",)
    assert drop.bottoms == ("ip1@relu1",) and drop.tops == ("ip1",)
    assert ip2.bottoms == ("ip1",)
    assert net.blob_names["ip1"] == "ip1" and net.first_version["ip1"] == "ip1@ip1"
    assert drop.top_names == ("ip1",)


def test_outputs_are_unconsumed_blobs():
    assert load_net(NET).outputs == ("loss", "acc")


def test_loss_weights_follow_caffe_defaults():
    net = load_net(NET)
    assert net.layer("loss").loss_weights == (1.0,)
    assert net.layer("acc").loss_weights == (0.0,)
    assert net.layer("ip1").loss_weights == (0.0,)
    weighted = load_net(NET.replace('top: "acc" }', 'top: "acc" loss_weight: 0.5 }'))
    assert weighted.layer("acc").loss_weights == (0.5,)


def test_two_top_loss_weighs_only_the_first():
    text = NET.replace('top: "loss" }', 'top: "loss" top: "prob" }')
    assert load_net(text).layer("loss").loss_weights == (1.0, 0.0)


def test_param_specs_are_kept():
    spec = load_net(NET).layer("ip2").spec(0)
    assert spec.lr_mult == 0 and spec.has_lr_mult and spec.decay_mult == 1
    assert load_net(NET).layer("ip1").spec(1) == ir.ParamSpec()


@pytest.mark.parametrize(
    "edit, message",
    [
        (('bottom: "ip1" top: "ip2"', 'bottom: "nope" top: "ip2"'), "unknown bottom blob 'nope'"),
        (('top: "acc" }', 'top: "loss" }'), "top blob 'loss' is produced by multiple sources"),
        (('top: "loss" }', 'top: "loss" propagate_down: true }'), "propagate_down has 1"),
        (('top: "loss" }', 'top: "loss" loss_weight: 1 loss_weight: 2 }'), "loss_weight has 2"),
    ],
)
def test_wiring_errors_name_file_line_and_layer(tmp_path, edit, message):
    path = tmp_path / "bad.prototxt"
    path.write_text(NET.replace(*edit))
    with pytest.raises(NetError, match=message) as err:
        load_net(path)
    text = str(err.value)
    assert text.startswith(f"{path}:") and "layer '" in text and "\n" not in text


def test_duplicate_layer_names_get_distinct_keys():
    net = load_net(NET.replace('name: "relu1"', 'name: "ip1"'))
    assert [layer.name for layer in net.layers][1:3] == ["ip1", "ip1#2"]
    assert net.layers[2].param.name == "ip1"


def test_loss_layer_without_top_gets_an_automatic_one():
    net = load_net(NET.replace('bottom: "label" top: "loss" }', 'bottom: "label" }'))
    loss = net.layer("loss")
    assert loss.top_names == ("loss(automatic)",) and loss.loss_weights == (1.0,)


def _backward(net: ir.Net, counts: dict[str, int]) -> ir.Net:
    allow = {layer.name: (True,) * len(layer.bottoms) for layer in net.layers}
    allow["loss"] = (True, False)
    return resolve_backward(net, counts, allow)


def test_need_backward_follows_net_init():
    net = _backward(load_net(NET, "TRAIN"), {"ip1": 2, "ip2": 2})
    bw = net.backward
    assert bw["data"].layer is False
    assert bw["ip1"] == ir.Backward(True, (False,), (True, True))
    assert bw["relu1"].bottoms == (True,)
    # ip2's params have lr_mult 0, but its bottom needs backward (ip1 learns).
    assert bw["ip2"] == ir.Backward(True, (True,), (False, False))
    assert bw["loss"].bottoms == (True, False)
    # Accuracy does not contribute to a loss: no backward at all.
    assert bw["acc"] == ir.Backward(False, (False, False), ())


def test_frozen_net_needs_no_backward():
    frozen = "param { lr_mult: 0 } param { lr_mult: 0 } inner_product_param { num_output: 4 }"
    text = NET.replace("inner_product_param { num_output: 4 }", frozen)
    net = _backward(load_net(text, "TRAIN"), {"ip1": 2, "ip2": 2})
    assert not any(b.layer for b in net.backward.values())


def test_propagate_down_false_stops_the_branch():
    stopped = 'bottom: "label" top: "loss" propagate_down: false propagate_down: false }'
    text = NET.replace('bottom: "label" top: "loss" }', stopped)
    net = _backward(load_net(text, "TRAIN"), {"ip1": 2, "ip2": 2})
    assert net.backward["loss"].bottoms == (False, False)
    # Nothing below the loss receives a diff any more, so nothing upstream runs backward.
    assert net.backward["ip2"].layer is False and net.backward["ip1"].layer is False


def test_force_backward_turns_everything_on_but_labels():
    text = "force_backward: true\n" + NET.replace("param { lr_mult: 0 } param { lr_mult: 0 } ", "")
    net = _backward(load_net(text, "TRAIN"), {"ip1": 2, "ip2": 2})
    assert net.backward["ip1"].bottoms == (True,)
    assert net.backward["loss"].bottoms == (True, False)
    assert net.backward["acc"].layer is True


def test_blob_counts_are_checked_where_each_type_registers(tmp_path):
    """Caffe's CheckBlobCounts: each lowering declares its counts when it registers; a layer
    that breaks them fails at compile time naming file:line, layer and what it takes."""
    from caffe2jax.lowering.model import compile as compile_net

    path = tmp_path / "bad.prototxt"
    path.write_text(
        NET.replace('type: "ReLU" bottom: "ip1"', 'type: "ReLU" bottom: "ip1" bottom: "data"')
    )
    with pytest.raises(NetError, match="takes exactly 1 bottom blob\\(s\\), got 2") as err:
        compile_net(path)
    assert str(err.value).startswith(f"{path}:") and "layer 'relu1' (type ReLU)" in str(err.value)


def test_single_quoted_layer_names_still_give_file_and_line(tmp_path):
    """Text format takes either quote; py-faster-rcnn's and PVANet's nets name layers
    ``name: 'proposal'`` on a line of their own."""
    path = tmp_path / "single.prototxt"
    text = NET.replace('name: "ip2"', "\n  name: 'ip2'\n").replace(
        'bottom: "ip1" top: "ip2"', 'bottom: "nope" top: "ip2"'
    )
    path.write_text(text)
    line = text.splitlines().index("  name: 'ip2'") + 1
    with pytest.raises(NetError, match=rf"^{path}:{line}: layer 'ip2' .*unknown bottom blob"):
        load_net(path)
