"""The channels-last (NHWC) pass: conv/pool/LRN chains run on (N, H, W, C) blobs inside.

Caffe's blobs are (N, C, H, W), and so are caffe2jax's inputs, outputs, every blob ``apply``
returns, params and weight files: this pass changes only the arrays *between* layers inside
one ``Graph.run``. :func:`plan` picks the layers that run channels-last: every 2-D
Convolution (channel axis 1), and the Pooling (MAX/AVE), LRN, ReLU, Concat (axis 1) and
Eltwise layers that read a blob a channels-last layer produced. A blob crosses layouts with one
transpose where an NCHW layer reads an NHWC blob or the reverse, and every NHWC blob left at the
end is transposed back, so callers never see the internal layout. The values are the same up
to float rounding (a convolution's sums run in another order); tests/lowering/test_layout.py
checks the golden nets.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering import pooling
from caffe2jax.lowering.registry import Context, lookup
from caffe2jax.lowering.vision import conv_geometry, convolution_nhwc, lrn_values

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)

NhwcFn = Callable[[ir.Layer, list, list, Context], list]


# Whether nets use the pass unless told otherwise: set from benchmarks/ (docs/performance.md).
CHANNELS_LAST_DEFAULT = True
ENV = "CAFFE2JAX_CHANNELS_LAST"


def default_channels_last() -> bool:
    """The pass's default: ``$CAFFE2JAX_CHANNELS_LAST`` (``0``/``1``) if set, else
    :data:`CHANNELS_LAST_DEFAULT`."""
    value = os.environ.get(ENV, "")
    return CHANNELS_LAST_DEFAULT if value == "" else value not in ("0", "false", "no")


def to_nhwc(x: jax.Array) -> jax.Array:
    return jnp.transpose(x, TO_NHWC)


def to_nchw(x: jax.Array) -> jax.Array:
    return jnp.transpose(x, TO_NCHW)


def _nchw(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The Caffe (NCHW) shape of a channels-last blob's shape."""
    return (shape[0], shape[3], shape[1], shape[2])


def _conv(layer, params, bottoms, ctx):
    return [convolution_nhwc(layer, params, x) for x in bottoms]


def _pool(layer, params, bottoms, ctx):
    (x,) = bottoms
    return [pooling.pool_nhwc(x, pooling.pooling_spec(layer, _nchw(x.shape)), ctx)]


def _lrn(layer, params, bottoms, ctx):
    return [lrn_values(layer.param.lrn_param, bottoms[0], nhwc=True)]


def _concat(layer, params, bottoms, ctx):
    return [jnp.concatenate(bottoms, axis=3)]


def _elementwise(layer, params, bottoms, ctx):
    """ReLU and Eltwise act element by element: their own lowering, in any layout."""
    return lookup(layer).fn(layer, params, bottoms, ctx)


NHWC_FNS: dict[str, NhwcFn] = {
    "Convolution": _conv,
    "Pooling": _pool,
    "LRN": _lrn,
    "ReLU": _elementwise,
    "Concat": _concat,
    "Eltwise": _elementwise,
}


def _eligible(layer: ir.Layer, shapes: list[tuple[int, ...]]) -> bool:
    """Whether ``layer`` has an NHWC form for these (Caffe-layout) bottom shapes."""
    if layer.type not in NHWC_FNS or not shapes or any(len(s) != 4 for s in shapes):
        return False
    if layer.type == "Convolution":
        return conv_geometry(layer, shapes[0]).axis == 1
    if layer.type == "Pooling":
        p = layer.param.pooling_param
        return len(layer.tops) == 1 and p.pool in (p.MAX, p.AVE)
    if layer.type == "Concat":
        p = layer.param.concat_param
        axis = p.axis if not p.HasField("concat_dim") else p.concat_dim
        return axis in (1, -3)
    if layer.type == "Eltwise":
        return all(s == shapes[0] for s in shapes)
    if layer.type == "LRN":
        return layer.param.lrn_param.norm_region in (
            caffe_pb2.LRNParameter.ACROSS_CHANNELS,
            caffe_pb2.LRNParameter.WITHIN_CHANNEL,
        )
    return len(layer.bottoms) == 1  # ReLU


def plan(net: ir.Net) -> frozenset[str]:
    """The layers that run channels-last: Convolutions, and eligible layers reading a blob a
    channels-last layer wrote (so a chain starts at a convolution and no lone pooling or ReLU
    pays for two transposes)."""
    chosen: set[str] = set()
    nhwc_blobs: set[str] = set()
    for layer in net.layers:
        shapes = [tuple(net.shapes.get(b, ())) for b in layer.bottoms]
        starts = layer.type == "Convolution" or any(b in nhwc_blobs for b in layer.bottoms)
        if starts and _eligible(layer, shapes):
            chosen.add(layer.name)
            nhwc_blobs.update(layer.tops)
    return frozenset(chosen)


def restore(env: Mapping[str, jax.Array], nhwc: set[str]) -> dict[str, jax.Array]:
    """``env`` with every channels-last blob transposed back to Caffe's layout."""
    return {name: to_nchw(v) if name in nhwc else v for name, v in env.items()}
