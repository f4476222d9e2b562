"""Box arithmetic of py-faster-rcnn's target layers, in JAX, and the fixed-shape random subset
both layers draw.

Reproduced from py-faster-rcnn@781a917 lib/utils/bbox.pyx (``bbox_overlaps``) and
lib/fast_rcnn/bbox_transform.py (``bbox_transform``): widths and heights count pixels
(``x2 − x1 + 1``).

Padded ground truth: the built-in layers take gt_boxes as a fixed (G, 5) array
[x1, y1, x2, y2, class]; a row with class ≤ 0 is padding and is masked out everywhere
(py-faster-rcnn's gt_boxes has only real rows, each of class ≥ 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def bbox_overlaps(boxes: jax.Array, query: jax.Array) -> jax.Array:
    """(N, K) IoU of boxes (N, 4) with query boxes (K, 4), +1 pixel widths; 0 where the
    intersection is empty (``iw ≤ 0`` or ``ih ≤ 0``), as utils/bbox.pyx."""
    b = boxes[:, None, :]
    q = query[None, :, :]
    iw = jnp.minimum(b[..., 2], q[..., 2]) - jnp.maximum(b[..., 0], q[..., 0]) + 1
    ih = jnp.minimum(b[..., 3], q[..., 3]) - jnp.maximum(b[..., 1], q[..., 1]) + 1
    area_b = (b[..., 2] - b[..., 0] + 1) * (b[..., 3] - b[..., 1] + 1)
    area_q = (q[..., 2] - q[..., 0] + 1) * (q[..., 3] - q[..., 1] + 1)
    inter = iw * ih
    union = area_b + area_q - inter
    hit = (iw > 0) & (ih > 0)
    return jnp.where(hit, inter / jnp.where(hit, union, 1.0), 0.0)


def bbox_transform(ex: jax.Array, gt: jax.Array) -> jax.Array:
    """py-faster-rcnn's ``bbox_transform``: the (N, 4) deltas (dx, dy, dw, dh) from boxes
    ``ex`` to boxes ``gt``."""
    ew = ex[:, 2] - ex[:, 0] + 1.0
    eh = ex[:, 3] - ex[:, 1] + 1.0
    ecx = ex[:, 0] + 0.5 * ew
    ecy = ex[:, 1] + 0.5 * eh
    gw = gt[:, 2] - gt[:, 0] + 1.0
    gh = gt[:, 3] - gt[:, 1] + 1.0
    gcx = gt[:, 0] + 0.5 * gw
    gcy = gt[:, 1] + 0.5 * gh
    return jnp.stack(
        [(gcx - ecx) / ew, (gcy - ecy) / eh, jnp.log(gw / ew), jnp.log(gh / eh)], axis=1
    )


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
