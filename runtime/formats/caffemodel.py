"""The binary NetParameter (``.caffemodel``): its layers as stored, and Net::ToProto's output.

Reading walks the file with :class:`~caffe2jax.runtime.formats.blobproto.Scanner`: only names,
types and the byte ranges of blobs are read up front, so a caffemodel of any size costs one blob at
a time (protobuf's 64 MB message limit, which Caffe lifts by hand, never applies). All three layer
containers Caffe upgrades on load are understood (ReadNetParamsFromBinaryFileOrDie →
UpgradeNetAsNeeded): ``layer`` (LayerParameter: name 1, type 2, blobs 7), V1 ``layers``
(V1LayerParameter: name 4, type enum 5, blobs 6) and V0 ``layers { layer {...} }``
(V0LayerParameter: name 1, type 2, blobs 50).

Only ``name``, ``type`` and ``blobs`` are read from a layer: the layer's parameters come from
the prototxt, so the fields forks numbered differently (PSPNet's ``interp_param`` on BVLC's
``input_param`` number, ...) are never decoded here. What a binary itself holds still depends
on the fork that wrote it: V1 layer type numbers (C3D v1.0's 30-40, DeepLab v1's 39-56,
eric612's 61) are named in the caller's dialect, and blobs are read in the dialect's layout
(:mod:`caffe2jax.runtime.formats.blobproto`).

Writing reproduces Net::ToProto(param, write_diff=false): ``name``, then every layer of the
*initialized* net in order, each being its LayerParameter as Net::Init left it (see
:func:`caffe_layer_params`) with ``blobs`` replaced by the layer's current blobs.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.frontend.forks.catalog import FORKS, FORKS_BY_KEY
from caffe2jax.frontend.forks.dialect import Dialect, choose
from caffe2jax.frontend.splits import insert_splits
from caffe2jax.frontend.upgrade import V1_LAYER_TYPES
from caffe2jax.runtime.formats.blobproto import (
    C3D_V10_LAYOUT,
    LEN,
    Field,
    Scanner,
    WireError,
    blob_body_size,
    blob_layout,
    blob_pieces,
    encode_varint,
    tag,
)

NET_NAME, NET_V1_LAYERS, NET_LAYER = 1, 2, 100
_V1 = {"name": 4, "type": 5, "blobs": 6, "v0": 1}
_V0 = {"name": 1, "type": 2, "blobs": 50}
_CURRENT = {"name": 1, "type": 2, "blobs": 7}
_LAYER_BLOBS = 7


@dataclass
class SourceLayer:
    """A layer of a weights file: its name, type and the byte range of each BlobProto;
    ``v1_type`` is the stored V1 LayerType number (None for V2 and V0 layers)."""

    name: str
    type: str
    blobs: list[tuple[int, int]] = field(default_factory=list)
    v1_type: int | None = None


def read_layers(scan: Scanner, dialect: Dialect | None = None) -> tuple[str, list[SourceLayer]]:
    """The net name and the layers of the NetParameter filling the scanned file, V1 type
    numbers named as ``dialect`` numbers them (``None``: the dialect the file's own V1 numbers
    and blobs point to, see :func:`v1_dialect`).

    A file with both ``layer`` and V1 ``layers`` is refused, as Caffe's UpgradeV1Net does.
    """
    name, current, legacy = _scan_layers(scan)
    if current and legacy:
        raise WireError("it holds both 'layer' and V1 'layers' entries (Caffe refuses such nets)")
    if legacy:
        v1_names = (dialect or v1_dialect(scan, legacy)).v1_types()
        for layer in legacy:
            if layer.v1_type is not None:
                layer.type = v1_type_string(layer.v1_type, v1_names)
    return name, current or legacy


def v1_dialect(scan: Scanner, layers: list[SourceLayer]) -> Dialect:
    """The dialect a V1 file's own bytes point to: V1 type numbers BVLC does not have
    (DeepLab v1's 40-56, eric612's 61), C3D v1.0's 5-D blobs; BVLC otherwise."""
    bvlc = Dialect().v1_types()
    features = []
    for layer in layers:
        if layer.v1_type is not None and layer.v1_type not in bvlc:
            owners = tuple(
                f
                for f in FORKS
                if layer.v1_type in f.enums.get("V1LayerParameter.LayerType", {}).values()
            )
            features.append((f"V1 layer type number {layer.v1_type}", owners))
        if any(blob_layout(scan, *where) == C3D_V10_LAYOUT for where in layer.blobs):
            features.append(("5-D blobs", (FORKS_BY_KEY["c3d-v1.0"],)))
    return choose(features)


def _scan_layers(scan: Scanner) -> tuple[str, list[SourceLayer], list[SourceLayer]]:
    name = ""
    current: list[SourceLayer] = []
    legacy: list[SourceLayer] = []
    for top in scan.fields(0, scan.size):
        if top.number == NET_NAME and top.wire == LEN:
            name = scan.text(top)
        elif top.number == NET_LAYER and top.wire == LEN:
            current.append(_layer(scan, top, _CURRENT))
        elif top.number == NET_V1_LAYERS and top.wire == LEN:
            legacy.append(_v1_layer(scan, top))
        elif top.number in (NET_NAME, NET_LAYER, NET_V1_LAYERS):
            raise WireError(f"field {top.number} of NetParameter has wire type {top.wire}")
    return name, current, legacy


