"""Faster R-CNN's layers in ONNX: ROIPooling (rbgirshick/caffe-fast-rcnn) and py-faster-rcnn's
proposal layer, built in (lowering/forks/rcnn_roi.py, lowering/forks/rcnn_proposal.py).

* ROIPooling: corners ``round(x·spatial_scale)`` (halves away from zero), roi size
  ``max(x2 − x1 + 1, 1)``, bins ``[floor(p·size/pooled), ceil((p+1)·size/pooled))`` shifted by
  the corner and clipped to the map, the max over each bin (0 for an empty bin). onnxruntime's
  MaxRoiPool has the same bins but starts each max from FLT_MIN (the smallest *positive*
  float) where the fork starts from −FLT_MAX, so it is used only on a feature map that cannot
  be negative (written by a ReLU, through pooling and concatenation); elsewhere the bins are
  built from primitives in a Loop over the rois.
* ``rpn.proposal_layer.ProposalLayer`` (py-faster-rcnn, and py-R-FCN's form): anchors at every
  position, ``bbox_transform_inv``, clipped to the image, boxes under ``RPN_MIN_SIZE·scale``
  dropped, the ``RPN_PRE_NMS_TOP_N`` best scores, NonMaxSuppression at ``RPN_NMS_THRESH`` with
  py-faster-rcnn's +1 pixel areas (the boxes passed as ``[x1, y1, x2 + 1, y2 + 1]``), the first
  ``RPN_POST_NMS_TOP_N`` kept; rows ``[0, x1, y1, x2, y2]`` padded with zero rows to
  caffe2jax's static count. Batch 1 only, as the layer.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from caffe2jax.lowering.forks.rcnn_proposal import CONFIG, anchor_settings
from caffe2jax.lowering.forks.rfcn import RFCN_CONFIG
from caffe2jax.runtime.onnx.builder import Builder
from caffe2jax.runtime.onnx.forks.detection_output import ones_like
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site

#: Layers whose top is never negative (ReLU without a negative slope, ReLU6), and layers that
#: keep a bottom's sign (a max or mean of it, copies).
_NONNEGATIVE = {"ReLU", "ReLU6"}
_KEEPS_SIGN = {"Pooling", "Concat", "Split", "Dropout", "Flatten", "Reshape", "Crop"}


def nonnegative(site: Site, ssa: str) -> bool:
    """Whether blob ``ssa`` is ≥ 0 by construction (see :data:`_NONNEGATIVE`)."""
    layer = site.writers.get(ssa)
    if layer is None:
        return False
    if layer.type in _NONNEGATIVE:
        p = layer.param
        return not (p.relu_param.negative_slope or p.relu6_param.negative_slope)
    if layer.type in _KEEPS_SIGN:
        return all(nonnegative(site, b) for b in layer.bottoms)
    return False


def round_half_away(g: Builder, x: str) -> str:
    """C's round(): halves away from zero."""
    floor = g.op("Floor", [g.op("Add", [g.op("Abs", [x]), g.f32(0.5)])])
    return g.op("Mul", [g.op("Sign", [x]), floor])


def bin_masks(g: Builder, start: str, size: str, pooled: int, extent: int, offset: str) -> str:
    """(..., pooled, extent) bool masks of ``[floor(p·size/pooled + offset) + start,
    ceil((p+1)·size/pooled + offset) + start)`` clipped to ``[0, extent)``, for operands of
    shape (..., 1) (one per roi)."""
    p = g.const(np.arange(pooled, dtype=np.float32), hint="bins")
    bin_size = g.op("Div", [size, g.f32(float(pooled))])
    lo = g.op("Floor", [g.op("Add", [g.op("Mul", [p, bin_size]), offset])])
    hi = g.op("Ceil", [g.op("Add", [g.op("Mul", [g.op("Add", [p, g.f32(1.0)]), bin_size]),
                                    offset])])  # fmt: skip
    top = g.f32(float(extent))
    lo = g.op("Clip", [g.op("Add", [lo, start]), g.f32(0.0), top])
    hi = g.op("Clip", [g.op("Add", [hi, start]), g.f32(0.0), top])
    cells = g.const(np.arange(extent, dtype=np.float32)[None], hint="cells")
    return g.op("And", [g.op("GreaterOrEqual", [cells, g.unsqueeze(lo, [-1])]),
                        g.op("Less", [cells, g.unsqueeze(hi, [-1])])])  # fmt: skip


