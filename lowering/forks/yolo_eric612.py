"""eric612/MobileNet-YOLO's RegionLoss (eric612/MobileNet-YOLO@69b4441
src/caffe/layers/region_loss_layer.cpp; form ``eric612``), and RegionLoss whose prototxt does
not say which YOLOv2 port it is written for (form ``""``): the label decides.

Both ports declare the same RegionLossParameter (fields 1–18, the same defaults); they differ
in the loss and in the label: gklz1982's reads 30 truths of (class, x, y, w, h) per image
(lowering/forks/yolov2.py), eric612's 300 (its AnnotatedData with ``yolo_data_type: 1`` writes
(N, 1, 300, 5)). So a RegionLoss of form ``""`` runs gklz1982's loss on a label of 150 values
per image and eric612's on one of 1500; any other size is refused naming both.

eric612's Forward_cpu (bottom (N, num·(5+K), H, W) read in place, channel n·(5+K) + k of cell
s = row·side + column — the same assignment as gklz1982's ``swap`` blob; side = the bottom's
width, ``side`` unused):

* every cell and anchor: objectness σ(to); best = the largest darknet ``box_iou`` (centre boxes,
  union w1·h1 + w2·h2 − inter; boxes.iou YOLO) of its box with the image's truths read until
  x = 0; delta_obj = −noobject_scale·(0 − σ)·σ(1 − σ), 0 where best > ``thresh``. No pull
  towards the anchor's prior (commented out in the fork).
* then each truth (read until w = 0) in cell (int(x·side), int(y·side)): the anchor whose shape
  (``bias_match``: the anchor's, else the predicted w, h) overlaps the truth's best, strictly
  (**none > 0: the fork keeps index 0, the batch's first image, cell 0, anchor 0**, reproduced);
  coordinate deltas as delta_region_box with scale ``coord_scale`` (``rescore``) or
  coord_scale·(2 − w·h) (not); objectness −object_scale·(iou − σ)·σ(1 − σ) (``rescore``: iou of
  the predicted box and the truth) or −object_scale·(1 − σ)·σ(1 − σ); classes −class_scale·
  (onehot − softmax).
* loss Σ delta² / N; **Backward_cpu: bottom diff = top_diff / N · delta**, the fork's rule and
  not the gradient of its loss (custom_vjp below).

A truth at x ≥ 1 in the last row (y ≥ 1) makes the fork read past the cell grid; the cell is
clamped to the last one here. Biases fewer than 10 are replaced by zeros in the fork (an
infinite loss): refused, as are fewer than 2·num, coords ≠ 4 and H ≠ W.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.lowering import exact
from caffe2jax.lowering.boxes.iou import YOLO, iou
from caffe2jax.lowering.forks.yolov2 import (
    anchor_biases,
    box_delta,
    region_boxes,
    swap_blob,
    yolov2_region_loss,
)
from caffe2jax.lowering.registry import Context, ParamDecl, register
from caffe2jax.lowering.util import fail

MAX_TRUTHS = 300
GKLZ_TRUTHS = 30


def _activated(g: jax.Array, classes: int) -> jax.Array:
    """The fork's swap_data: coordinates raw, objectness σ, classes softmax."""
    s = g.at[..., 4].set(jax.nn.sigmoid(g[..., 4]))
    return s.at[..., 5 : 5 + classes].set(jax.nn.softmax(g[..., 5 : 5 + classes], axis=-1))


def _noobj(s, boxes, truths, p) -> jax.Array:
    """The first pass of one image: (S, num, len) delta holding the objectness deltas."""
    valid = jnp.cumprod(truths[:, 0] != 0).astype(bool)  # `if (!x) break`
    ious = iou(boxes.reshape(-1, 4), truths, YOLO)
    best = jnp.max(jnp.where(valid[None, :] & (ious > 0), ious, 0.0), axis=1)
    obj = s[..., 4]
    d_obj = -1 * p.noobject_scale * (0 - obj) * obj * (1 - obj)
    d_obj = jnp.where(best.reshape(obj.shape) > p.thresh, 0.0, d_obj)
    return jnp.zeros_like(s).at[..., 4].set(d_obj)


