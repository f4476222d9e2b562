"""Greedy non-maximum suppression with static shapes, as the detection forks compute it.

Detection layers keep a data-dependent number of boxes; a compiled program cannot. The helpers
here work on fixed-size candidate lists with a validity mask and return masks and padded
compactions, never a shape that depends on the data:

* :func:`ranked` — the candidates above a threshold, sorted by score descending with ties in
  index order (std::stable_sort, as SSD's GetMaxScoreIndex), cut to ``top_k``;
* :func:`greedy_keep` — SSD's ApplyNMSFast on a ranked list: a candidate is kept when its
  IoU with every kept one is ≤ the threshold (adaptive with ``eta`` as SSD: after each keep,
  if eta < 1 and threshold > 0.5, threshold *= eta); :func:`greedy_keep_rows` the same
  (or ≥-suppression, the YOLO forks') a block of IoU rows at a time, for long lists
  (py-faster-rcnn's nms with ``iou_row(RCNN_NMS)``);
* :func:`compact` — the rows flagged kept moved to the front in order, the rest padding.

The overlaps come from :mod:`caffe2jax.lowering.boxes.iou`, in the caller's fork's convention.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def ranked(scores: jax.Array, valid: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
    """(indices, valid) of the ``top_k`` best valid scores of the last axis, descending, ties
    by index (a stable sort); slots past the valid ones are flagged invalid."""
    key = jnp.where(valid, -scores, jnp.inf)
    order = jnp.argsort(key, axis=-1, stable=True)[..., :top_k]
    return order, jnp.take_along_axis(valid, order, axis=-1)


def greedy_keep(iou: jax.Array, valid: jax.Array, threshold: float, eta: float = 1.0):
    """Keep flags (..., M) of greedy NMS over candidates already in rank order.

    ``iou`` is (..., M, M); ``valid`` (..., M). NaN overlaps (two empty boxes) are not ≤ the
    threshold, so they suppress, as the C++ comparison does."""
    m = valid.shape[-1]
    thr0 = jnp.full(valid.shape[:-1], threshold, iou.dtype)

    def step(i, carry):
        keep, thr = carry
        row = lax.dynamic_index_in_dim(iou, i, axis=-2, keepdims=False)
        ok = jnp.all(jnp.where(keep, row <= thr[..., None], True), axis=-1)
        k = lax.dynamic_index_in_dim(valid, i, axis=-1, keepdims=False) & ok
        keep = keep.at[..., i].set(k)
        if eta < 1.0:
            thr = jnp.where(k & (thr > 0.5), thr * eta, thr)
        return keep, thr

    keep, _ = lax.fori_loop(0, m, step, (jnp.zeros_like(valid), thr0))
    return keep


def compact(rows: jax.Array, keep: jax.Array, size: int, fill: jax.Array) -> jax.Array:
    """(size, D): the rows of (R, D) ``rows`` flagged in ``keep`` in order, then ``fill`` rows
    (kept rows past ``size`` are dropped)."""
    pos = jnp.cumsum(keep) - 1
    target = jnp.where(keep & (pos < size), pos, size)
    out = jnp.broadcast_to(fill, (size + 1, rows.shape[-1])).astype(rows.dtype)
    return out.at[target].set(rows, mode="drop")[:size]


def greedy_keep_rows(boxes, valid, threshold: float, iou_row, strict: bool = False,
                     block: int = 128, limit: int | None = None):  # fmt: skip
    """Greedy NMS as :func:`greedy_keep`, for long candidate lists (O(block·M) memory; the
    overlaps come from ``iou_row(box, boxes) -> (M,)``, the candidate's box first). ``strict``:
    a candidate is suppressed when IoU ≥ threshold (the YOLO forks' ApplyNms; a NaN IoU then
    suppresses nothing), else when IoU > threshold (a NaN IoU suppresses).

    The same keep flags as one candidate at a time, computed ``block`` candidates at a time:
    a block's candidates suppressed by the kept ones of earlier blocks (one (block, M) overlap
    matrix), then the greedy pass inside the block as its unique fixed point (see
    :func:`_greedy_in_block`), so the sequential steps are a few per block, not one per box.
    ``limit``: stop after the block where ``limit`` candidates are kept (the flags after it stay
    False): for a caller that keeps only the first ``limit`` (py-faster-rcnn's post-NMS top N
    through :func:`compact`), the same result."""
    m = valid.shape[-1]
    size = max(1, min(block, m))
    blocks = -(-m // size)
    pad = blocks * size - m
    boxes = jnp.pad(boxes, ((0, pad), (0, 0)))
    valid = jnp.pad(valid, (0, pad))
    rows = jax.vmap(iou_row, (0, None))

    def step(state):
        b, keep = state
        start = b * size
        ov = rows(lax.dynamic_slice_in_dim(boxes, start, size), boxes)  # (size, M)
        hit = (ov >= threshold) if strict else ~(ov <= threshold)
        cand = lax.dynamic_slice_in_dim(valid, start, size) & ~jnp.any(hit & keep, axis=1)
        inside = lax.dynamic_slice_in_dim(hit, start, size, axis=1)
        kept = _greedy_in_block(cand, inside & jnp.tri(size, k=-1, dtype=bool))
        return b + 1, lax.dynamic_update_slice_in_dim(keep, kept, start, 0)

    def more(state):
        b, keep = state
        return (b < blocks) if limit is None else (b < blocks) & (jnp.sum(keep) < limit)

    return lax.while_loop(more, step, (0, jnp.zeros_like(valid)))[1][:m]


def _greedy_in_block(cand: jax.Array, earlier_hit: jax.Array) -> jax.Array:
    """The greedy pass over one block: ``kept[i] = cand[i] & ~any(kept[j] & earlier_hit[i, j])``
    (``earlier_hit`` is zero on and above the diagonal). Its solution is unique (row i depends
    on rows < i only) and iterating the equation from ``cand`` reaches it: after t rounds rows
    < t are final, so the loop stops at the fixed point after at most ``size`` rounds — in
    practice as many as the longest chain of suppressions inside the block."""

    def round_(state):
        kept, _ = state
        new = cand & ~jnp.any(earlier_hit & kept[None, :], axis=1)
        return new, jnp.any(new != kept)

    return lax.while_loop(lambda s: s[1], round_, (cand, jnp.asarray(True)))[0]
