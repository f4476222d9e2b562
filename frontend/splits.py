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


def _readers(net: ir.Net) -> dict[str, int]:
    """How many times each blob version is read: by bottoms, and once more by Caffe's loss
    when the prototxt gives its top a loss weight."""
    readers: dict[str, int] = {}
    for layer in net.layers:
        for b in layer.bottoms:
            readers[b] = readers.get(b, 0) + 1
        for top, weight in zip(layer.tops, _explicit_loss(layer)):
            if weight:
                readers[top] = readers.get(top, 0) + 1
    return readers


class _Splitter:
    """InsertSplits' bookkeeping: which split top each reader of a blob version gets."""

    def __init__(self, net: ir.Net):
        self.readers = _readers(net)
        self.split_of: dict[str, list[tuple[str, str]]] = {}  # version -> [(id, name)]
        self.handed: dict[str, int] = {}

    def bottoms(self, layer: ir.Layer) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The layer's bottoms (SSA ids, Caffe names), each read of a split blob taking the
        split's next top."""
        ids, names = [], []
        for b, user in zip(layer.bottoms, layer.bottom_names):
            if b in self.split_of:
                k = self.handed[b]
                self.handed[b] = k + 1
                b, user = self.split_of[b][k]
            ids.append(b)
            names.append(user)
        return tuple(ids), tuple(names)

    def splits(self, layer: ir.Layer, losses: list[float]) -> tuple[list[CaffeLayer], bool]:
        """The Split layers after ``layer``, one per top read more than once. A top with a
        loss weight hands its loss to the split's first top (``losses`` is updated)."""
        explicit = _explicit_loss(layer)
        out, moved = [], False
        for j, (top, user) in enumerate(zip(layer.tops, layer.top_names)):
            count = self.readers.get(top, 0)
            if count <= 1:
                continue
            base = f"{user}_{caffe_name(layer)}_{j}_split"
            self.split_of[top] = [(f"{top}{SPLIT}{k}", f"{base}_{k}") for k in range(count)]
            self.handed[top] = 0
            weight = explicit[j] if j < len(explicit) else 0.0
            if weight:  # the split's first top carries the loss; readers start at top 1
                losses[j] = 0.0
                self.handed[top] = 1
                moved = True
            ids, names = zip(*self.split_of[top])
            weights = (weight,) + (0.0,) * (count - 1)
            out.append(CaffeLayer(base, "Split", None, (top,), ids, (user,), names, weights))
        return out, moved


def insert_splits(net: ir.Net) -> tuple[CaffeLayer, ...]:
    """Caffe's InsertSplits over ``net`` (see the module docstring)."""
    splitter = _Splitter(net)
    out: list[CaffeLayer] = []
    for layer in net.layers:
        bottoms, bottom_names = splitter.bottoms(layer)
        losses = list(layer.loss_weights)
        splits, moved = splitter.splits(layer, losses)
        out.append(
            CaffeLayer(
                caffe_name(layer),
                layer.type,
                layer.name,
                bottoms,
                layer.tops,
                bottom_names,
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
