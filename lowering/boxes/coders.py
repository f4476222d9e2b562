"""The box coders, in JAX: the regression targets a detection net learns and their inverse.

* SSD (weiliu89's util/bbox_util.cpp ``EncodeBBox`` / ``DecodeBBox``): normalized boxes,
  ``code_type`` CORNER, CENTER_SIZE or CORNER_SIZE, the prior's variances applied unless they
  are encoded in the target; no clipping.
* RefineDet (sfzhang15/RefineDet, bbox_util.cpp ``CasRegDecodeBBoxesAll``): the ODM's
  locations decoded against the priors refined by the ARM's, :func:`refine_and_decode`;
* TextBoxes++ (MhLiao/TextBoxes_plusplus, bbox_util.cpp ``DecodeBBoxPolygon`` /
  ``EncodeBBoxPolygon``): a quadrilateral's 8 offsets from the prior's corners,
  :func:`decode_quads` / :func:`encode_quads`;
* R-CNN (py-faster-rcnn@781a917 lib/fast_rcnn/bbox_transform.py ``bbox_transform`` /
  ``bbox_transform_inv``): pixel boxes, widths and heights ``x2 − x1 + 1``, deltas (dx, dy, dw,
  dh) of the centres and log sizes; the inverse's corners are ``centre ± size/2`` (no −1 on x2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from caffe2jax.frontend import caffe_pb2

CodeType = caffe_pb2.PriorBoxParameter.CodeType


# -- SSD ----------------------------------------------------------------------------------------


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


def decode_boxes(prior, variance, loc, code_type: int, encoded: bool):
    """bbox_util.cpp DecodeBBox (no clipping): priors and variances (P, 4), loc (..., P, 4)."""
    v = jnp.ones_like(variance) if encoded else variance
    t = loc * v
    if code_type == CodeType.CORNER:
        return prior + t
    pw = prior[:, 2] - prior[:, 0]
    ph = prior[:, 3] - prior[:, 1]
    if code_type == CodeType.CORNER_SIZE:
        return prior + t * jnp.stack([pw, ph, pw, ph], axis=-1)
    if code_type != CodeType.CENTER_SIZE:
        raise ValueError(f"unknown code_type {code_type}")
    pcx = (prior[:, 0] + prior[:, 2]) / 2.0
    pcy = (prior[:, 1] + prior[:, 3]) / 2.0
    cx = t[..., 0] * pw + pcx
    cy = t[..., 1] * ph + pcy
    w = jnp.exp(t[..., 2]) * pw
    h = jnp.exp(t[..., 3]) * ph
    return jnp.stack([cx - w / 2.0, cy - h / 2.0, cx + w / 2.0, cy + h / 2.0], axis=-1)


def refine_and_decode(prior, variance, arm_loc, loc, code_type: int, encoded: bool):
    """RefineDet's cascaded decode: each image's priors (P, 4) first decoded with the ARM's
    locations ``arm_loc`` (N, P, 4), then the ODM's ``loc`` (N, L, P, 4) decoded against those
    refined anchors with the priors' variances (DecodeBBoxes twice; neither clipped)."""
    refined = decode_boxes(prior, variance, arm_loc, code_type, encoded)  # (N, P, 4)
    return jax.vmap(lambda r, lo: decode_boxes(r, variance, lo, code_type, encoded))(refined, loc)


def decode_quads(prior, variance, quad):
    """TextBoxes++'s DecodeBBoxPolygon (CENTER_SIZE, variances not in the target): corners
    (x1, y1) … (x4, y4) of ``quad`` (..., P, 8) are offsets from the prior's (xmin, ymin),
    (xmax, ymin), (xmax, ymax), (xmin, ymax), scaled by its width and height and by variances
    0 (x) and 1 (y): x_k = v0 · q_xk · w + corner_xk, in float as the fork."""
    pw = prior[:, 2] - prior[:, 0]
    ph = prior[:, 3] - prior[:, 1]
    cx = jnp.stack([prior[:, 0], prior[:, 2], prior[:, 2], prior[:, 0]], axis=-1)
    cy = jnp.stack([prior[:, 1], prior[:, 1], prior[:, 3], prior[:, 3]], axis=-1)
    x = variance[:, :1] * quad[..., 0::2] * pw[:, None] + cx
    y = variance[:, 1:2] * quad[..., 1::2] * ph[:, None] + cy
    return jnp.stack([x, y], axis=-1).reshape(quad.shape)


def encode_quads(prior, variance, quad):
    """TextBoxes++' EncodeBBoxPolygon (CENTER_SIZE, variances not in the target), the inverse
    of :func:`decode_quads`: ``(x_k − corner_xk) / w / v0`` and ``(y_k − corner_yk) / h / v1``
    for the quadrilateral ``quad`` (..., 8) against the prior's corners (xmin, ymin), (xmax,
    ymin), (xmax, ymax), (xmin, ymax); ``prior`` and ``variance`` (..., 4)."""
    pw = prior[..., 2] - prior[..., 0]
    ph = prior[..., 3] - prior[..., 1]
    cx = jnp.stack([prior[..., 0], prior[..., 2], prior[..., 2], prior[..., 0]], axis=-1)
    cy = jnp.stack([prior[..., 1], prior[..., 1], prior[..., 3], prior[..., 3]], axis=-1)
    x = (quad[..., 0::2] - cx) / pw[..., None] / variance[..., :1]
    y = (quad[..., 1::2] - cy) / ph[..., None] / variance[..., 1:2]
    return jnp.stack([x, y], axis=-1).reshape(quad.shape)


# -- R-CNN --------------------------------------------------------------------------------------


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


def bbox_transform_inv(boxes, deltas):
    """lib/fast_rcnn/bbox_transform.py bbox_transform_inv for (K, 4) boxes and deltas."""
    w = boxes[:, 2] - boxes[:, 0] + 1.0
    h = boxes[:, 3] - boxes[:, 1] + 1.0
    cx = boxes[:, 0] + 0.5 * w
    cy = boxes[:, 1] + 0.5 * h
    pcx = deltas[:, 0] * w + cx
    pcy = deltas[:, 1] * h + cy
    pw = jnp.exp(deltas[:, 2]) * w
    ph = jnp.exp(deltas[:, 3]) * h
    return jnp.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw, pcy + 0.5 * ph], axis=1)
