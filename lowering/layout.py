"""The channels-last (NHWC) pass: conv/pool/LRN chains run on (N, H, W, C) blobs inside.

Caffe's blobs are (N, C, H, W), and so are caffe2jax's inputs, outputs, every blob ``apply``
returns, params and weight files: this pass changes only the arrays *between* layers inside
one ``Graph.run``. A layer type has a channels-last form when its family file registers one
(``@convolution.nhwc(...)``, lowering/registry.py ``Lowering.nhwc``): today every 2-D
Convolution (channel axis 1), and the Pooling (MAX/AVE), LRN, ReLU, Concat (axis 1), Eltwise,
BatchNorm and Scale (a learned per-channel scale)
layers. :func:`plan` picks the layers that run channels-last: those whose type starts a chain
(Convolution), and eligible layers reading a blob a channels-last layer produced. A blob
crosses layouts with one transpose where an NCHW layer reads an NHWC blob or the reverse, and
every NHWC blob left at the end is transposed back (:func:`transposes`), so callers never see
the internal layout. The values are the same up to float rounding (a convolution's sums run
in another order); tests/lowering/test_layout.py checks the golden nets.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from caffe2jax.frontend import ir
from caffe2jax.lowering.registry import lookup

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)


def to_nhwc(x: jax.Array) -> jax.Array:
    return jnp.transpose(x, TO_NHWC)


def to_nchw(x: jax.Array) -> jax.Array:
    return jnp.transpose(x, TO_NCHW)


def plan(net: ir.Net) -> frozenset[str]:
    """The layers that run channels-last: eligible layers of a type that starts a chain, and
    eligible layers reading a blob a channels-last layer wrote (so a chain starts at a
    convolution and no lone pooling or ReLU pays for two transposes)."""
    chosen: set[str] = set()
    nhwc_blobs: set[str] = set()
    for layer in net.layers:
        lowering = lookup(layer)
        shapes = [tuple(net.shapes.get(b, ())) for b in layer.bottoms]
        starts = lowering.nhwc_starts or any(b in nhwc_blobs for b in layer.bottoms)
        if starts and lowering.has_nhwc(layer, shapes):
            chosen.add(layer.name)
            nhwc_blobs.update(layer.tops)
    return frozenset(chosen)


@dataclass(frozen=True)
class Transposes:
    """The layout work of one run over a range of Caffe layers, decided before it starts.

    ``bottoms[k]``: for step k, per bottom, ``"nhwc"``/``"nchw"`` (transpose it so) or None;
    ``nhwc_tops[k]``: step k's tops held channels-last (a tap added to one is transposed to
    match); ``held``: the blobs channels-last at the end (restored to Caffe's layout)."""

    bottoms: tuple[tuple[str | None, ...], ...]
    nhwc_tops: tuple[frozenset[str], ...]
    held: frozenset[str]


def transposes(
    caffe_layers: Sequence, nhwc_layers: Collection[str], run: Collection[int]
) -> Transposes:
    """The :class:`Transposes` of running the steps ``run`` (indices into ``caffe_layers``,
    in order; a skipped layer's tops come from the caller, in Caffe's layout). A split's tops
    keep its bottom's layout."""
    held: set[str] = set()
    bottoms, tops = [], []
    for k in run:
        caffe = caffe_layers[k]
        if caffe.is_split:
            nhwc = caffe.bottoms[0] in held
            bottoms.append(())
        else:
            nhwc = caffe.key in nhwc_layers
            want = "nhwc" if nhwc else "nchw"
            bottoms.append(tuple(want if (b in held) != nhwc else None for b in caffe.bottoms))
        tops.append(frozenset(caffe.tops) if nhwc else frozenset())
        held.update(tops[-1])
    return Transposes(tuple(bottoms), tuple(tops), frozenset(held))


def convert(x: jax.Array, to: str | None) -> jax.Array:
    """``x`` transposed ``to`` a layout (``"nhwc"``, ``"nchw"``), or unchanged (None)."""
    return x if to is None else to_nhwc(x) if to == "nhwc" else to_nchw(x)


def restore(env: Mapping[str, jax.Array], nhwc: Collection[str]) -> dict[str, jax.Array]:
    """``env`` with every channels-last blob transposed back to Caffe's layout."""
    return {name: to_nchw(v) if name in nhwc else v for name, v in env.items()}
