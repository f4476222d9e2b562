"""Shapes for `caffe2jax summary` when the whole net cannot be compiled.

A fork net whose layers caffe2jax does not lower yet (SSD's AnnotatedData, PSPNet's BN, ...)
still has a structure worth listing and shapes that can be known: those a data layer's
parameters fix (batch size, crop or resize sizes) and those of every supported layer whose
bottoms are known, inferred one layer at a time as the compiled net would. Everything else is
reported as unknown, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.lowering.registry import Context, lookup

Shape = tuple[int | None, ...]  # None: a dimension only the data knows


def _side(h: int, w: int) -> tuple[int | None, int | None]:
    return (h or None, w or None) if (h and w) else (None, None)


def _channels(layer: ir.Layer, is_color: bool = True) -> int | None:
    t = layer.param.transform_param
    if t.force_gray:
        return 1
    return 3 if t.force_color or is_color else 1


def _annotated_data(layer: ir.Layer) -> list[Shape | None]:
    """SSD's AnnotatedData: images resized to the first resize_param's size; labels are one
    row of 8 per box in the batch (how many: from the data)."""
    p, t = layer.param, layer.param.transform_param
    h, w = (
        _side(t.resize_param[0].height, t.resize_param[0].width)
        if t.resize_param
        else (
            None,
            None,
        )
    )
    if t.crop_size:
        h = w = t.crop_size
    channels = 1 if t.force_gray else (3 if t.force_color else None)
    return [(p.data_param.batch_size or None, channels, h, w), (1, 1, None, 8)]


def _dense_image_data(layer: ir.Layer) -> list[Shape | None]:
    """SegNet/ENet's DenseImageData: (N, C, H, W) images and (N, 1, H, W) label maps, H and W
    from crop_height/crop_width, else new_height/new_width, else the images."""
    p = layer.param.dense_image_data_param
    h, w = _side(p.crop_height, p.crop_width)
    if h is None:
        h, w = _side(p.new_height, p.new_width)
    label = (p.batch_size or None, 1, h, w) if p.label_divide_factor == 1 else None
    return [(p.batch_size or None, 3 if p.is_color else 1, h, w), label]


def _image_seg_data(layer: ir.Layer) -> list[Shape | None]:
    """DeepLab's ImageSegData: crops of transform_param.crop_size, labels (N, 1, H, W)."""
    p, crop = layer.param.image_data_param, layer.param.transform_param.crop_size or None
    return [
        (p.batch_size or None, _channels(layer), crop, crop),
        (p.batch_size or None, 1, crop, crop),
        None,
    ]


def _video_data(layer: ir.Layer) -> list[Shape | None]:
    """C3D's VideoData: clips (N, C, new_length, H, W) and labels."""
    p, crop = layer.param.video_data_param, layer.param.transform_param.crop_size
    h, w = (crop, crop) if crop else _side(p.new_height, p.new_width)
    if layer.form == "ssd":
        return [None, None]
    length = p.new_length or None
    return [(p.batch_size or None, 3 if p.is_color else 1, length, h, w), None]


FORK_DATA = {
    "AnnotatedData": _annotated_data,
    "DenseImageData": _dense_image_data,
    "ImageSegData": _image_seg_data,
    "VideoData": _video_data,
}


def data_shapes(layer: ir.Layer) -> list[Shape | None] | None:
    """What a fork data layer's parameters say of its tops (None: not a fork data layer)."""
    rule = FORK_DATA.get(layer.type)
    if rule is None:
        return None
    shapes = rule(layer) + [None] * len(layer.tops)
    return shapes[: len(layer.tops)]


def _source(layer: ir.Layer, lowering, given: Mapping[str, Sequence[int]]) -> list:
    declared = list(lowering.fn(layer)) + [None] * len(layer.tops)
    return [
        tuple(given[u]) if u in given else (tuple(d) if d is not None else None)
        for u, d in zip(layer.top_names, declared)
    ]


def _eval(layer: ir.Layer, lowering, bottoms: list[tuple[int, ...]], phase: str) -> list:
    blobs = [jax.ShapeDtypeStruct(d.shape, jnp.float32) for d in lowering.declare(layer, bottoms)]
    carry = [jnp.zeros(d.shape, jnp.float32) for d in lowering.declare_carry(layer, bottoms)]

    def run(blobs, bottoms):
        ctx = Context(phase, jax.random.key(0), jnp.float32, layer_name=layer.name)
        ctx.carry = carry
        out = lowering.fn(layer, blobs, bottoms, ctx)
        return out[0] if lowering.stateful or carry else out

    inputs = [jax.ShapeDtypeStruct(s, jnp.float32) for s in bottoms]
    return [tuple(t.shape) for t in jax.eval_shape(run, blobs, inputs)]


def _layer_shapes(layer, shapes, given, phase) -> tuple[list, str]:
    fork = data_shapes(layer)
    if fork is not None:
        return [tuple(given[u]) if u in given else s for u, s in zip(layer.top_names, fork)], ""
    try:
        lowering = lookup(layer)
    except CaffeError as err:
        return [None] * len(layer.tops), str(err).split(": ", 1)[-1]
    if lowering.source:
        return _source(layer, lowering, given), ""
    bottoms = [shapes.get(b) for b in layer.bottoms]
    if any(b is None or None in b for b in bottoms):
        return [None] * len(layer.tops), ""
    try:
        return _eval(layer, lowering, bottoms, phase), ""
    except Exception as err:  # noqa: BLE001 - shown to the user, never hidden
        return [None] * len(layer.tops), str(err).strip().splitlines()[0][:160]


def partial_shapes(
    net: ir.Net, given: Mapping[str, Sequence[int]]
) -> tuple[dict[str, Shape | None], dict[str, str]]:
    """Top shapes by SSA id (a None dim or shape: unknown) and, per layer, why its tops are
    unknown when that is not just unknown bottoms."""
    shapes: dict[str, Shape | None] = {}
    notes: dict[str, str] = {}
    for layer in net.layers:
        tops, note = _layer_shapes(layer, shapes, given, net.phase)
        shapes.update(zip(layer.tops, tops))
        if note:
            notes[layer.name] = note
    return shapes, notes
