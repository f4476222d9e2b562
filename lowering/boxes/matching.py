"""Ground truth and matching on static shapes, in JAX: SSD's label rows and MatchBBox, and the
padded gt rows and random subsets of py-faster-rcnn's target layers.

A label blob of SSD holds rows [item_id, group_label, instance_id, xmin, ymin, xmax, ymax,
difficult]. caffe2jax's AnnotatedData emits a fixed number G of rows per batch: the real rows
first, then padding rows of all −1 (item_id −1), which every reader here skips (the fork's
GetGroundTruth for MultiBoxLoss skips item −1 rows; its DetectionEvaluate variant stops at the
first one; the two agree when the padding comes last).

py-faster-rcnn's built-in layers take gt_boxes as a fixed (G, 5) array [x1, y1, x2, y2, class];
a row with class ≤ 0 is padding and is masked out everywhere (py-faster-rcnn's gt_boxes has only
real rows, each of class ≥ 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.lowering.boxes.iou import SSD, iou

# -- SSD ----------------------------------------------------------------------------------------


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


def cross_boundary(boxes: jax.Array) -> jax.Array:
    """IsCrossBoundaryBBox: any coordinate outside [0, 1]."""
    return jnp.any((boxes < 0) | (boxes > 1), axis=-1)


def _bipartite(overlaps, recorded, match):
    """The bipartite stage: rounds assigning the best remaining (prior, gt) pair, until no
    pair is left (at most G rounds; a while loop, so padding rows cost no rounds)."""
    g = overlaps.shape[1]

    def step(carry):
        match, used, _, k = carry
        cand = recorded & (match == -1)[:, None] & ~used[None, :]
        score = jnp.where(cand, overlaps, -1.0).reshape(-1)
        flat = jnp.argmax(score)
        ok = score[flat] > -1.0
        i, j = flat // g, flat % g
        match = jnp.where(ok, match.at[i].set(j), match)
        used = jnp.where(ok, used.at[j].set(True), used)
        return match, used, ok, k + 1

    def more(carry):
        return carry[2] & (carry[3] < g)

    init = (match, jnp.zeros((g,), bool), jnp.asarray(True), jnp.asarray(0))
    return lax.while_loop(more, step, init)[0]


def match_boxes(boxes, gt_boxes, valid, threshold: float, per_prediction: bool, cross: bool):
    """bbox_util.cpp MatchBBox for one image, the (P, 4) boxes (priors or decoded predictions)
    against the (G, 4) gt boxes ``valid`` marks: (match (P,) gt index, −1 unmatched, −2
    ignored (``cross``: ignore_cross_boundary_bbox); overlap (P,) the best recorded overlap, 0
    if none). Overlaps > 1e-6 are recorded; the bipartite stage repeatedly takes the globally
    best (prior, gt) pair among unmatched priors and unused gts (ties: the lowest prior, then
    the lowest gt, as the C++ loops find them); then with ``per_prediction`` every
    still-unmatched prior takes its best gt (lowest index on ties) with overlap ≥
    ``threshold``."""
    overlaps = iou(boxes, gt_boxes, SSD)
    ignored = cross_boundary(boxes) if cross else jnp.zeros(boxes.shape[:1], bool)
    ignored = ignored & jnp.any(valid)  # MatchBBox returns before marking when no gt
    recorded = (overlaps > 1e-6) & valid[None, :] & ~ignored[:, None]
    match = _bipartite(overlaps, recorded, jnp.where(ignored, -2, -1))
    if per_prediction:
        score = jnp.where(recorded & (overlaps >= threshold), overlaps, -1.0)
        best = jnp.argmax(score, axis=1)
        match = jnp.where((match == -1) & (jnp.max(score, axis=1) > -1.0), best, match)
    overlap = jnp.max(jnp.where(recorded, overlaps, 0.0), axis=1)
    return match, overlap


# -- R-CNN --------------------------------------------------------------------------------------


def gt_valid(gt_boxes: jax.Array) -> jax.Array:
    """The real (unpadded) rows of a (G, 5) gt_boxes array: class ≥ 1."""
    return gt_boxes[:, 4] >= 1


def random_subset(key: jax.Array, member: jax.Array, size: jax.Array) -> jax.Array:
    """A uniformly random subset of ``min(size, Σ member)`` of the True entries of ``member``
    (a boolean mask), as a mask of the same shape.

    The distribution equals numpy's ``npr.choice(inds, size, replace=False)`` (every subset of
    that size equally likely); the draws themselves differ (JAX's key, not numpy's state)."""
    u = jax.random.uniform(key, member.shape)
    prio = jnp.where(member, u, 2.0)  # members first, in random order
    rank = jnp.argsort(jnp.argsort(prio))
    return member & (rank < size)
