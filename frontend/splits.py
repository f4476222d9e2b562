"""Caffe's InsertSplits on the Net IR: the layer list Net::Init really builds.

A blob version read by more than one bottom (a nonzero ``loss_weight`` written in the prototxt
counts as a read) gets a ``Split`` layer right after its producer; each reader takes one of the
split's tops, and a producer whose explicit ``loss_weight`` counted as a read hands it to the
split's first top. Caffe names them (insert_splits.cpp)::

    split layer   <blob>_<producer layer>_<top index>_split
    split top k   <blob>_<producer layer>_<top index>_split_<k>

This one function serves every place that needs Caffe's own layer list: the need-backward
analysis, the layers Net::ToProto writes into a .caffemodel, and pycaffe's ``net.blobs`` /
``net.layers`` (which list split blobs and split layers).
"""

from __future__ import annotations

from dataclasses import dataclass

from caffe2jax.frontend import ir

SPLIT = "#split"


@dataclass(frozen=True)
class CaffeLayer:
    """One layer of the list Caffe builds.

    ``key`` is the caffe2jax layer key it comes from (None for a Split layer); ``name`` is the
    name Caffe gives it. ``bottoms``/``tops`` are SSA ids (a split's tops get ids of their own),
    ``bottom_names``/``top_names`` Caffe's blob names. ``loss_weights`` are as Caffe holds them
    after InsertSplits; ``explicit_loss`` tells which of them the prototxt wrote.
    """

    name: str
    type: str
    key: str | None
    bottoms: tuple[str, ...]
    tops: tuple[str, ...]
    bottom_names: tuple[str, ...]
    top_names: tuple[str, ...]
    loss_weights: tuple[float, ...]
    moved_loss: bool = False

    @property
    def is_split(self) -> bool:
        return self.key is None


def caffe_name(layer: ir.Layer) -> str:
    """The name the user gave a layer (keys of duplicate names carry a ``#n`` suffix)."""
    return layer.param.name if layer.param is not None else layer.name


def _explicit_loss(layer: ir.Layer) -> list[float]:
    return list(layer.param.loss_weight) if layer.param is not None else []


def insert_splits(net: ir.Net) -> tuple[CaffeLayer, ...]:
    """Caffe's InsertSplits over ``net`` (see the module docstring)."""
    readers: dict[str, int] = {}
    for layer in net.layers:
        for b in layer.bottoms:
            readers[b] = readers.get(b, 0) + 1
        for top, weight in zip(layer.tops, _explicit_loss(layer)):
            if weight:
                readers[top] = readers.get(top, 0) + 1
    split_of: dict[str, list[tuple[str, str]]] = {}  # version -> [(split id, split name)]
    handed: dict[str, int] = {}
    out: list[CaffeLayer] = []
    for layer in net.layers:
        bottoms, bottom_names = [], []
        for b, user in zip(layer.bottoms, layer.bottom_names):
            if b in split_of:
                k = handed[b]
                handed[b] = k + 1
                b, user = split_of[b][k]
            bottoms.append(b)
            bottom_names.append(user)
        explicit = _explicit_loss(layer)
        losses = list(layer.loss_weights)
        splits = []
        moved = False
        for j, (top, user) in enumerate(zip(layer.tops, layer.top_names)):
            count = readers.get(top, 0)
            if count <= 1:
                continue
            base = f"{user}_{caffe_name(layer)}_{j}_split"
            split_of[top] = [(f"{top}{SPLIT}{k}", f"{base}_{k}") for k in range(count)]
            handed[top] = 0
            weight = explicit[j] if j < len(explicit) else 0.0
            if weight:  # the split's first top carries the loss; readers start at top 1
                losses[j] = 0.0
                handed[top] = 1
                moved = True
            ids, names = zip(*split_of[top])
            splits.append(
                CaffeLayer(
                    base,
                    "Split",
                    None,
                    (top,),
                    ids,
                    (user,),
                    names,
                    (weight,) + (0.0,) * (count - 1),
                )  # fmt: skip
            )
        out.append(
            CaffeLayer(
                caffe_name(layer),
                layer.type,
                layer.name,
                tuple(bottoms),
                layer.tops,
                tuple(bottom_names),
                layer.top_names,
                tuple(losses),
                moved,
            )  # fmt: skip
        )
        out.extend(splits)
    return tuple(out)


def blob_order(layers: tuple[CaffeLayer, ...]) -> list[str]:
    """Caffe's ``blob_names_``: every top name in the order Net::Init first creates it."""
    return list(dict.fromkeys(name for layer in layers for name in layer.top_names))
