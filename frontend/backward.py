"""Caffe's Net::Init need-backward analysis over the Net IR, on the layers with Caffe's Split
layers inserted (:mod:`caffe2jax.frontend.splits`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from caffe2jax.frontend import ir
from caffe2jax.frontend.splits import insert_splits


@dataclass
class _Node:
    """A layer as Net::Init sees it after InsertSplits (``split`` nodes are Caffe's Splits)."""

    name: str
    bottoms: list[str]
    tops: list[str]
    loss: list[float]
    propagate_down: tuple[bool, ...] = ()
    params: list[bool] = field(default_factory=list)
    split: bool = False


def _insert_splits(net: ir.Net, num_params: Mapping[str, int]) -> list[_Node]:
    """The layers of Caffe's InsertSplits (:mod:`caffe2jax.frontend.splits`) as analysis nodes."""
    nodes = []
    for caffe in insert_splits(net):
        if caffe.is_split:
            nodes.append(_Node(caffe.name, list(caffe.bottoms), list(caffe.tops),
                               list(caffe.loss_weights), split=True))  # fmt: skip
            continue
        layer = net.layer(caffe.key)
        params = [layer.spec(j).lr_mult != 0 for j in range(num_params.get(layer.name, 0))]
        nodes.append(_Node(layer.name, list(caffe.bottoms), list(caffe.tops),
                           list(caffe.loss_weights), layer.propagate_down, params))  # fmt: skip
    return nodes


def resolve_backward(
    net: ir.Net,
    num_params: Mapping[str, int],
    allow_force_backward: Mapping[str, tuple[bool, ...]],
) -> ir.Net:
    """Caffe's Net::Init need-backward analysis, given each layer's param blob count.

    Reproduces, on the net with Caffe's Split layers inserted: a layer needs backward if any
    bottom blob does or any of its params has ``lr_mult != 0``; ``propagate_down`` overrides a
    bottom's flag; a reverse pass drops layers that do not contribute to a loss (and bottoms
    whose every reader skips backward); finally ``force_backward`` turns every layer, every
    param and every bottom the layer allows (``allow_force_backward``: loss layers refuse
    their labels) on. SSA ids stand in for Caffe's blob names (in-place versions of one name
    never meet in Caffe's sets in a way that differs).
    """
    nodes = _insert_splits(net, num_params)
    blob_needs: dict[str, bool] = {}
    layer_need: list[bool] = []
    bottom_need: list[list[bool]] = []
    for node in nodes:
        need = any(blob_needs.get(b, False) for b in node.bottoms) or any(node.params)
        flags = [
            node.propagate_down[i] if node.propagate_down else blob_needs.get(b, False)
            for i, b in enumerate(node.bottoms)
        ]
        for top in node.tops:
            blob_needs[top] = need
        layer_need.append(need)
        bottom_need.append(flags)

    under_loss: set[str] = set()
    skip_backprop: set[str] = set()
    for k in range(len(nodes) - 1, -1, -1):
        node = nodes[k]
        contributes = any(w != 0 or t in under_loss for w, t in zip(node.loss, node.tops))
        if layer_need[k] and all(t in skip_backprop for t in node.tops):
            layer_need[k] = False
            bottom_need[k] = [False] * len(bottom_need[k])
        if not contributes:
            layer_need[k] = False
        for i, b in enumerate(node.bottoms):
            if contributes:
                under_loss.add(b)
            else:
                bottom_need[k][i] = False
            if not bottom_need[k][i]:
                skip_backprop.add(b)

    result = {}
    for k, node in enumerate(nodes):
        if node.split:
            continue
        params = tuple(node.params) if layer_need[k] else (False,) * len(node.params)
        if net.force_backward:
            allowed = allow_force_backward.get(node.name, ())
            flags = tuple(
                f or (allowed[i] if i < len(allowed) else True)
                for i, f in enumerate(bottom_need[k])
            )
            result[node.name] = ir.Backward(True, flags, (True,) * len(node.params))
        else:
            result[node.name] = ir.Backward(layer_need[k], tuple(bottom_need[k]), params)
    return net.with_backward(result)