def _best_anchor(g_cell, truth, biases, p):
    """The anchor whose shape overlaps the truth's best (strictly > the best so far, from 0),
    and whether any overlapped at all."""
    side = p.side_
    if p.bias_match:
        shapes = biases / side
    else:
        shapes = jnp.exp(g_cell[:, 2:4]) * biases / side
    anchors = jnp.concatenate([jnp.zeros_like(shapes), shapes], 1)
    shift = jnp.concatenate([jnp.zeros(2, truth.dtype), truth[2:]])[None]
    ious = iou(anchors, shift, YOLO)[:, 0]
    hit = ious > 0
    return jnp.argmax(jnp.where(hit, ious, 0.0)), jnp.any(hit)


def _truth_row(s_row, g_row, truth, cls, bias, i, j, p, classes):
    """delta_region_box, the objectness and delta_region_class of the chosen anchor: its row."""
    side = p.side_
    area = exact.mul(truth[2], truth[3])
    scale = p.coord_scale if p.rescore else p.coord_scale * (2 - area)
    d_box = box_delta(truth, s_row, bias, i, j, side, scale)
    pred = jnp.stack([(i + jax.nn.sigmoid(g_row[0])) / side,
                      (j + jax.nn.sigmoid(g_row[1])) / side,
                      jnp.exp(g_row[2]) * bias[0] / side,
                      jnp.exp(g_row[3]) * bias[1] / side])  # fmt: skip
    obj = s_row[4]
    target = iou(pred[None], truth[None], YOLO)[0, 0] if p.rescore else 1.0
    d_obj = -1.0 * p.object_scale * (target - obj) * (obj * (1 - obj))
    onehot = (jnp.arange(classes) == cls).astype(s_row.dtype)
    d_cls = -1.0 * p.class_scale * (onehot - s_row[5 : 5 + classes])
    return jnp.concatenate([d_box, d_obj[None], d_cls])


def region_delta(g, label, biases, p) -> jax.Array:
    """The fork's diff_ of the batch: g (N, S, num, len) raw, label (N, 300, 5)."""
    cells = g.shape[1]
    classes, side = p.num_class, p.side_
    s = _activated(g, classes)
    boxes = region_boxes(g, biases, side)
    delta = jax.vmap(lambda ss, bb, tt: _noobj(ss, bb, tt[:, 1:], p))(s, boxes, label)
    counts = jnp.sum(jnp.cumprod(label[:, :, 3] != 0, axis=1), axis=1)  # `if (!w) break`
    ends = jnp.cumsum(counts)

    def step(k, d):
        """The k-th truth read, over the batch's images in order (only those read)."""
        b = jnp.searchsorted(ends, k, side="right")
        t = k - (ends[b] - counts[b])
        truth, cls = label[b, t, 1:], label[b, t, 0].astype(jnp.int32)
        i = (truth[0] * side).astype(jnp.int32)
        j = (truth[1] * side).astype(jnp.int32)
        pos = jnp.clip(j * side + i, 0, cells - 1)
        fi, fj = i.astype(g.dtype), j.astype(g.dtype)
        n, hit = _best_anchor(g[b, pos], truth, biases, p)
        bb, pp = jnp.where(hit, b, 0), jnp.where(hit, pos, 0)
        row = _truth_row(s[bb, pp, n], g[bb, pp, n], truth, cls, biases[n], fi, fj, p, classes)
        return d.at[bb, pp, n].set(row)

    # as many steps as truths read (a few per image), not 300 per image
    return lax.fori_loop(0, ends[-1], step, delta)


@jax.custom_vjp
def _fork_loss(x, delta):
    return exact.div(jnp.sum(delta * delta), jnp.asarray(delta.shape[0], delta.dtype))


def _fork_loss_fwd(x, delta):
    return _fork_loss(x, delta), delta


