"""gklz1982/caffe-yolov2's layers (gklz1982/caffe-yolov2@ebb2702: detection_output_layer.cpp,
region_loss_layer.cpp, include/caffe/util/bbox_util.hpp): its DetectionOutput (form
``yolov2``) and RegionLoss (form ``yolov2``).

The bottom (N, B·(5+K), H, W) is read as the fork's ``swap`` blob: cell (row j, column i) and
anchor n hold [tx, ty, tw, th, to, K class scores]; both layers use ``side`` for both axes (H
and W must equal it). A box is x = (i + σ(tx))/side, y = (j + σ(ty))/side, w = e^tw·bias[2n]/
side, h = e^th·bias[2n+1]/side. Overlaps are the fork's Calc_iou: the centre boxes turned into
corners **clipped to [0, 1]** (setNormalizedBBox), then SSD's JaccardOverlap (normalized).

* DetectionOutput (``detection_output_param``; one image: the fork CHECKs num == 1):
  confidence σ(to)·max softmax(classes) (the first maximal class), a candidate when ≥
  ``confidence_threshold`` (default 0.01); **no sorting**: ApplyNms walks the candidates in
  cell order (j, i, n) and drops a later one whose overlap with a kept one is ≥
  ``nms_threshold``. Rows [0, class (0-based), confidence, x, y, w, h] (centre-size, not
  corners, unlike SSD's), in that order; the static top is (1, 1, side²·B, 7) with −1 rows after
  the kept ones (and [0, −1, …] first when nothing is kept, as the fork writes it).
* RegionLoss (``region_loss_param``, bottoms [x, label (N, 150): 30 × (class, x, y, w, h)]):
  the fork's Forward_cpu builds a delta blob (:func:`region_delta`) and its loss is Σ delta²
  (not halved, not divided by N); its Backward_cpu writes top_diff/N · delta into the bottom
  diff — **a hand-written rule, not the gradient of that loss**: a custom_vjp applies it.
  ``softmax_tree`` and ``class_map`` are not supported (said at compile time).
* BoxData: encoded images and their boxes, read by the runtime's pipeline
  (runtime/data/readers/box_data.py); tops data and one (N, 150) label per ``data_param.side``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.lowering.boxes.iou import SSD, iou, iou_row
from caffe2jax.lowering.boxes.nms import compact, greedy_keep_rows
from caffe2jax.lowering.layers.data import from_source
from caffe2jax.lowering.registry import Context, ParamDecl, register
from caffe2jax.lowering.util import fail

#: forwards during which RegionLoss pulls every anchor towards its prior (the fork's
#: ``iter < 12800 / N``)
PRIOR_SEEN = 12800
MAX_TRUTHS = 30


def clipped_corners(boxes: jax.Array) -> jax.Array:
    """setNormalizedBBox: [x, y, w, h] → [x − w/2, y − h/2, x + w/2, y + h/2] clipped to [0, 1]."""
    x, y, w, h = (boxes[..., k] for k in range(4))
    lo = lambda v: jnp.maximum(v, 0.0)  # noqa: E731
    hi = lambda v: jnp.minimum(v, 1.0)  # noqa: E731
    return jnp.stack([lo(x - w / 2), lo(y - h / 2), hi(x + w / 2), hi(y + h / 2)], axis=-1)


def calc_iou(a: jax.Array, b: jax.Array) -> jax.Array:
    """The fork's Calc_iou of (P, 4) and (G, 4) centre boxes → (P, G)."""
    return iou(clipped_corners(a), clipped_corners(b), SSD)