def _layer(scan: Scanner, where: Field, numbers: dict[str, int]) -> SourceLayer:
    layer = SourceLayer("", "")
    for f in scan.fields(where.offset, where.offset + where.length):
        if f.number == numbers["name"] and f.wire == LEN:
            layer.name = scan.text(f)
        elif f.number == numbers["type"] and f.wire == LEN:
            layer.type = scan.text(f)
        elif f.number == numbers["type"]:
            layer.v1_type = f.value  # named by read_layers, in the file's dialect
        elif f.number == numbers["blobs"] and f.wire == LEN:
            layer.blobs.append((f.offset, f.offset + f.length))
        elif f.number == numbers.get("v0") and f.wire == LEN:
            return _layer(scan, f, _V0)
    return layer


def _v1_layer(scan: Scanner, where: Field) -> SourceLayer:
    return _layer(scan, where, _V1)


def v1_type_string(value: int, v1_names: dict[int, str]) -> str:
    """The V2 type string of V1 LayerType number ``value`` in a dialect's numbering
    (``v1_names``: number -> enum name), or ``"V1 type N"`` when the dialect has none."""
    name = v1_names.get(value)
    return V1_LAYER_TYPES.get(name, f"V1 type {value}") if name else f"V1 type {value}"


# ---------------------------------------------------------------------------------------------
# What Net::Init makes of the layer parameters (and Net::ToProto writes back)


def caffe_layer_params(
    net: ir.Net, blob_counts: dict[str, int]
) -> list[tuple[caffe_pb2.LayerParameter, str | None]]:
    """Each layer of the net Caffe builds, as Layer::ToProto writes it (without blobs), with
    the caffe2jax layer key it comes from (None for Caffe's Split layers).

    Net::Init runs InsertSplits on the filtered net and sets ``phase`` on every layer that has
    none; two LayerSetUp's edit their own parameter: LossLayer (every ``*Loss`` type) adds
    ``loss_weight: 1`` when none is given (also after InsertSplits took it away), BatchNorm
    adds ``param { lr_mult: 0 }`` for each of its blobs the prototxt gives no spec for.
    ``blob_counts`` maps layer keys to their number of blobs.
    """
    phase = caffe_pb2.TRAIN if net.phase == ir.TRAIN else caffe_pb2.TEST
    out = []
    for caffe in insert_splits(net):
        key = caffe.key
        param = caffe_pb2.LayerParameter(name=caffe.name, type="Split")
        if key is not None:
            param.CopyFrom(net.layer(key).param)
            param.ClearField("blobs")
            if caffe.moved_loss:
                param.ClearField("loss_weight")
        elif any(caffe.loss_weights):
            param.loss_weight.extend(caffe.loss_weights)
        param.ClearField("bottom")
        param.bottom.extend(caffe.bottom_names)
        if key is None:
            param.top.extend(caffe.top_names)
        if not param.HasField("phase"):
            param.phase = phase
        if param.type.endswith("Loss") and not param.loss_weight:
            param.loss_weight.append(1.0)
        if param.type == "BatchNorm":
            for i in range(blob_counts.get(key, 0)):
                if len(param.param) == i:
                    param.param.add().lr_mult = 0.0
        out.append((param, key))
    return out


class BlobBody:
    """A BlobProto body of known ``size`` whose bytes ``pieces()`` produces when written."""

    def __init__(self, size: int, pieces: Callable[[], Iterable[bytes | memoryview]]):
        self.size = size
        self.pieces = pieces

    @classmethod
    def floats(cls, shape: Sequence[int], get: Callable[[], Any]) -> BlobBody:
        """Caffe's Blob<float>::ToProto of the values ``get()`` returns, in ``shape``."""
        shape = tuple(int(d) for d in shape)
        return cls(
            blob_body_size(shape),
            lambda: blob_pieces(np.asarray(get(), dtype="<f4").reshape(shape)),
        )

    @classmethod
    def stored(cls, scan: Scanner, start: int, end: int) -> BlobBody:
        """A BlobProto copied byte for byte from a scanned file."""
        return cls(end - start, lambda: [scan.read(start, end - start)])


def write_net(
    handle: BinaryIO,
    name: str,
    layers: Iterable[tuple[caffe_pb2.LayerParameter, Sequence[BlobBody]]],
) -> None:
    """Stream a NetParameter: ``name``, then each layer with its blobs.

    Only one blob's bytes exist at a time. The output equals ``SerializeToString()`` of the
    same message: fields in number order, ``blobs`` (7) between ``param`` (6) and
    ``propagate_down`` (8).
    """
    raw_name = name.encode("utf-8")
    handle.write(tag(NET_NAME, LEN) + encode_varint(len(raw_name)) + raw_name)
    for param, blobs in layers:
        head, tail = split_at_blobs(param.SerializeToString(deterministic=True))
        frames = [tag(_LAYER_BLOBS, LEN) + encode_varint(blob.size) for blob in blobs]
        total = len(head) + len(tail) + sum(b.size for b in blobs) + sum(map(len, frames))
        handle.write(tag(NET_LAYER, LEN) + encode_varint(total) + head)
        for frame, blob in zip(frames, blobs):
            handle.write(frame)
            written = sum(handle.write(piece) for piece in blob.pieces())
            if written != blob.size:
                raise AssertionError(f"blob body of {written} bytes, {blob.size} announced")
        handle.write(tail)


def split_at_blobs(layer_bytes: bytes) -> tuple[bytes, bytes]:
    """Cut a serialized LayerParameter (without blobs) where field 7 (blobs) belongs."""
    scan = Scanner(io.BytesIO(layer_bytes), len(layer_bytes))
    pos = 0
    for f in scan.fields(0, len(layer_bytes)):
        if f.number > _LAYER_BLOBS:
            break
        pos = f.end
    return layer_bytes[:pos], layer_bytes[pos:]