def _fork_loss_bwd(delta, g):
    # RegionLossLayer::Backward_cpu of eric612: bottom diff = top_diff / N · diff_, the fork's
    # hand-written rule (diff_ is not the derivative of Σ diff_² / N); the label gets no diff.
    return (g / delta.shape[0] * delta, jnp.zeros_like(delta))


_fork_loss.defvjp(_fork_loss_fwd, _fork_loss_bwd)


class _Param:
    """The RegionLossParameter fields the loss reads, with ``side_`` the bottom's width."""

    def __init__(self, p, side: int) -> None:
        for name in ("num_class", "bias_match", "rescore", "object_scale", "noobject_scale",
                     "class_scale", "coord_scale", "thresh"):  # fmt: skip
            setattr(self, name, getattr(p, name))
        self.side_ = side


def _check(layer, p, x, label) -> None:
    n, c, h, w = x.shape
    if h != w:
        raise fail(layer, f"eric612's RegionLoss reads a square grid (side = width), got "
                          f"{h}×{w}")  # fmt: skip
    if p.coords != 4 or c != p.num * (5 + p.num_class):
        raise fail(layer, f"the bottom has {c} channels; eric612's RegionLoss needs num·(coords "
                          f"(4) + 1 + num_class) = {p.num * (5 + p.num_class)}")  # fmt: skip
    if len(p.biases) < 10:
        raise fail(layer, f"{len(p.biases)} biases: eric612's RegionLoss replaces fewer than 10 "
                          "by zeros (an infinite loss); give w, h per anchor")  # fmt: skip
    if label.size != n * MAX_TRUTHS * 5:
        raise fail(layer, f"the label must hold 300 × 5 values per image (eric612's "
                          f"AnnotatedData yolo_data_type 1), got {list(label.shape)}")  # fmt: skip


@register("RegionLoss", form="eric612", counts=(2, 2, 1, 1))
def eric612_region_loss(layer, params, bottoms, ctx: Context):
    """eric612's RegionLossLayer (module docstring)."""
    p = layer.param.region_loss_param
    x, label = bottoms
    _check(layer, p, x, label)
    side = x.shape[3]
    g = swap_blob(layer, lax.stop_gradient(x), p.num, side)
    biases = anchor_biases(layer, p.biases, p.num)
    labels = lax.stop_gradient(label).reshape(x.shape[0], MAX_TRUTHS, 5).astype(x.dtype)
    delta = region_delta(g, labels, biases, _Param(p, side))
    flat = delta.transpose(0, 2, 3, 1).reshape(x.shape)  # back to (N, C, H, W)
    return [_fork_loss(x, flat).reshape(())]


def _port(layer, x_shape, label_shape) -> str:
    """Which port's label the bottom holds: 30 truths per image (gklz1982) or 300 (eric612)."""
    per_image = 1
    for d in label_shape[1:]:
        per_image *= d
    if label_shape and label_shape[0] == x_shape[0] and per_image == GKLZ_TRUTHS * 5:
        return "yolov2"
    if label_shape and label_shape[0] == x_shape[0] and per_image == MAX_TRUTHS * 5:
        return "eric612"
    raise fail(layer, f"the label {list(label_shape)} is neither gklz1982's 30 × 5 nor "
                      "eric612's 300 × 5 values per image; give dialect yolov2 or "
                      "eric612")  # fmt: skip


@register("RegionLoss", counts=(2, 2, 1, 1))
def region_loss_by_label(layer, params, bottoms, ctx: Context):
    """RegionLoss of a net that does not say its port: the label's size decides (module doc)."""
    x, label = bottoms
    if _port(layer, x.shape, label.shape) == "yolov2":
        return yolov2_region_loss(layer, params, bottoms, ctx)
    return eric612_region_loss(layer, params, bottoms, ctx)


@region_loss_by_label.carry_shapes
def _(layer, bottom_shapes):
    if _port(layer, *bottom_shapes[:2]) == "yolov2":
        return [ParamDecl((1,))]  # gklz1982's forward count (lowering/forks/yolov2.py)
    return []