def _masked_max(g: Builder, feat: str, mh: str, mw: str) -> str:
    """Max of (C, H, W) ``feat`` over each (ph, pw) bin; 0 where a bin is empty."""
    neg = g.f32(float("-inf"))
    wide = g.where(g.unsqueeze(mw, [0, 1]), g.unsqueeze(feat, [2]), neg)  # (C, H, pw, W)
    by_w = g.reduce("ReduceMax", wide, [3], keepdims=False)  # (C, H, pw)
    tall = g.where(g.unsqueeze(mh, [0, 3]), g.unsqueeze(by_w, [1]), neg)  # (C, ph, H, pw)
    out = g.reduce("ReduceMax", tall, [2], keepdims=False)
    rows = g.reduce("ReduceMax", g.cast(mh, TensorProto.FLOAT), [1], keepdims=True)
    cols = g.reduce("ReduceMax", g.cast(mw, TensorProto.FLOAT), [1], keepdims=False)
    full = g.op("Greater", [g.op("Mul", [rows, g.unsqueeze(cols, [0])]), g.f32(0.0)])
    return g.where(full, out, g.f32(0.0))


def _roi_pool_loop(site: Site, x: str, rois: str) -> str:
    """ROIPooling from primitives, one roi per Loop iteration."""
    p = site.param.roi_pooling_param
    _, _, height, width = site.bottom_shapes[0]
    g = site.g

    def body(b: Builder, i: str) -> str:
        roi = b.op("Gather", [rois, i], axis=0)
        batch = b.cast(b.slice(roi, [0], [1], [0]), TensorProto.INT64)
        corners = round_half_away(b, b.op("Mul", [b.slice(roi, [1], [5], [0]),
                                                   b.f32(p.spatial_scale)]))  # fmt: skip
        x1, y1, x2, y2 = b.op("Split", [corners, b.i64([1, 1, 1, 1])], outputs=4, axis=0)
        one = b.f32(1.0)
        rh = b.op("Max", [b.op("Add", [b.op("Sub", [y2, y1]), one]), one])
        rw = b.op("Max", [b.op("Add", [b.op("Sub", [x2, x1]), one]), one])
        zero = b.f32(0.0)
        mh = bin_masks(b, y1, rh, p.pooled_h, height, zero)
        mw = bin_masks(b, x1, rw, p.pooled_w, width, zero)
        feat = b.squeeze(b.op("Gather", [x, batch], axis=0), [0])
        return _masked_max(b, feat, mh, mw)

    trips = g.reshape(g.slice(g.op("Shape", [rois]), [0], [1], [0]), [])
    return g.loop(trips, body)


@register("ROIPooling")
def roi_pooling(site: Site) -> list[str]:
    """Faster R-CNN's ROIPoolingLayer (module docstring)."""
    p = site.param.roi_pooling_param
    g = site.g
    x, rois = site.bottoms
    rois = g.reshape(rois, [-1, 5])
    if nonnegative(site, site.layer.bottoms[0]):
        return [g.op("MaxRoiPool", [x, rois], pooled_shape=[p.pooled_h, p.pooled_w],
                     spatial_scale=p.spatial_scale)]  # fmt: skip
    return [_roi_pool_loop(site, x, rois)]


def _anchor_boxes(site: Site, stride: float, anchors: np.ndarray) -> np.ndarray:
    """Every anchor at every position of the score map, (H·W·A, 4) float32, row-major."""
    height, width = site.bottom_shapes[0][-2:]
    sx, sy = np.meshgrid(np.arange(width) * stride, np.arange(height) * stride)
    shifts = np.stack([sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel()], axis=1)
    return (anchors[None] + shifts[:, None]).reshape(-1, 4).astype(np.float32)


def transform_inv(g: Builder, boxes: np.ndarray, deltas: str) -> str:
    """py-faster-rcnn's bbox_transform_inv of constant (K, 4) boxes by (K, 4) deltas."""
    w = (boxes[:, 2] - boxes[:, 0] + np.float32(1.0))[:, None]
    h = (boxes[:, 3] - boxes[:, 1] + np.float32(1.0))[:, None]
    cx = boxes[:, :1] + np.float32(0.5) * w
    cy = boxes[:, 1:2] + np.float32(0.5) * h
    dx, dy, dw, dh = g.op("Split", [deltas, g.i64([1, 1, 1, 1])], outputs=4, axis=1)
    pcx = g.op("Add", [g.op("Mul", [dx, g.const(w)]), g.const(cx)])
    pcy = g.op("Add", [g.op("Mul", [dy, g.const(h)]), g.const(cy)])
    half = g.f32(0.5)
    pw = g.op("Mul", [half, g.op("Mul", [g.op("Exp", [dw]), g.const(w)])])
    ph = g.op("Mul", [half, g.op("Mul", [g.op("Exp", [dh]), g.const(h)])])
    corners = [g.op("Sub", [pcx, pw]), g.op("Sub", [pcy, ph]), g.op("Add", [pcx, pw]),
               g.op("Add", [pcy, ph])]  # fmt: skip
    return g.op("Concat", corners, axis=1)


