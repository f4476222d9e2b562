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


def ground_truth(label: jax.Array, width: int = 8) -> dict[str, jax.Array]:
    """The rows of a (…, G, ``width``) label blob as arrays over G: ``item`` and ``label``
    (C-style truncated ints), ``boxes`` (G, 4), ``difficult`` (bool) and ``present`` (item ≠
    −1); with ``width`` 16 (TextBoxes++' polygon rows) also ``quads`` (G, 8): x1, y1, …, y4."""
    rows = jax.lax.stop_gradient(label).reshape(-1, width)
    item = rows[:, 0].astype(jnp.int32)
    out = dict(
        item=item,
        label=rows[:, 1].astype(jnp.int32),
        boxes=rows[:, 3:7],
        difficult=rows[:, 7] != 0,
        present=item != -1,
    )
    if width >= 16:
        out["quads"] = rows[:, 8:16]
    return out


def cross_boundary(boxes: jax.Array) -> jax.Array:
    """IsCrossBoundaryBBox: any coordinate outside [0, 1]."""
    return jnp.any((boxes < 0) | (boxes > 1), axis=-1)


def _segment_best(score, segments, n: int):
    """Per segment (image) and column (prior): the best ``score`` over the rows (gts) of that
    segment and the lowest row reaching it ((n, P) each; −1 and the row count where none)."""
    rows = score.shape[0]
    best = jax.ops.segment_max(score, segments, num_segments=n + 1)[:n]
    best = jnp.maximum(best, -1.0)  # an image without rows: segment_max's −inf
    index = lax.broadcasted_iota(jnp.int32, score.shape, 0)
    at = jnp.where(score == best[jnp.minimum(segments, n - 1)], index, rows)
    return best, jax.ops.segment_min(at, segments, num_segments=n + 1)[:n]


def bipartite(overlaps, recorded, match, segments):
    """The bipartite stage for every image at once: ``overlaps`` and ``recorded`` are (G, P)
    (gt row × its own image's priors), ``match`` (N, P), ``segments`` (G,) each row's image (N
    for padding). The fork's rounds take the globally best (prior, gt) pair of an image among
    its unmatched priors and unused gts (ties: lowest prior, then lowest gt). Each round here
    takes every pair that is the best of its gt's row and of its prior's column at once: such a
    pair outranks every pair it excludes, so the fork's rounds take it too, in the same
    result; the image's best pair is always one, so the rounds end (few for real boxes: the
    cost is ~linear in boxes × priors, the fork's loop is quadratic in the boxes). Returns
    (match, the number of rounds run)."""
    n, g = match.shape[0], overlaps.shape[0]
    image = jnp.minimum(segments, n - 1)

    def step(carry):
        match, used, _, rounds = carry
        cand = recorded & ~used[:, None] & (match[image] == -1)
        score = jnp.where(cand, overlaps, -1.0)
        prior = jnp.argmax(score, axis=1)  # each gt's best prior, lowest on ties
        ok = jnp.take_along_axis(score, prior[:, None], 1)[:, 0] > -1.0
        _, best_gt = _segment_best(score, segments, n)
        mutual = ok & (best_gt[image, prior] == jnp.arange(g))
        target = jnp.where(mutual, image, n)  # rows not taken write out of bounds: dropped
        match = match.at[target, prior].set(jnp.arange(g, dtype=match.dtype), mode="drop")
        return match, used | mutual, jnp.any(mutual), rounds + 1

    init = (match, jnp.zeros((g,), bool), jnp.asarray(True), jnp.asarray(0))
    match, _, _, rounds = lax.while_loop(lambda c: c[2], step, init)
    return match, rounds


def match_batch(overlaps, gt_item, valid, n: int, threshold: float, per_prediction: bool,
                ignored=None):  # fmt: skip
    """bbox_util.cpp MatchBBox for the N images of a batch at once. ``overlaps`` (G, P): each
    gt row against its own image's P boxes (priors or decoded predictions); ``gt_item`` (G,)
    the row's image in [0, N), ``valid`` (G,) the rows matched, ``ignored`` (N, P) or None the
    priors marked ignored (ignore_cross_boundary_bbox). Returns (match (N, P): the gt row, −1
    unmatched, −2 ignored; overlap (N, P): the best recorded overlap, 0 if none). Overlaps >
    1e-6 are recorded; the bipartite stage (:func:`bipartite`); then with ``per_prediction``
    every still-unmatched prior takes its best gt (lowest index on ties) with overlap ≥
    ``threshold``. Work and memory are (G, P), not (N, P, G)."""
    segments = jnp.where(valid, gt_item, n)
    recorded = (overlaps > 1e-6) & valid[:, None]
    start = jnp.full((n, overlaps.shape[1]), -1, jnp.int32)
    if ignored is not None:
        has_gt = jnp.zeros((n + 1,), bool).at[segments].set(True)[:n]
        ignored = ignored & has_gt[:, None]  # MatchBBox returns before marking when no gt
        recorded = recorded & ~ignored[jnp.minimum(segments, n - 1)]
        start = jnp.where(ignored, -2, start)
    match, _ = bipartite(overlaps, recorded, start, segments)
    if per_prediction:
        best, row = _segment_best(jnp.where(recorded & (overlaps >= threshold), overlaps, -1.0),
                                  segments, n)  # fmt: skip
        match = jnp.where((match == -1) & (best > -1.0), row, match)
    overlap = jax.ops.segment_max(jnp.where(recorded, overlaps, 0.0), segments, num_segments=n + 1)
    return match, jnp.maximum(overlap[:n], 0.0)


def match_boxes(boxes, gt_boxes, valid, threshold: float, per_prediction: bool, cross: bool):
    """MatchBBox for one image: the (P, 4) ``boxes`` against the (G, 4) gt boxes ``valid``
    marks (:func:`match_batch` with N = 1; ``cross``: ignore_cross_boundary_bbox)."""
    overlaps = iou(boxes, gt_boxes, SSD).T
    ignored = cross_boundary(boxes)[None] if cross else None
    item = jnp.zeros(valid.shape, jnp.int32)
    match, overlap = match_batch(overlaps, item, valid, 1, threshold, per_prediction, ignored)
    return match[0], overlap[0]


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
