"""What Caffe's Net::Init fixes for a pycaffe net and no reshape changes: its layers (Split
layers included) and their views, its blobs by Caffe's names in Caffe's order, which blob
version each name shows, and the loss weights its diffs start from."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import CaffeError, NetError
from caffe2jax.frontend.phase import TEST, TRAIN, Phase
from caffe2jax.frontend.splits import CaffeLayer

if TYPE_CHECKING:
    from caffe2jax.pycaffe.blob import Blob


def phase_name(phase: int | str) -> str:
    """Caffe's Phase enum (TRAIN = 0, TEST = 1) or its name → "TRAIN" / "TEST"."""
    if phase in (TRAIN, "TRAIN", "train"):
        return ir.TRAIN
    if phase in (TEST, "TEST", "test"):
        return ir.TEST
    raise CaffeError(f"unknown phase {phase!r}: use caffe2jax.TRAIN or caffe2jax.TEST")


def constructor_args(
    network_file: Any, phase_or_weights: Any, phase: Any, weights: Any, base_dir: Any
) -> tuple[Any, Any, Path]:
    """``caffe.Net``'s two forms, ``Net(file, phase, weights=W)`` and the older
    ``Net(file, W, phase)``: (phase, weights, the folder data layers' paths are relative to)."""
    if isinstance(phase_or_weights, str | os.PathLike) and phase_or_weights not in (
        "TRAIN",
        "TEST",
        "train",
        "test",
    ):
        weights, phase_or_weights = phase_or_weights, TEST if phase is None else phase
    if base_dir is not None:
        folder = Path(base_dir)
    elif isinstance(network_file, str | os.PathLike) and not _is_text(network_file):
        folder = Path(network_file).parent
    else:
        folder = Path(".")
    return phase_or_weights, weights, folder


def _is_text(source: Any) -> bool:
    return isinstance(source, str) and ("\n" in source or "{" in source)


class Layer:
    """pycaffe's layer view: ``type``, ``blobs`` (its param blobs), ``phase`` and ``reshape``.
    The view of a class-style Python layer answers for its object too (``layer.my_attribute``,
    its own methods), as pycaffe's ``net.layers[i]`` is that object; ``blobs`` stay the net's."""

    def __init__(self, name: str, type_: str, blobs: list[Blob], net: Any, instance: Any = None):
        self.name = name
        self.type = type_
        self.blobs = blobs
        self._net = net
        self._instance = instance

    def __getattr__(self, name: str) -> Any:
        instance = self.__dict__.get("_instance")
        if instance is None or name.startswith("__"):
            raise AttributeError(f"'Layer' object has no attribute {name!r}")
        return getattr(instance, name)

    @property
    def phase(self) -> Phase:
        """The layer's phase, the net's (caffe-fast-rcnn's ``Layer.phase``: Caffe's enum)."""
        return Phase(self._net.phase)

    def reshape(self, bottom=None, top=None) -> None:
        """Caffe's Layer::Reshape from pycaffe: the net re-infers every shape."""
        self._net.reshape()

    def __repr__(self) -> str:
        return f"<Layer {self.name!r} type {self.type}>"


class Structure:
    """The layer list of Net::Init (``layers``) and what it fixes about the blobs.

    ``names`` are Caffe's blob names in Caffe's order; ``data_version[name]`` is the SSA id
    of the last write of a blob (what its data shows after a whole forward) and
    ``diff_version[name]`` of its first (where Caffe's in-place diff ends); ``loss_weights``
    the nonzero loss weights of the tops (their diffs start there, as Net::Init sets them).
    """

    def __init__(self, layers: tuple[CaffeLayer, ...], net_name: str,
                 types: dict[str, str] | None = None):  # fmt: skip
        self.layers = layers
        self.net_name = net_name
        self._types = dict(types or {})
        self.data_version: dict[str, str] = {}
        self.diff_version: dict[str, str] = {}
        for caffe in layers:
            for top, name in zip(caffe.tops, caffe.top_names):
                self.data_version[name] = top
                self.diff_version.setdefault(name, top)
        self.names = list(self.diff_version)
        self.loss_weights = {
            name: w for caffe in layers for name, w in zip(caffe.top_names, caffe.loss_weights) if w
        }
        self.layer_names = [caffe.name for caffe in layers]
        self._writes: dict[tuple[int, int], dict[str, str]] = {}

    def index(self, name: str | None, default: int) -> int:
        """The index of layer ``name`` (``default`` for None); an unknown name is an error."""
        if name is None:
            return default
        try:
            return self.layer_names.index(name)
        except ValueError:
            raise NetError(f"no layer named '{name}' in net '{self.net_name}'") from None

    def writes(self, lo: int, hi: int) -> dict[str, str]:
        """Caffe name → the version ForwardFromTo(lo, hi) leaves in it: its last write in
        the range (a ReLU after ``end`` runs in place does not run)."""
        key = (lo, hi)
        if key not in self._writes:
            out: dict[str, str] = {}
            for caffe in self.layers[lo : hi + 1]:
                out.update(zip(caffe.top_names, caffe.tops))
            self._writes[key] = out
        return self._writes[key]

    def type_of(self, caffe: CaffeLayer) -> str:
        """The layer's Caffe type (a Python data layer run on the host stays "Python")."""
        return self._types.get(caffe.key or "", caffe.type)

    def top_names(self) -> OrderedDict[str, list[str]]:
        return OrderedDict((c.name, list(c.top_names)) for c in self.layers)

    def bottom_names(self) -> OrderedDict[str, list[str]]:
        return OrderedDict((c.name, list(c.bottom_names)) for c in self.layers)
