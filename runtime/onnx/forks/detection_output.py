"""SSD's DetectionOutput in ONNX (weiliu89/caffe detection_output_layer.cpp, bbox_util.cpp;
lowering/forks/ssd_detection_output.py's semantics and its static, padded top).

1. Every prior decoded with ``code_type`` (CORNER, CENTER_SIZE, CORNER_SIZE), the prior's
   variances unless ``variance_encoded_in_target``.
2. Per image and class ≠ background: the scores above ``confidence_threshold`` (all without
   one), cut to the ``nms_param.top_k`` best (TopK: ties to the lower prior index, as the
   fork's stable sort), then NonMaxSuppression (a box is dropped when its IoU with a kept one
   exceeds ``nms_threshold``; ties in score in prior order). With ``share_location: false``
   each (image, class) pair is one NMS batch of its own boxes.
3. ``keep_top_k``: the best scores of each image among the kept (ties to the lower label, then
   the lower prior index).
4. The rows ``[image, label, score, xmin, ymin, xmax, ymax]`` by image, label, then score
   (descending), as (1, 1, K, 7) with caffe2jax's static K (the most that can be kept): the
   rows after the kept ones are −1, and when nothing is kept in the whole batch the first N
   rows are ``[i, −1, …]`` as the fork writes them. Readers take the rows whose label is ≥ 0.

The adaptive NMS (``eta`` < 1 with a threshold above 0.5) has no ONNX form and is refused.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from caffe2jax.lowering.forks.ssd_detection_output import CodeType, detection_settings
from caffe2jax.runtime.onnx.builder import FLT_MAX, Builder
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site

NEG_INF = float("-inf")


def decode(g: Builder, prior: str, variance: str, loc: str, code: int, encoded: bool) -> str:
    """DecodeBBox of (N, L, P, 4) ``loc`` against (P, 4) priors and variances."""
    t = loc if encoded else g.op("Mul", [loc, variance])
    if code == CodeType.CORNER:
        return g.op("Add", [prior, t])
    x0, y0, x1, y1 = g.op("Split", [prior, g.i64([1, 1, 1, 1])], outputs=4, axis=1)
    pw, ph = g.op("Sub", [x1, x0]), g.op("Sub", [y1, y0])
    if code == CodeType.CORNER_SIZE:
        return g.op("Add", [prior, g.op("Mul", [t, g.op("Concat", [pw, ph, pw, ph], axis=1)])])
    half = g.f32(2.0)
    pcx = g.op("Div", [g.op("Add", [x0, x1]), half])
    pcy = g.op("Div", [g.op("Add", [y0, y1]), half])
    t0, t1, t2, t3 = g.op("Split", [t, g.i64([1, 1, 1, 1])], outputs=4, axis=-1)
    cx = g.op("Add", [g.op("Mul", [t0, pw]), pcx])
    cy = g.op("Add", [g.op("Mul", [t1, ph]), pcy])
    hw = g.op("Div", [g.op("Mul", [g.op("Exp", [t2]), pw]), half])
    hh = g.op("Div", [g.op("Mul", [g.op("Exp", [t3]), ph]), half])
    corners = [g.op("Sub", [cx, hw]), g.op("Sub", [cy, hh]), g.op("Add", [cx, hw]),
               g.op("Add", [cy, hh])]  # fmt: skip
    return g.op("Concat", corners, axis=-1)


def ones_like(g: Builder, x: str, value: float = 1.0) -> str:
    """A float tensor of ``x``'s shape filled with ``value``."""
    fill = helper.make_tensor("value", TensorProto.FLOAT, [1], [value])
    return g.op("ConstantOfShape", [g.op("Shape", [x])], value=fill)


def top_mask(g: Builder, scores: str, k: int, axis: int) -> str:
    """1.0 where an entry is among the ``k`` largest along ``axis`` (ties: lower index)."""
    _, index = g.op("TopK", [scores, g.i64([k])], outputs=2, axis=axis)
    return g.op("ScatterElements", [ones_like(g, scores, 0.0), index, ones_like(g, index)],
                axis=axis)  # fmt: skip


