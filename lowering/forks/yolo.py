"""eric612/MobileNet-YOLO's YOLO layers: Reorg, YoloDetectionOutput (YOLOv2) and
Yolov3DetectionOutput, from reorg_layer.{cpp,hpp}, yolo_detection_output_layer.cpp,
yolov3_detection_output_layer.cpp and util/bbox_util.cpp at eric612@69b4441.

* Reorg (``reorg_param``: ``stride`` required, ``reverse``): darknet's reorg, not a clean
  space-to-depth. Forward (reverse false) reads the input as (N, C/s², H·s, W·s) and writes
  ``Y[n, c, h, w] = X'[n, c mod C/s², h·s + (c div C/s²) div s, w·s + (c div C/s²) mod s]``
  (C, H, W the input's dims), its buffer seen as (N, C·s², H/s, W/s); reverse is the inverse
  permutation with top (N, C/s², H·s, W·s). The fork's Backward_cpu/gpu read the layer's own
  never-written ``diff_`` blob instead of the top diff, so its bottom diff is all zeros: a
  custom_vjp reproduces that (gradients do not flow through a Reorg in eric612's Caffe).
* YoloDetectionOutput (``yolo_detection_output_param``): one or two bottoms (N, B·(5+K), H,
  W), B = ``num_box`` anchors of ``5 + num_classes`` channels [tx, ty, tw, th, to, classes]; per
  cell (row j, column i; side = W) and anchor n: x = (i + σ(tx))/side, y = (j + σ(ty))/side,
  w = e^tw·bias[2n]/side, h = e^th·bias[2n+1]/side, confidence σ(to)·max softmax(classes)
  with the first maximal class; kept when ≥ ``confidence_threshold``.
* Yolov3DetectionOutput (``yolov3_detection_output_param``): ``mask_group_num`` bottoms
  (N, B·(5+K), H, W); bottom t uses masks ``mask[t·G + n]`` (G = len(mask)/mask_group_num)
  and the net input size (W·anchors_scale[t], H·anchors_scale[t]): x = (i + σ(tx))/W,
  y = (j + σ(ty))/H, w = e^tw·bias[2m]/(W·scale), h = e^th·bias[2m+1]/(H·scale); one
  candidate per class whose σ(class)·σ(to) > ``confidence_threshold`` (the fork's
  correct_yolo_boxes is the identity here: both axes share one scale).

Both detection outputs pool the candidates of every image and bottom, sort them by confidence
(std::sort; here ties keep candidate order: image, bottom, row, column, anchor, class), run
class-agnostic NMS (a later box is dropped when its IoU with a kept one is ≥
``nms_threshold``, on centre-size boxes), and write rows [0, class + 1, confidence, x − w/2,
y − h/2, x + w/2, y + h/2] (image id 0 for every row, as the fork writes it; not clipped).
The static top is (1, 1, K, 7) with K = min(candidates, MAX_CANDIDATES): the K best
candidates enter NMS (the fork takes all; it differs only when more than MAX_CANDIDATES pass
the threshold), rows after the kept ones are −1, and with nothing kept the first N rows are
[i, −1, …] as the fork writes them. No backward (the fork's is empty).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.lowering.boxes.nms import compact, greedy_keep_rows
from caffe2jax.lowering.registry import register
from caffe2jax.lowering.util import fail

#: The most candidates a YOLO detection output keeps for NMS (the best-scoring ones).
MAX_CANDIDATES = 4096

# -- Reorg ----------------------------------------------------------------------------------


@register("Reorg", counts=(1, 1, 1, 1))
def reorg(layer, params, bottoms, ctx):
    """eric612's ReorgLayer (module docstring); bottom diff zeros as the fork's backward."""
    p = layer.param.reorg_param
    if not p.HasField("stride") or p.stride <= 0:
        raise fail(layer, "Reorg Layer needs stride param.")
    (x,) = bottoms
    if x.ndim != 4:
        raise fail(layer, f"the bottom must be 4-D, got shape {list(x.shape)}")
    n, c, h, w = x.shape
    s = p.stride
    if p.reverse and c % (s * s):
        raise fail(layer, f"channels ({c}) must be divisible by stride² ({s * s})")
    if not p.reverse and (c % (s * s) or h % s or w % s):
        raise fail(layer, f"shape {list(x.shape)} does not divide by stride {s}")
    return [_zero_grad(lambda v: reorg_forward(v, s, p.reverse))(x)]


def _gather(x: jax.Array, s: int) -> jax.Array:
    """reorg_cpu's gather: Y[n, c, h, w] = X'[n, c mod t, h·s + (c div t) div s,
    w·s + (c div t) mod s], X' the bottom's buffer seen as (N, t, H·s, W·s), t = C/s²."""
    n, c, h, w = x.shape
    view = x.reshape(n, c // (s * s), h, s, w, s)
    return view.transpose(0, 3, 5, 1, 2, 4).reshape(n, c, h, w)


def reorg_forward(x: jax.Array, s: int, reverse: bool) -> jax.Array:
    """The Reorg top, a permutation of the bottom (module docstring)."""
    n, c, h, w = x.shape
    if not reverse:
        return _gather(x, s).reshape(n, c * s * s, h // s, w // s)
    # reverse: the top scatters where the gather reads, top[perm[i]] = bottom[i]
    perm = _gather(jnp.arange(x.size).reshape(x.shape), s).reshape(-1)
    flat = jnp.zeros(x.size, x.dtype).at[perm].set(x.reshape(-1))
    return flat.reshape(n, c // (s * s), h * s, w * s)


def _zero_grad(fn):
    """``fn`` whose VJP is zeros: eric612's Reorg backward reads its own unwritten diff_
    blob (reorg_layer.cpp Backward_cpu, reorg_layer.cu Backward_gpu), not the top diff."""

    @jax.custom_vjp
    def run(x):
        return fn(x)

    def run_fwd(x):
        return fn(x), x

    def run_bwd(x, g):
        return (jnp.zeros_like(x),)

    run.defvjp(run_fwd, run_bwd)
    return run


# -- detection outputs ---------------------------------------------------------------------


def center_iou(box: jax.Array, boxes: jax.Array) -> jax.Array:
    """The forks' box_iou on [x, y, w, h] centre boxes (intersection 0 when either overlap
    is negative; union w1·h1 + w2·h2 − intersection)."""

    def overlap(a, wa, b, wb):
        left = jnp.maximum(a - wa / 2, b - wb / 2)
        right = jnp.minimum(a + wa / 2, b + wb / 2)
        return right - left

    w = overlap(box[0], box[2], boxes[:, 0], boxes[:, 2])
    h = overlap(box[1], box[3], boxes[:, 1], boxes[:, 3])
    inter = jnp.where((w < 0) | (h < 0), 0.0, w * h)
    return inter / (box[2] * box[3] + boxes[:, 2] * boxes[:, 3] - inter)


def _grid(x: jax.Array, boxes: int, layer) -> jax.Array:
    """(N, H, W, B, 5+K) view of a (N, B·(5+K), H, W) bottom."""
    n, c, h, w = x.shape
    if c % boxes:
        raise fail(layer, f"channels ({c}) must be num_box ({boxes}) · (5 + num_classes)")
    return x.reshape(n, boxes, c // boxes, h, w).transpose(0, 3, 4, 1, 2)


def _cells(h: int, w: int):
    j, i = jnp.meshgrid(jnp.arange(h), jnp.arange(w), indexing="ij")
    return i[None, :, :, None], j[None, :, :, None]


def select_and_suppress(boxes, scores, labels, valid, thr: float, n: int) -> jax.Array:
    """Sort candidates (M, ·) by score, keep the best MAX_CANDIDATES, class-agnostic NMS, and
    write the fork's (1, 1, K, 7) top."""
    k = min(scores.shape[0], MAX_CANDIDATES)
    key = jnp.where(valid, scores, -jnp.inf)
    _, order = lax.top_k(key, k)  # descending; equal keys in index order
    boxes, scores, labels, valid = boxes[order], scores[order], labels[order], valid[order]
    keep = greedy_keep_rows(boxes, valid, thr, center_iou, strict=True)
    x, y, w, h = (boxes[:, i] for i in range(4))
    rows = jnp.stack(
        [jnp.zeros_like(x), labels + 1.0, scores, x - w / 2, y - h / 2, x + w / 2, y + h / 2],
        axis=1,
    )
    out = compact(rows, keep, k, jnp.full((7,), -1.0, rows.dtype))
    first = (jnp.sum(keep) == 0) & (jnp.arange(k) < n)
    out = out.at[:, 0].set(jnp.where(first, jnp.arange(k, dtype=out.dtype), out[:, 0]))
    return out.reshape(1, 1, k, 7)


