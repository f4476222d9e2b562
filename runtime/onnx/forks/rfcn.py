"""R-FCN's PSROIPooling in ONNX (Microsoft/caffe psroi_pooling_layer.cu;
lowering/forks/rcnn_roi.py).

ONNX has no position-sensitive pooling; it is built from primitives: per roi, the corners
``round(x)·scale`` and ``(round(x2) + 1)·scale``, the size ``max(x2 − x1, 0.1)``, bin masks
``[floor(p·size/k + start), ceil((p+1)·size/k + start))`` clipped to the map; output channel
``c`` of bin (i, j) averages input channel ``(c·k + i)·k + j`` over its bin (0 when empty).
The sums are two Einsums over the (R, k, H) and (R, k, W) masks, then each roi keeps its own
image's values.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from caffe2jax.runtime.onnx.forks.rcnn import bin_masks, round_half_away
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site


def _masks(site: Site, rois: str, k: int, height: int, width: int) -> tuple[str, str]:
    """(R, k, H) and (R, k, W) float bin masks of every roi (a Loop-free batch of them)."""
    p = site.param.psroi_pooling_param
    g = site.g
    r = round_half_away(g, g.slice(rois, [1], [5], [1]))
    x1, y1, x2, y2 = g.op("Split", [r, g.i64([1, 1, 1, 1])], outputs=4, axis=1)
    scale, one = g.f32(p.spatial_scale), g.f32(1.0)
    x1, y1 = g.op("Mul", [x1, scale]), g.op("Mul", [y1, scale])
    x2 = g.op("Mul", [g.op("Add", [x2, one]), scale])
    y2 = g.op("Mul", [g.op("Add", [y2, one]), scale])
    rw = g.op("Max", [g.op("Sub", [x2, x1]), g.f32(0.1)])
    rh = g.op("Max", [g.op("Sub", [y2, y1]), g.f32(0.1)])
    zero = g.f32(0.0)
    mh = bin_masks(g, zero, rh, k, height, y1)  # (R, k, H)
    mw = bin_masks(g, zero, rw, k, width, x1)
    return g.cast(mh, TensorProto.FLOAT), g.cast(mw, TensorProto.FLOAT)


@register("PSROIPooling")
def psroi_pooling(site: Site) -> list[str]:
    """R-FCN's PSROIPoolingLayer (module docstring)."""
    p = site.param.psroi_pooling_param
    k, dim = p.group_size, p.output_dim
    n, _, height, width = site.bottom_shapes[0]
    g = site.g
    x, rois = site.bottoms
    rois = g.reshape(rois, [-1, 5])
    mh, mw = _masks(site, rois, k, height, width)
    groups = g.reshape(x, [-1, dim, k, k, height, width])
    by_w = g.op("Einsum", [groups, mw], equation="ncijhw,rjw->rncijh")
    total = g.op("Einsum", [by_w, mh], equation="rncijh,rih->rncij")
    area = g.op(
        "Mul",
        [
            g.unsqueeze(g.reduce("ReduceSum", mh, [2], False), [2]),
            g.unsqueeze(g.reduce("ReduceSum", mw, [2], False), [1]),
        ],
    )  # (R, k, k)
    area = g.unsqueeze(area, [1, 2])  # (R, 1, 1, k, k)
    some = g.op("Greater", [area, g.f32(0.0)])
    mean = g.where(some, g.op("Div", [total, g.where(some, area, g.f32(1.0))]), g.f32(0.0))
    batch = g.cast(g.slice(rois, [0], [1], [1]), TensorProto.INT64)  # (R, 1)
    images = g.const(np.arange(n, dtype=np.int64)[None], hint="images")
    if site.bottom_batch[0] is not None:
        site.refuse("PSROIPooling with a dynamic batch")
    onehot = g.cast(g.op("Equal", [batch, images]), TensorProto.FLOAT)  # (R, N)
    return [g.op("Einsum", [mean, onehot], equation="rncij,rn->rcij")]