def masked(g: Builder, flags: str, scores: str) -> str:
    """``scores`` where ``flags`` (float 0/1) is set, −inf elsewhere."""
    return g.where(g.op("Greater", [flags, g.f32(0.0)]), scores, g.f32(NEG_INF))


def candidates(site: Site, scores: str, s: dict, priors: int) -> str:
    """(N, C, P) scores with −inf where a prior is not a candidate: at or below the
    threshold, the background class, or past the class's top_k."""
    g = site.g
    ok = np.ones((1, s["classes"], 1), bool)
    if 0 <= s["background"] < s["classes"]:
        ok[0, s["background"]] = False
    valid = g.const(ok, hint="classes")
    if s["threshold"] is not None:
        valid = g.op("And", [valid, g.op("Greater", [scores, g.f32(s["threshold"])])])
    out = g.where(valid, scores, g.f32(NEG_INF))
    if s["top_k"] < priors:
        out = masked(g, top_mask(g, out, s["top_k"], 2), out)
    return out


def flatten_degenerate(g: Builder, boxes: str) -> str:
    """Boxes with xmax < xmin or ymax < ymin as empty points far from everything: the fork
    gives them no area (JaccardOverlap 0 with any other box), NonMaxSuppression would measure
    their extent. (Two such boxes that touch suppress each other in the fork, NaN overlap;
    not here.)"""
    x0, y0, x1, y1 = g.op("Split", [boxes, g.i64([1, 1, 1, 1])], outputs=4, axis=-1)
    bad = g.op("Or", [g.op("Less", [x1, x0]), g.op("Less", [y1, y0])])
    return g.where(bad, g.f32(1e30), boxes)


def suppress(site: Site, boxes: str, scores: str, s: dict, priors: int) -> str:
    """(N, C, P) float flags of the boxes NonMaxSuppression keeps."""
    g = site.g
    c = s["classes"]
    boxes = flatten_degenerate(g, boxes)
    limits = [g.i64([s["top_k"]]), g.f32([s["nms"]]), g.f32([-FLT_MAX])]
    if s["shared"]:
        flat = g.reshape(boxes, [-1, priors, 4])
        chosen = g.op("NonMaxSuppression", [flat, scores, *limits])
    else:
        flat = g.reshape(boxes, [-1, priors, 4])
        picked = g.op("NonMaxSuppression", [flat, g.reshape(scores, [-1, 1, priors]), *limits])
        pair, _, prior = g.op("Split", [picked, g.i64([1, 1, 1])], outputs=3, axis=1)
        image = g.op("Div", [pair, g.i64(c)])
        label = g.op("Mod", [pair, g.i64(c)])
        chosen = g.op("Concat", [image, label, prior], axis=1)
    ones = g.op("ConstantOfShape", [g.slice(g.op("Shape", [chosen]), [0], [1], [0])],
                value=helper.make_tensor("value", TensorProto.FLOAT, [1], [1.0]))  # fmt: skip
    return g.op("ScatterND", [ones_like(g, scores, 0.0), chosen, ones])


def keep_best(site: Site, kept: str, scores: str, s: dict, priors: int) -> str:
    """``kept`` limited to the ``keep_top_k`` best scores of each image."""
    k, c = s["keep_top_k"], s["classes"]
    if not -1 < k < c * priors:
        return kept
    g = site.g
    flat = g.reshape(masked(g, kept, scores), [-1, c * priors])
    if k == 0:
        return ones_like(g, kept, 0.0)
    best = g.reshape(top_mask(g, flat, k, 1), [-1, c, priors])
    return g.op("Mul", [kept, best])


