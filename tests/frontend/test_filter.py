"""NetState filtering against Caffe's StateMeetsRule / FilterNet rules, table-driven."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.filter import filter_net, layer_included, make_state, state_meets_rule


def rule(text: str) -> caffe_pb2.NetStateRule:
    return text_format.Parse(text, caffe_pb2.NetStateRule())


# (state: phase, level, stages), rule text, meets?
RULE_CASES = [
    (("TRAIN", 0, ()), "", True),
    (("TRAIN", 0, ()), "phase: TRAIN", True),
    (("TEST", 0, ()), "phase: TRAIN", False),
    (("TEST", 0, ()), "phase: TEST", True),
    (("TEST", 2, ()), "min_level: 2", True),
    (("TEST", 1, ()), "min_level: 2", False),
    (("TEST", 3, ()), "max_level: 2", False),
    (("TEST", 2, ()), "max_level: 2", True),
    (("TEST", -1, ()), "min_level: -2 max_level: 0", True),
    (("TEST", 0, ("a",)), 'stage: "a"', True),
    (("TEST", 0, ()), 'stage: "a"', False),
    (("TEST", 0, ("a",)), 'stage: "a" stage: "b"', False),
    (("TEST", 0, ("b", "a")), 'stage: "a" stage: "b"', True),
    (("TEST", 0, ("a",)), 'not_stage: "a"', False),
    (("TEST", 0, ("b",)), 'not_stage: "a"', True),
    (("TEST", 0, ("a", "b")), 'stage: "a" not_stage: "b"', False),
    (("TRAIN", 1, ("deploy",)), 'phase: TRAIN min_level: 1 stage: "deploy"', True),
    (("TEST", 1, ("deploy",)), 'phase: TRAIN min_level: 1 stage: "deploy"', False),
]


@pytest.mark.parametrize("state, text, meets", RULE_CASES)
def test_state_meets_rule(state, text, meets):
    phase, level, stages = state
    assert state_meets_rule(make_state(phase, level, stages), rule(text)) is meets


# include/exclude rule lists on one layer, state, included?
LAYER_CASES = [
    ("", ("TRAIN", 0, ()), True),
    ("include { phase: TRAIN }", ("TRAIN", 0, ()), True),
    ("include { phase: TRAIN }", ("TEST", 0, ()), False),
    ("exclude { phase: TRAIN }", ("TRAIN", 0, ()), False),
    ("exclude { phase: TRAIN }", ("TEST", 0, ()), True),
    ("include { phase: TRAIN } include { stage: 'x' }", ("TEST", 0, ("x",)), True),
    ("include { phase: TRAIN } include { stage: 'x' }", ("TEST", 0, ()), False),
    ("exclude { stage: 'x' } exclude { min_level: 3 }", ("TEST", 3, ()), False),
    ("exclude { stage: 'x' } exclude { min_level: 3 }", ("TEST", 2, ()), True),
    ("include { not_stage: 'deploy' }", ("TEST", 0, ("deploy",)), False),
]


@pytest.mark.parametrize("rules, state, included", LAYER_CASES)
def test_layer_included(rules, state, included):
    layer = text_format.Parse(f'name: "l" type: "ReLU" {rules}', caffe_pb2.LayerParameter())
    assert layer_included(layer, make_state(*state)) is included


def test_include_and_exclude_together_is_refused():
    layer = text_format.Parse(
        'name: "l" include { phase: TRAIN } exclude { phase: TEST }', caffe_pb2.LayerParameter()
    )
    with pytest.raises(NetError, match="either include rules or exclude rules"):
        layer_included(layer, make_state("TRAIN"))


def test_filter_keeps_order_and_records_state():
    net = text_format.Parse(
        """
        layer { name: "a" include { phase: TRAIN } }
        layer { name: "b" }
        layer { name: "c" include { phase: TEST } }
        """,
        caffe_pb2.NetParameter(),
    )
    out = filter_net(net, make_state("TEST", stages=["s"]))
    assert [layer.name for layer in out.layer] == ["b", "c"]
    assert out.state.phase == caffe_pb2.TEST and list(out.state.stage) == ["s"]
    assert len(net.layer) == 3  # the input is not modified


def test_stages_add_to_the_nets_own_state():
    base = text_format.Parse('stage: "from_net" level: 4', caffe_pb2.NetState())
    state = make_state("TRAIN", level=1, stages=["given"], base=base)
    assert list(state.stage) == ["from_net", "given"] and state.level == 1


def test_unknown_phase():
    with pytest.raises(NetError, match="unknown phase"):
        make_state("VALIDATE")