def _proposal_boxes(site: Site, anchors: np.ndarray, stride: float):
    """(clipped boxes (K·A, 4), foreground scores (K·A,), image info (3,))."""
    g = site.g
    scores, deltas, im_info = site.bottoms
    a = anchors.shape[0]
    fg = g.slice(scores, [a], [2 * a], [1])
    fg = g.reshape(g.op("Transpose", [fg], perm=[0, 2, 3, 1]), [-1])
    d = g.reshape(g.op("Transpose", [deltas], perm=[0, 2, 3, 1]), [-1, 4])
    boxes = transform_inv(g, _anchor_boxes(site, stride, anchors), d)
    info = g.reshape(im_info, [-1])
    height, width = (g.slice(info, [i], [i + 1], [0]) for i in (0, 1))
    one = g.f32(1.0)
    wm, hm = g.op("Sub", [width, one]), g.op("Sub", [height, one])
    hi = g.op("Concat", [wm, hm, wm, hm], axis=0)
    return g.op("Min", [g.op("Max", [boxes, g.f32(0.0)]), hi]), fg, info


def _proposal_settings(site: Site) -> tuple[float, np.ndarray]:
    """``feat_stride`` and the anchors of the param_str (``scales``, ``ratios``, ``base_size``:
    the lowering's reading, lowering/forks/rcnn_proposal.py ``anchor_settings``)."""
    params, anchors = anchor_settings(site.layer)
    return float(params["feat_stride"]), anchors


@register("Python:rpn.proposal_layer.ProposalLayer", form=("", "rfcn"))
def proposal(site: Site) -> list[str]:
    """py-faster-rcnn's ProposalLayer (module docstring)."""
    site.require_builtin()
    site.static_batch("py-faster-rcnn's proposal layer takes one image")
    stride, anchors = _proposal_settings(site)
    pre, post, thresh, min_size = (RFCN_CONFIG if site.layer.form == "rfcn" else CONFIG)[site.phase]
    g = site.g
    boxes, fg, info = _proposal_boxes(site, anchors, stride)
    x1, y1, x2, y2 = g.op("Split", [boxes, g.i64([1, 1, 1, 1])], outputs=4, axis=1)
    one = g.f32(1.0)
    least = g.op("Mul", [g.f32(float(min_size)), g.slice(info, [2], [3], [0])])
    wide = g.op("GreaterOrEqual", [g.op("Add", [g.op("Sub", [x2, x1]), one]), least])
    tall = g.op("GreaterOrEqual", [g.op("Add", [g.op("Sub", [y2, y1]), one]), least])
    valid = g.reshape(g.op("And", [wide, tall]), [-1])
    scores = g.where(valid, fg, g.f32(float("-inf")))
    count = site.bottom_shapes[0][-1] * site.bottom_shapes[0][-2] * anchors.shape[0]
    if pre < count:
        _, best = g.op("TopK", [scores, g.i64([pre])], outputs=2, axis=0)
        chosen = g.op("ScatterElements", [ones_like(g, scores, 0.0), best, ones_like(g, best)],
                      axis=0)  # fmt: skip
        scores = g.where(g.op("Greater", [chosen, g.f32(0.0)]), scores, g.f32(float("-inf")))
    size = min(post, min(pre, count))
    plus = g.op("Add", [boxes, g.const(np.array([0, 0, 1, 1], np.float32))])
    limits = [g.i64([size]), g.f32([thresh]), g.f32([float(np.finfo(np.float32).min)])]
    picked = g.op("NonMaxSuppression", [g.unsqueeze(plus, [0]),
                                        g.reshape(scores, [1, 1, -1]), *limits])  # fmt: skip
    index = g.reshape(g.slice(picked, [2], [3], [1]), [-1])
    rows = g.op("Concat", [ones_like(g, g.slice(boxes, [0], [1], [1]), 0.0), boxes,
                           g.unsqueeze(fg, [1])], axis=1)  # fmt: skip
    found = g.op("Gather", [rows, index], axis=0)
    missing = g.op("Sub", [g.i64([size]), g.op("Shape", [index])])
    pads = g.op("Concat", [g.i64([0, 0]), missing, g.i64([0])], axis=0)
    out = g.op("Pad", [found, pads])
    tops = [g.slice(out, [0], [5], [1]), g.slice(out, [5], [6], [1])]
    return tops[: len(site.tops)]