def rows(site: Site, kept: str, scores: str, boxes: str, s: dict, size) -> str:
    """The (1, 1, size, 7) top from the (N, C, P) kept flags, scores and (N, L, P, 4) boxes."""
    g = site.g
    c, m = s["classes"], s["top_k"]
    values, index = g.op("TopK", [masked(g, kept, scores), g.i64([m])], outputs=2, axis=2)
    flags = g.op("GatherElements", [kept, index], axis=2)
    if s["shared"]:
        boxes = g.op("Expand", [boxes, g.i64([1, c, 1, 1])])
    index4 = g.op("Expand", [g.unsqueeze(index, [3]), g.i64([1, 1, 1, 4])])
    picked = g.op("GatherElements", [boxes, index4], axis=2)
    ones = g.unsqueeze(ones_like(g, values), [3])
    n = g.reshape(g.slice(g.op("Shape", [scores]), [0], [1], [0]), [])
    image = g.reshape(g.cast(g.op("Range", [g.i64(0), n, g.i64(1)]), 1), [-1, 1, 1, 1])
    label = g.const(np.arange(c, dtype=np.float32).reshape(1, c, 1, 1), hint="labels")
    parts = [g.op("Mul", [ones, image]), g.op("Mul", [ones, label]), g.unsqueeze(values, [3]),
             picked]  # fmt: skip
    table = g.reshape(g.op("Concat", parts, axis=3), [-1, 7])
    chosen = g.reshape(g.op("NonZero", [g.reshape(flags, [-1])]), [-1])
    found = g.op("Gather", [table, chosen], axis=0)
    count = g.op("Shape", [chosen])
    pads = g.op("Concat", [g.i64([0, 0]), g.op("Sub", [size, count]), g.i64([0])], axis=0)
    out = g.op("Pad", [found, pads, g.f32(-1.0)])
    return g.reshape(no_detection(g, out, count, size, n), [1, 1, -1, 7])


def no_detection(g: Builder, out: str, count: str, size: str, n: str) -> str:
    """With nothing kept in the whole batch, the first N rows are ``[i, −1, …]``."""
    where = g.cast(g.op("Range", [g.i64(0), g.reshape(size, []), g.i64(1)]), 1)
    none = g.op("Equal", [count, g.i64([0])])
    first = g.op("And", [none, g.op("Less", [where, g.cast(n, 1)])])
    column, rest = g.op("Split", [out, g.i64([1, 6])], outputs=2, axis=1)
    column = g.where(first, where, g.reshape(column, [-1]))
    return g.op("Concat", [g.unsqueeze(column, [1]), rest], axis=1)


def _size(site: Site, s: dict, n: int):
    """caffe2jax's static row count: N·(the most one image can keep), at least N."""
    targets = s["classes"] - (0 <= s["background"] < s["classes"])
    per_image = max(targets, 1) * s["top_k"]
    if s["keep_top_k"] > -1:
        per_image = min(per_image, s["keep_top_k"])
    if site.bottom_batch[0] is None:
        return site.g.i64([max(n * per_image, n)])
    return site.g.shape_tensor([0], 0, max(per_image, 1))


@register("DetectionOutput")
def detection_output(site: Site) -> list[str]:
    """SSD's DetectionOutputLayer (module docstring)."""
    g = site.g
    loc_shape, conf_shape, prior_shape = site.bottom_shapes
    priors = prior_shape[-1] // 4
    s = detection_settings(site.layer, max(priors, 1))
    if s["eta"] < 1 and s["nms"] > 0.5:
        site.refuse("adaptive NMS (eta < 1) has no ONNX form")
    if not (site.batch_at(0) and site.batch_at(1)):
        site.refuse("loc and conf must have their batch on axis 0")
    loc, conf, prior = site.bottoms
    lc = 1 if s["shared"] else s["classes"]
    pv = g.reshape(prior, [-1, 2, priors, 4])
    prior_xy = g.squeeze(g.slice(pv, [0, 0], [1, 1], [0, 1]), [0, 1])
    variance = g.squeeze(g.slice(pv, [0, 1], [1, 2], [0, 1]), [0, 1])
    loc4 = g.op("Transpose", [g.reshape(loc, [-1, priors, lc, 4])], perm=[0, 2, 1, 3])
    boxes = decode(g, prior_xy, variance, loc4, s["code"], s["encoded"])
    conf3 = g.reshape(conf, [-1, priors, s["classes"]])
    scores = g.op("Transpose", [conf3], perm=[0, 2, 1])
    cand = candidates(site, scores, s, priors)
    kept = suppress(site, boxes, cand, s, priors)
    kept = keep_best(site, kept, scores, s, priors)
    return [rows(site, kept, scores, boxes, s, _size(site, s, loc_shape[0]))]