def swap_blob(layer, x: jax.Array, num: int, side: int) -> jax.Array:
    """The fork's swap blob, (N, side², num, C/num), of a (N, C, side, side) bottom."""
    n, c, h, w = x.shape
    if h != side or w != side or c % num:
        raise fail(layer, f"the bottom {list(x.shape)} must be (N, num·(5 + classes), side, "
                          f"side) with num {num}, side {side}")  # fmt: skip
    return x.reshape(n, num, c // num, h * w).transpose(0, 3, 1, 2)


def anchor_biases(layer, values, num: int) -> jax.Array:
    if len(values) < 2 * num:
        raise fail(layer, f"needs {2 * num} biases (w, h per anchor), got {len(values)}")
    return jnp.asarray(list(values)[: 2 * num], jnp.float32).reshape(num, 2)


def region_boxes(g: jax.Array, biases: jax.Array, side: int) -> jax.Array:
    """get_region_box of every (side², num, ·) cell and anchor → (side², num, 4)."""
    cell = jnp.arange(side * side)
    i, j = (cell % side)[:, None], (cell // side)[:, None]
    return jnp.stack([(i + jax.nn.sigmoid(g[..., 0])) / side,
                      (j + jax.nn.sigmoid(g[..., 1])) / side,
                      jnp.exp(g[..., 2]) * biases[:, 0] / side,
                      jnp.exp(g[..., 3]) * biases[:, 1] / side], axis=-1)  # fmt: skip


# -- DetectionOutput (form yolov2) -------------------------------------------------------------


@register("DetectionOutput", form="yolov2", counts=(1, 1, 1, 1), no_force_backward=(0,))
def yolov2_detection_output(layer, params, bottoms, ctx: Context):
    """gklz1982's DetectionOutputLayer::Forward_cpu (module docstring)."""
    p = layer.param.detection_output_param
    (x,) = bottoms
    if x.shape[0] != 1:
        raise fail(layer, f"the fork decodes one image (num must be 1), got {x.shape[0]}")
    classes = p.num_classes if p.HasField("num_classes") else 20
    thr = p.confidence_threshold if p.HasField("confidence_threshold") else 0.01
    g = swap_blob(layer, lax.stop_gradient(x), p.num_box, p.side)[0]
    if g.shape[-1] < 5 + classes:
        raise fail(layer, f"{g.shape[-1]} channels per anchor, fewer than 5 + num_classes")
    boxes = region_boxes(g, anchor_biases(layer, p.biases, p.num_box), p.side).reshape(-1, 4)
    probs = jax.nn.softmax(g[..., 5 : 5 + classes], axis=-1)
    score = (jax.nn.sigmoid(g[..., 4]) * jnp.max(probs, axis=-1)).reshape(-1)
    label = jnp.argmax(probs, axis=-1).astype(x.dtype).reshape(-1)
    valid = score >= thr
    keep = greedy_keep_rows(clipped_corners(boxes), valid, p.nms_threshold, iou_row(SSD), True)
    rows = jnp.concatenate([jnp.zeros_like(score)[:, None], label[:, None], score[:, None],
                            boxes], axis=1)  # fmt: skip
    k = score.shape[0]
    out = compact(rows, keep, k, jnp.full((7,), -1.0, rows.dtype))
    out = out.at[0, 0].set(jnp.where(jnp.any(keep), out[0, 0], 0.0))
    return [out.reshape(1, 1, k, 7).astype(x.dtype)]


# -- RegionLoss (form yolov2) ------------------------------------------------------------------


def _noobj_and_prior(s, boxes, truths, valid, biases, p, prior):
    """The delta's first pass: objectness towards 0 (0 where the best overlap with a truth
    > thresh), coordinates towards the anchor's prior box (scale .01) while ``prior``."""
    best = jnp.max(jnp.where(valid[None, :], calc_iou(boxes.reshape(-1, 4), truths), 0.0), 1)
    obj = s[..., 4]
    d_obj = -1 * p.noobject_scale * (0 - obj) * obj * (1 - obj)
    d_obj = jnp.where(best.reshape(obj.shape) > p.thresh, 0.0, d_obj)
    side = p.side
    cell = jnp.arange(side * side)
    i, j = (cell % side)[:, None].astype(s.dtype), (cell // side)[:, None].astype(s.dtype)
    prior_box = jnp.stack(
        jnp.broadcast_arrays(
            (i + 0.5) / side, (j + 0.5) / side, biases[:, 0] / side, biases[:, 1] / side
        ),
        -1,
    )
    d_box = box_delta(prior_box, s, biases, i, j, side, 0.01)
    delta = jnp.zeros_like(s).at[..., 4].set(d_obj)
    return delta.at[..., :4].set(jnp.where(prior, d_box, 0.0))


def box_delta(truth, s, biases, i, j, side: int, scale: float) -> jax.Array:
    """delta_region_box's four coordinate deltas (s holds raw tx, ty, tw, th)."""
    sx, sy = jax.nn.sigmoid(s[..., 0]), jax.nn.sigmoid(s[..., 1])
    tx, ty = truth[..., 0] * side - i, truth[..., 1] * side - j
    tw = jnp.log(truth[..., 2] * side / biases[..., 0])
    th = jnp.log(truth[..., 3] * side / biases[..., 1])
    dx = -1 * scale * (tx - sx) * sx * (1 - sx)
    dy = -1 * scale * (ty - sy) * sy * (1 - sy)
    return jnp.stack([dx, dy, -1 * scale * (tw - s[..., 2]), -1 * scale * (th - s[..., 3])], -1)


def _truth_step(delta, s, truth, cls, biases, p, classes: int):
    """The delta's second pass for one truth: its cell's best anchor by shape."""
    side = p.side
    i = jnp.clip(jnp.floor(truth[0] * side), 0, side - 1)
    j = jnp.clip(jnp.floor(truth[1] * side), 0, side - 1)
    pos = (j * side + i).astype(jnp.int32)
    g = s[pos]
    shapes = biases / side if p.bias_match else region_boxes(s, biases, side)[pos][:, 2:]
    zeros = jnp.zeros_like(shapes)
    anchors = jnp.concatenate([zeros, shapes], 1)
    shift = jnp.concatenate([jnp.zeros(2, truth.dtype), truth[2:]])[None]
    ious = calc_iou(anchors, shift)[:, 0]
    n = jnp.argmax(jnp.where(jnp.any(ious > 0), ious, 0.0))  # first maximum; 0 when none > 0
    d_box = box_delta(truth, g[n], biases[n], i, j, side, p.coord_scale)
    obj = g[n, 4]
    d_obj = -1.0 * p.object_scale * (1 - obj) * (obj * (1 - obj))
    onehot = (jnp.arange(classes) == cls).astype(s.dtype)
    d_cls = -1.0 * p.class_scale * (onehot - g[n, 5 : 5 + classes])
    row = jnp.concatenate([d_box, d_obj[None], d_cls, delta[pos, n, 5 + classes :]])
    return delta.at[pos, n].set(row)


def region_delta(g, label, biases, p, prior):
    """The fork's diff_ for one image: g (side², num, size) raw, label (150,)."""
    classes = p.num_class
    s = g.at[..., 4].set(jax.nn.sigmoid(g[..., 4]))
    s = s.at[..., 5 : 5 + classes].set(jax.nn.softmax(g[..., 5 : 5 + classes], axis=-1))
    truths = label.reshape(MAX_TRUTHS, 5)
    by_x = jnp.cumprod(truths[:, 1] != 0).astype(bool)  # the first pass stops at x == 0
    by_w = jnp.cumprod(truths[:, 3] != 0).astype(bool)  # the second at w == 0
    delta = _noobj_and_prior(s, region_boxes(g, biases, p.side), truths[:, 1:], by_x, biases,
                             p, prior)  # fmt: skip

    def step(t, d):
        new = _truth_step(d, s, truths[t, 1:], truths[t, 0].astype(jnp.int32), biases, p, classes)
        return jnp.where(by_w[t], new, d)

    return lax.fori_loop(0, MAX_TRUTHS, step, delta)


@jax.custom_vjp
def _fork_loss(x, delta):
    return jnp.sum(delta * delta)


def _fork_loss_fwd(x, delta):
    return jnp.sum(delta * delta), delta


def _fork_loss_bwd(delta, g):
    # RegionLossLayer::Backward_cpu: bottom diff = top_diff / N · delta, the fork's rule (not
    # the derivative of Σ delta²); the label gets no diff.
    return (g / delta.shape[0] * delta, jnp.zeros_like(delta))


_fork_loss.defvjp(_fork_loss_fwd, _fork_loss_bwd)


@register("RegionLoss", form="yolov2", counts=(2, 2, 1, 1))
def yolov2_region_loss(layer, params, bottoms, ctx: Context):
    """gklz1982's RegionLossLayer (module docstring)."""
    p = layer.param.region_loss_param
    if p.softmax_tree or p.class_map:
        raise fail(layer, "softmax_tree and class_map are not supported (plain softmax classes)")
    x, label = bottoms
    g = swap_blob(layer, x, p.num, p.side)
    if g.shape[-1] != p.coords + 1 + p.num_class or p.coords != 4:
        raise fail(layer, f"channels per anchor must be coords (4) + 1 + num_class, got "
                          f"{g.shape[-1]}")  # fmt: skip
    if label.size != x.shape[0] * MAX_TRUTHS * 5:
        raise fail(layer, f"the label must hold 30 × 5 values per image, got {list(label.shape)}")
    (forwards,) = ctx.carry
    prior = forwards[0] < PRIOR_SEEN // x.shape[0]
    biases = anchor_biases(layer, p.biases, p.num)
    labels = lax.stop_gradient(label).reshape(x.shape[0], -1)
    delta = jax.vmap(lambda gg, ll: region_delta(gg, ll, biases, p, prior))(
        lax.stop_gradient(g), labels
    )
    flat = delta.transpose(0, 2, 3, 1).reshape(x.shape)  # real_diff_: back to (N, C, H, W)
    return [_fork_loss(x, flat).reshape(())], [forwards + 1]


@yolov2_region_loss.carry_shapes
def _(layer, bottom_shapes):
    return [ParamDecl((1,))]


@register("BoxData", counts=(0, 0, 2, None), source=True, feed="pipeline")
def box_data(layer):
    """gklz1982's BoxDataLayer: images and their boxes, shapes from the source."""
    return from_source(layer)
