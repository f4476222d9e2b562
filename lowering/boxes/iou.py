"""Box overlap (intersection over union), written once for every detection layer, with each
fork's convention as an argument (:class:`Convention`).

The forks measure overlap in slightly different ways, and a detection layer must reproduce its
own fork's to the last bit (an IoU exactly at a threshold keeps or drops a box):

* :data:`SSD` — weiliu89's bbox_util.cpp ``JaccardOverlap(NormalizedBBox, NormalizedBBox)``
  (MultiBoxLoss's matching, DetectionEvaluate): boxes whose intervals do not touch (strict
  comparisons) overlap 0, an inverted box has area 0, the intersection counts only when its
  width and height are > 0.
* :data:`SSD_PIXELS` — the same with ``normalized=false`` (DetectionEvaluate on pixel boxes):
  +1 widths and heights, and boxes that do not touch get the zero intersection box, whose +1
  size is 1 (IoU 1 / (a + b − 1), as the fork computes it); areas are the boxes' cached sizes
  (``sizes``).
* :data:`SSD_NMS` — bbox_util.cpp's ``JaccardOverlap(const Dtype*, const Dtype*)``, the one
  ApplyNMSFast uses (DetectionOutput): no test of the intersection's sides, so two empty boxes
  at one point give 0/0 = NaN, which the NMS comparison treats as a suppression.
* :data:`RCNN` — py-faster-rcnn's lib/utils/bbox.pyx ``bbox_overlaps`` (the target layers):
  +1 pixel widths and heights, 0 where the intersection is empty (``iw ≤ 0`` or ``ih ≤ 0``).
* :data:`RCNN_NMS` — py-faster-rcnn's nms/py_cpu_nms.py (ProposalLayer): +1 sizes,
  ``max(0, iw)·max(0, ih) / (a + b − inter)`` without a test.
* :data:`YOLO` — the YOLO forks' ``box_iou`` on [x, y, w, h] centre boxes: intersection 0 when
  either side is negative, union ``w1·h1 + w2·h2 − intersection``.

Every form computes ``inter / (area_a + area_b − inter)`` in that order of operations, so each
reproduces the expression of the code it comes from. The products (intersection, areas) are
rounded to float32 before the sum, as the forks' floats are (:func:`caffe2jax.lowering.exact.mul`:
under jit XLA would fuse ``a + b − w·h`` into one multiply-add and move an overlap at a
threshold across it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from caffe2jax.lowering import exact


@dataclass(frozen=True)
class Convention:
    """How a fork measures overlap.

    ``plus_one``: pixel boxes, widths and heights ``x2 − x1 + 1`` (else normalized, ``x2 −
    x1``). ``centre``: boxes are [x, y, w, h] centre-size (areas ``w·h``), else corners [x1, y1,
    x2, y2]. ``disjoint``: what boxes that do not touch (strict corner comparisons) overlap —
    ``"overlap"`` no test, ``"zero"`` 0, ``"box"`` SSD's zero intersection box (sides 0, or 1
    with ``plus_one``). ``gated``: the overlap is 0 unless the intersection's width and height
    are > 0; else the intersection is clamped at 0 and divided whatever the union (0/0: NaN).
    ``inverted_empty``: an inverted box (x2 < x1 or y2 < y1) has area 0 (SSD's BBoxSize).
    """

    plus_one: bool = False
    centre: bool = False
    disjoint: str = "overlap"
    gated: bool = True
    inverted_empty: bool = False

    def __post_init__(self):
        if self.disjoint not in ("overlap", "zero", "box"):
            raise ValueError(f"disjoint must be overlap, zero or box, got {self.disjoint!r}")


SSD = Convention(disjoint="zero", inverted_empty=True)
SSD_PIXELS = Convention(plus_one=True, disjoint="box", inverted_empty=True)
SSD_NMS = Convention(disjoint="zero", gated=False, inverted_empty=True)
RCNN = Convention(plus_one=True)
RCNN_NMS = Convention(plus_one=True, gated=False)
YOLO = Convention(centre=True, gated=False)


def _corners(boxes: jax.Array, centre: bool) -> tuple[jax.Array, ...]:
    """x1, y1, x2, y2 of (..., 4) boxes (centre boxes: ``x ∓ w/2``, as the YOLO forks)."""
    if not centre:
        return tuple(boxes[..., i] for i in range(4))
    x, y, w, h = (boxes[..., i] for i in range(4))
    return x - w / 2, y - h / 2, x + w / 2, y + h / 2


def _product(x: jax.Array, y: jax.Array) -> jax.Array:
    """``x·y`` rounded to float32 on its own, as the forks' C++ rounds it (no fused add)."""
    return exact.mul(x, y).astype(x.dtype)


def _area(boxes: jax.Array, corners: tuple[jax.Array, ...], c: Convention) -> jax.Array:
    if c.centre:
        return _product(boxes[..., 2], boxes[..., 3])
    x1, y1, x2, y2 = corners
    if c.plus_one:
        area = _product(x2 - x1 + 1, y2 - y1 + 1)
    else:
        area = _product(x2 - x1, y2 - y1)
    return jnp.where((x2 < x1) | (y2 < y1), 0.0, area) if c.inverted_empty else area


def iou(
    a: jax.Array,
    b: jax.Array,
    convention: Convention = SSD,
    sizes: tuple[jax.Array, jax.Array] | None = None,
) -> jax.Array:
    """Pairwise overlap of (..., P, 4) boxes ``a`` and (..., G, 4) boxes ``b`` → (..., P, G),
    in ``convention`` (module docstring). ``sizes``: the boxes' areas (..., P) and (..., G)
    when the caller holds them (SSD's cached pixel sizes)."""
    c = convention
    ca = _corners(a[..., :, None, :], c.centre)
    cb = _corners(b[..., None, :, :], c.centre)
    (ax1, ay1, ax2, ay2), (bx1, by1, bx2, by2) = ca, cb
    iw = jnp.minimum(ax2, bx2) - jnp.maximum(ax1, bx1)
    ih = jnp.minimum(ay2, by2) - jnp.maximum(ay1, by1)
    if c.plus_one:
        iw, ih = iw + 1, ih + 1
    disjoint = (bx1 > ax2) | (bx2 < ax1) | (by1 > ay2) | (by2 < ay1)
    if c.disjoint == "box":
        side = 1.0 if c.plus_one else 0.0
        iw, ih = jnp.where(disjoint, side, iw), jnp.where(disjoint, side, ih)
    if sizes is None:
        area_a, area_b = _area(a, _corners(a, c.centre), c), _area(b, _corners(b, c.centre), c)
    else:
        area_a, area_b = sizes
    area_a, area_b = area_a[..., :, None], area_b[..., None, :]
    if c.gated:
        ok = (iw > 0) & (ih > 0)
        inter = _product(iw, ih)
        out = jnp.where(ok, inter / jnp.where(ok, area_a + area_b - inter, 1.0), 0.0)
    else:
        inter = jnp.where((iw < 0) | (ih < 0), 0.0, _product(iw, ih))
        out = inter / (area_a + area_b - inter)
    return jnp.where(disjoint, 0.0, out) if c.disjoint == "zero" else out


def iou_row(convention: Convention) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """``row(box, boxes) -> (M,)``: one (4,) box's overlap with (M, 4) boxes in
    ``convention`` (for NMS that computes each row when its candidate comes up)."""

    def row(box: jax.Array, boxes: jax.Array) -> jax.Array:
        return iou(box[None], boxes, convention)[0]

    return row
