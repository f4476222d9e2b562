"""SSD's box arithmetic for training and evaluation (weiliu89/caffe util/bbox_util.cpp), on
static shapes: pairwise JaccardOverlap, EncodeBBox, and the ground-truth rows of a label blob.

A label blob holds rows [item_id, group_label, instance_id, xmin, ymin, xmax, ymax, difficult].
caffe2jax's AnnotatedData emits a fixed number G of rows per batch: the real rows first, then
padding rows of all −1 (item_id −1), which every reader here skips (the fork's GetGroundTruth
for MultiBoxLoss skips item −1 rows; its DetectionEvaluate variant stops at the first one; the
two agree when the padding comes last).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from caffe2jax.frontend import caffe_pb2
from caffe2jax.lowering import exact

CodeType = caffe_pb2.PriorBoxParameter.CodeType


def jaccard(a: jax.Array, b: jax.Array) -> jax.Array:
    """Pairwise JaccardOverlap (normalized) of (..., P, 4) and (..., G, 4) boxes → (..., P, G).

    As bbox_util.cpp: boxes whose intervals do not touch (strict comparisons) overlap 0, an
    inverted box has area 0, the intersection counts only when its width and height are > 0.
    The three products are rounded to float32 before the sum, as the fork's floats are
    (:func:`caffe2jax.lowering.exact.mul`: under jit XLA would fuse ``s1 + s2 − w·h`` into one
    multiply-add and move an overlap at ``overlap_threshold`` across it).
    """
    ax1, ay1, ax2, ay2 = (a[..., :, None, i] for i in range(4))
    bx1, by1, bx2, by2 = (b[..., None, :, i] for i in range(4))
    disjoint = (bx1 > ax2) | (bx2 < ax1) | (by1 > ay2) | (by2 < ay1)
    iw = jnp.minimum(ax2, bx2) - jnp.maximum(ax1, bx1)
    ih = jnp.minimum(ay2, by2) - jnp.maximum(ay1, by1)
    touching = ~disjoint & (iw > 0) & (ih > 0)
    inter = jnp.where(touching, exact.mul(iw, ih).astype(iw.dtype), 0.0)
    area_a = jnp.where((ax2 < ax1) | (ay2 < ay1), 0.0, _area(ax1, ay1, ax2, ay2))
    area_b = jnp.where((bx2 < bx1) | (by2 < by1), 0.0, _area(bx1, by1, bx2, by2))
    union = jnp.where(touching, area_a + area_b - inter, 1.0)
    return jnp.where(touching, inter / union, 0.0)


def _area(x1, y1, x2, y2) -> jax.Array:
    """BBoxSize of a normalized box, its product rounded to float32 as the fork's."""
    return exact.mul(x2 - x1, y2 - y1).astype(x1.dtype)


def cross_boundary(boxes: jax.Array) -> jax.Array:
    """IsCrossBoundaryBBox: any coordinate outside [0, 1]."""
    return jnp.any((boxes < 0) | (boxes > 1), axis=-1)


def encode_boxes(prior: jax.Array, variance: jax.Array, gt: jax.Array, code_type: int,
                 variance_in_target: bool) -> jax.Array:  # fmt: skip
    """EncodeBBox: the regression target of ``gt`` against ``prior`` (both (..., 4)).

    With ``variance_in_target`` (MultiBoxLoss's ``encode_variance_in_target``) the variances
    are not applied here; the caller divides prediction and target by them afterwards, as
    EncodeLocPrediction does.
    """
    v = jnp.ones_like(variance) if variance_in_target else variance
    if code_type == CodeType.CORNER:
        return (gt - prior) / v
    pw = prior[..., 2] - prior[..., 0]
    ph = prior[..., 3] - prior[..., 1]
    if code_type == CodeType.CORNER_SIZE:
        return (gt - prior) / jnp.stack([pw, ph, pw, ph], axis=-1) / v
    if code_type != CodeType.CENTER_SIZE:
        raise ValueError(f"unknown code_type {code_type}")
    pcx, pcy = (prior[..., 0] + prior[..., 2]) / 2.0, (prior[..., 1] + prior[..., 3]) / 2.0
    gw, gh = gt[..., 2] - gt[..., 0], gt[..., 3] - gt[..., 1]
    gcx, gcy = (gt[..., 0] + gt[..., 2]) / 2.0, (gt[..., 1] + gt[..., 3]) / 2.0
    parts = [(gcx - pcx) / pw, (gcy - pcy) / ph, jnp.log(gw / pw), jnp.log(gh / ph)]
    return jnp.stack(parts, axis=-1) / v


def ground_truth(label: jax.Array) -> dict[str, jax.Array]:
    """The rows of a (…, G, 8) label blob as arrays over G: ``item`` and ``label`` (C-style
    truncated ints), ``boxes`` (G, 4), ``difficult`` (bool) and ``present`` (item ≠ −1)."""
    rows = jax.lax.stop_gradient(label).reshape(-1, 8)
    item = rows[:, 0].astype(jnp.int32)
    return dict(
        item=item,
        label=rows[:, 1].astype(jnp.int32),
        boxes=rows[:, 3:7],
        difficult=rows[:, 7] != 0,
        present=item != -1,
    )