def _v2_candidates(x, p, layer):
    """(boxes, scores, labels) of one YoloDetectionOutput bottom, flattened."""
    g = _grid(x, p.num_box, layer)
    side = x.shape[3]  # the fork uses the width for both axes
    biases = _biases(layer, p.biases, p.num_box)
    i, j = _cells(x.shape[2], x.shape[3])
    bx = (i + jax.nn.sigmoid(g[..., 0])) / side
    by = (j + jax.nn.sigmoid(g[..., 1])) / side
    bw = jnp.exp(g[..., 2]) * biases[:, 0] / side
    bh = jnp.exp(g[..., 3]) * biases[:, 1] / side
    probs = jax.nn.softmax(g[..., 5 : 5 + p.num_classes], axis=-1)
    score = jax.nn.sigmoid(g[..., 4]) * jnp.max(probs, axis=-1)
    label = jnp.argmax(probs, axis=-1).astype(x.dtype)
    boxes = jnp.stack([bx, by, bw, bh], axis=-1).reshape(-1, 4)
    return boxes, score.reshape(-1), label.reshape(-1)


def _biases(layer, values, count: int) -> jax.Array:
    if len(values) < 2 * count:
        raise fail(layer, f"needs {2 * count} biases (w, h per anchor), got {len(values)}")
    return jnp.asarray(list(values)[: 2 * count], jnp.float32).reshape(count, 2)


