"""The Net IR: a Caffe net after parse → upgrade → filter, as plain frozen data.

The IR holds no JAX objects. Blobs are in SSA form: every write of a blob gets its own id, so
in-place layers (``top == bottom``) read one version and write the next. The *last* version of
a blob keeps the user's name (``conv1`` is the ReLU output when ``relu1`` runs in place, exactly
what Caffe's ``net.blobs['conv1'].data`` shows); earlier versions are named
``<blob>@<writer layer>``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

TRAIN = "TRAIN"
TEST = "TEST"


@dataclass(frozen=True)
class ParamSpec:
    """One of Caffe's ``param {}`` entries of a layer (defaults as in caffe.proto)."""

    name: str = ""
    lr_mult: float = 1.0
    decay_mult: float = 1.0
    permissive: bool = False
    has_lr_mult: bool = False
    has_decay_mult: bool = False


@dataclass(frozen=True)
class Layer:
    """One Caffe layer with its blobs resolved to SSA ids.

    ``bottoms``/``tops`` are SSA ids; ``bottom_names``/``top_names`` the user's names.
    ``param`` is the layer's ``caffe_pb2.LayerParameter`` (read it, never mutate it).
    ``loss_weights`` has one entry per top (Caffe's defaults applied).
    ``propagate_down`` is empty when the prototxt does not set it, else one flag per bottom.
    """

    name: str
    type: str
    bottoms: tuple[str, ...]
    tops: tuple[str, ...]
    bottom_names: tuple[str, ...]
    top_names: tuple[str, ...]
    loss_weights: tuple[float, ...]
    propagate_down: tuple[bool, ...]
    param_specs: tuple[ParamSpec, ...]
    param: Any = field(compare=False, repr=False)
    line: int = 0
    source: str = field(default="", compare=False)  # the prototxt file the layer came from

    @property
    def where(self) -> str:
        """``"file:line: "`` of the layer's definition for error messages ("" if unknown)."""
        return f"{self.source}:{self.line}: " if self.source and self.line else ""

    @property
    def is_loss(self) -> bool:
        return any(w != 0 for w in self.loss_weights)

    def spec(self, index: int) -> ParamSpec:
        """The ParamSpec for param blob ``index`` (Caffe's default spec when not listed)."""
        return self.param_specs[index] if index < len(self.param_specs) else ParamSpec()


@dataclass(frozen=True)
class Backward:
    """Caffe's backward bookkeeping for one layer (Net::Init's need-backward analysis).

    ``bottoms[i]``: Caffe computes the diff of bottom ``i``.
    ``params[j]``: Caffe computes the diff of param blob ``j`` (param_propagate_down).
    """

    layer: bool
    bottoms: tuple[bool, ...]
    params: tuple[bool, ...]


@dataclass(frozen=True)
class Net:
    """A filtered Caffe net in SSA form.

    ``blob_names`` maps each user blob name to the SSA id of its last writer, and
    ``first_version`` maps it to the id of its first writer (where Caffe's in-place diff ends).
    ``shapes`` maps SSA ids to shapes once lowering has inferred them (empty before).
    ``backward`` holds per-layer :class:`Backward` once param counts are known (empty before).
    """

    name: str
    phase: str
    level: int
    stages: tuple[str, ...]
    layers: tuple[Layer, ...]
    force_backward: bool
    blob_names: Mapping[str, str]
    first_version: Mapping[str, str]
    source: str = ""
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    backward: Mapping[str, Backward] = field(default_factory=lambda: MappingProxyType({}))
    param: Any = field(default=None, compare=False, repr=False)

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"no layer named {name!r} in net {self.name!r}")

    @property
    def outputs(self) -> tuple[str, ...]:
        """User names of blobs no later layer reads (Caffe's net outputs), in order."""
        read = {b for layer in self.layers for b in layer.bottoms}
        outs = []
        for layer in self.layers:
            for ssa, user in zip(layer.tops, layer.top_names):
                if ssa not in read and self.blob_names.get(user) == ssa and user not in outs:
                    outs.append(user)
        return tuple(outs)

    def producer(self) -> dict[str, Layer]:
        """SSA id → the layer that writes it."""
        return {top: layer for layer in self.layers for top in layer.tops}

    def with_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> Net:
        return dataclasses.replace(self, shapes=MappingProxyType(dict(shapes)))

    def with_backward(self, backward: Mapping[str, Backward]) -> Net:
        return dataclasses.replace(self, backward=MappingProxyType(dict(backward)))

    def describe(self) -> str:
        """A readable listing: one line per layer, bottoms -> tops, with shapes when known."""
        lines = [f"net {self.name!r} phase {self.phase}"]
        for layer in self.layers:
            tops = ", ".join(
                f"{t}{list(self.shapes[t]) if t in self.shapes else ''}" for t in layer.tops
            )
            lines.append(f"  {layer.name} ({layer.type}): {', '.join(layer.bottoms)} -> {tops}")
        return "\n".join(lines)


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


def _insert_splits(net: Net, num_params: Mapping[str, int]) -> list[_Node]:
    """The layers of Caffe's InsertSplits (:mod:`caffe2jax.frontend.splits`) as analysis nodes."""
    from caffe2jax.frontend.splits import insert_splits

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
    net: Net,
    num_params: Mapping[str, int],
    allow_force_backward: Mapping[str, tuple[bool, ...]],
) -> Net:
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
            result[node.name] = Backward(True, flags, (True,) * len(node.params))
        else:
            result[node.name] = Backward(layer_need[k], tuple(bottom_need[k]), params)
    return net.with_backward(result)
