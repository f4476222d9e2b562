"""NetState filtering: which layers a net keeps for a phase, level and stages.

Reproduces Caffe's Net::FilterNet and Net::StateMeetsRule.
"""

from __future__ import annotations

from collections.abc import Iterable

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError

PHASES = {"TRAIN": caffe_pb2.TRAIN, "TEST": caffe_pb2.TEST}


def make_state(
    phase: str | int, level: int = 0, stages: Iterable[str] = (), base=None
) -> caffe_pb2.NetState:
    """A NetState: ``base`` (e.g. the net's own ``state``) with phase, level and stages set.

    Like Caffe's Net(file, phase, level, stages) constructor, the given stages are appended to
    the ones the net already declares.
    """
    state = caffe_pb2.NetState()
    if base is not None:
        state.CopyFrom(base)
    if isinstance(phase, str):
        if phase.upper() not in PHASES:
            raise NetError(f"unknown phase {phase!r}: expected TRAIN or TEST")
        phase = PHASES[phase.upper()]
    state.phase = phase
    state.level = level
    state.stage.extend(stages)
    return state


def state_meets_rule(state: caffe_pb2.NetState, rule: caffe_pb2.NetStateRule) -> bool:
    """Caffe's StateMeetsRule: phase, min/max level, all ``stage``s, no ``not_stage``."""
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    if any(stage not in state.stage for stage in rule.stage):
        return False
    return not any(stage in state.stage for stage in rule.not_stage)


def layer_included(layer: caffe_pb2.LayerParameter, state: caffe_pb2.NetState) -> bool:
    """A layer with no include rule is in unless an exclude rule matches; else any include."""
    if layer.include and layer.exclude:
        raise NetError(
            f"layer '{layer.name}': specify either include rules or exclude rules; not both"
        )
    if not layer.include:
        return not any(state_meets_rule(state, rule) for rule in layer.exclude)
    return any(state_meets_rule(state, rule) for rule in layer.include)


def filter_net(net: caffe_pb2.NetParameter, state: caffe_pb2.NetState) -> caffe_pb2.NetParameter:
    """A copy of ``net`` holding only the layers ``state`` includes, with ``state`` recorded."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(net)
    del out.layer[:]
    out.layer.extend(layer for layer in net.layer if layer_included(layer, state))
    for layer in out.layer:  # Net::Init: a layer inherits the net's phase unless it sets one
        if not layer.HasField("phase"):
            layer.phase = state.phase
    out.state.CopyFrom(state)
    return out