@register("YoloDetectionOutput", counts=(1, 2, 1, 1), no_force_backward=(0, 1))
def yolo_detection_output(layer, params, bottoms, ctx):
    """eric612's YoloDetectionOutputLayer::Forward_cpu (module docstring)."""
    p = layer.param.yolo_detection_output_param
    parts = [_v2_candidates(lax.stop_gradient(b), p, layer) for b in bottoms]
    boxes, scores, labels = (jnp.concatenate(v) for v in zip(*parts))
    valid = scores >= p.confidence_threshold
    top = select_and_suppress(boxes, scores, labels, valid, p.nms_threshold, bottoms[0].shape[0])
    return [top.astype(bottoms[0].dtype)]


def _v3_candidates(x, t: int, p, layer):
    """(boxes, scores, labels) of bottom ``t`` of a Yolov3DetectionOutput, one per class."""
    groups = len(p.mask) // p.mask_group_num
    masks = list(p.mask)[t * groups : t * groups + p.num_box]
    if len(masks) < p.num_box or len(p.anchors_scale) <= t:
        raise fail(layer, f"bottom {t} needs {p.num_box} masks and an anchors_scale")
    g = _grid(x, p.num_box, layer)
    h, w = x.shape[2], x.shape[3]
    scale = p.anchors_scale[t]
    biases = _biases(layer, p.biases, max(masks) + 1)[jnp.asarray(masks)]
    i, j = _cells(h, w)
    bx = (i + jax.nn.sigmoid(g[..., 0])) / w
    by = (j + jax.nn.sigmoid(g[..., 1])) / h
    bw = jnp.exp(g[..., 2]) * biases[:, 0] / (w * scale)
    bh = jnp.exp(g[..., 3]) * biases[:, 1] / (h * scale)
    k = p.num_classes
    score = jax.nn.sigmoid(g[..., 5 : 5 + k]) * jax.nn.sigmoid(g[..., 4:5])
    boxes = jnp.broadcast_to(jnp.stack([bx, by, bw, bh], -1)[..., None, :], score.shape + (4,))
    labels = jnp.broadcast_to(jnp.arange(k, dtype=x.dtype), score.shape)
    return boxes.reshape(-1, 4), score.reshape(-1), labels.reshape(-1)


@register("Yolov3DetectionOutput", counts=(1, None, 1, 1))
def yolov3_detection_output(layer, params, bottoms, ctx):
    """eric612's Yolov3DetectionOutputLayer::Forward_cpu (module docstring)."""
    p = layer.param.yolov3_detection_output_param
    if p.gaussian_box:
        raise fail(layer, "gaussian_box is not supported (only the plain YOLOv3 decoding)")
    if len(bottoms) != p.mask_group_num:
        raise fail(layer, f"mask_group_num is {p.mask_group_num} but there are "
                          f"{len(bottoms)} bottoms")  # fmt: skip
    parts = [_v3_candidates(lax.stop_gradient(b), t, p, layer) for t, b in enumerate(bottoms)]
    boxes, scores, labels = (jnp.concatenate(v) for v in zip(*parts))
    valid = scores > p.confidence_threshold
    top = select_and_suppress(boxes, scores, labels, valid, p.nms_threshold, bottoms[0].shape[0])
    return [top.astype(bottoms[0].dtype)]
