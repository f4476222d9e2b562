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
    ``form`` tells apart the layers a fork type string names in several forks ("segnet" or
    "pspnet" for BN, "max_unpool" or "nearest" for Upsample, ...; "" when the type has one
    meaning): see :mod:`caffe2jax.frontend.forks.forms`.
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
    form: str = ""

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
    ``dialect`` is the key of the fork numbering the net's binary files are read with ("bvlc",
    "pspnet", "ssd+ceil_mode", ...; see :mod:`caffe2jax.frontend.forks.dialect`).
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
    dialect: str = "bvlc"

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
