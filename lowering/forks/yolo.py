"""The YOLO ports' layers: eric612/MobileNet-YOLO's Reorg, YoloDetectionOutput (YOLOv2) and
Yolov3DetectionOutput (reorg_layer.{cpp,hpp}, yolo_detection_output_layer.cpp,
yolov3_detection_output_layer.cpp and util/bbox_util.cpp at eric612@69b4441), the
nearest-neighbour Upsample both ports have (form ``nearest``), and darknet2caffe's Mish and
Pooling (form ``darknet2caffe``).

* Upsample (form ``nearest``, one bottom): ``top[h, w] = x[h div s, w div s]``,
  ``s = upsample_param.scale`` (1 when unset: the upgrade writes it out).
* Mish (darknet2caffe mish_layer.cpp): ``y = x·tanh(softplus(x))``, softplus thresholded as
  the fork does (``x`` above 20, ``exp(x)`` below −20, else ``log(exp(x) + 1)``).
* Pooling (form ``darknet2caffe``, its pooling_layer.cpp): Caffe's PoolingLayer with one more
  output row and column when ``kernel_h − stride_h`` is odd (:func:`darknet_extra`).

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

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.boxes.iou import YOLO, iou_row
from caffe2jax.lowering.boxes.nms import compact, greedy_keep_rows
from caffe2jax.lowering.layers import pooling
from caffe2jax.lowering.layers.pooling import PoolSpec
from caffe2jax.lowering.registry import Context, Planning, register
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
    keep = greedy_keep_rows(boxes, valid, thr, iou_row(YOLO), strict=True)
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


# -- Upsample (nearest) ---------------------------------------------------------------------


def _nearest(layer: ir.Layer, x: jax.Array, axes: tuple[int, int]) -> jax.Array:
    scale = layer.param.upsample_param.scale
    if scale < 1:
        raise fail(layer, f"upsample_param.scale must be at least 1, got {scale}")
    return jnp.repeat(jnp.repeat(x, scale, axis=axes[0]), scale, axis=axes[1])


@register("Upsample", form="nearest", counts=(1, 2, 1, 1))
def upsample_nearest(layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """The YOLO ports' UpsampleLayer: nearest-neighbour by ``scale`` (module docstring)."""
    (x,) = bottoms
    if x.ndim != 4:
        raise fail(layer, f"Upsample takes a 4-D bottom, got {tuple(x.shape)}")
    return [_nearest(layer, x, (2, 3))]


@upsample_nearest.nhwc
def _(layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    return [_nearest(layer, bottoms[0], (1, 2))]


# -- Mish -----------------------------------------------------------------------------------


def softplus(x: jax.Array) -> jax.Array:
    """darknet2caffe's thresholded softplus (threshold 20)."""
    big, small = x > 20, x < -20
    middle = jnp.where(big | small, jnp.zeros_like(x), x)
    return jnp.where(
        big, x, jnp.where(small, jnp.exp(jnp.minimum(x, 0)), jnp.log(jnp.exp(middle) + 1))
    )


@register("Mish", counts=(1, 1, 1, 1))
def mish(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """MishLayer: ``x·tanh(softplus(x))``."""
    (x,) = bottoms
    return [x * jnp.tanh(softplus(x))]


mish.nhwc(mish.fn)  # element by element


# -- Pooling (darknet2caffe) ----------------------------------------------------------------


def darknet_extra(spec: PoolSpec, hw: tuple[int, int], ceil: bool) -> PoolSpec:
    """darknet2caffe's pooling_layer.cpp (form ``darknet2caffe``): one more output row AND
    column when ``kernel_h − stride_h`` is odd (C++ ``%``: positive differences only), added
    before Caffe's last-window clip; windows past the input are clipped as usual (yolov3-tiny's
    2×2 stride-1 max pool keeps 13×13)."""
    gap = spec.kernel[0] - spec.stride[0]
    if gap <= 0 or gap % 2 != 1:
        return spec
    padded = any(spec.pad)
    out = []
    for n, k, s, p in zip(hw, spec.kernel, spec.stride, spec.pad):
        span = n + 2 * p - k
        size = (-(-span // s) if ceil else span // s) + 2
        out.append(size - 1 if padded and (size - 1) * s >= n + p else size)
    return PoolSpec(spec.method, spec.kernel, spec.stride, spec.pad, tuple(out))  # type: ignore[arg-type]


def darknet_spec(layer: ir.Layer, shape: tuple[int, ...]) -> PoolSpec:
    """Caffe's pooling geometry (:func:`~caffe2jax.lowering.layers.pooling.pooling_spec`) with
    darknet2caffe's extra row and column."""
    spec = pooling.pooling_spec(layer, shape)
    ceil = layer.param.pooling_param.round_mode == caffe_pb2.PoolingParameter.CEIL
    return darknet_extra(spec, (shape[2], shape[3]), ceil)


@register("Pooling", form="darknet2caffe", counts=(1, 1, 1, 2), bf16=True)
def darknet_pooling(layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """darknet2caffe's PoolingLayer: Caffe's with :func:`darknet_spec`'s geometry."""
    return pooling.pool_layer(layer, bottoms, ctx, darknet_spec)


@darknet_pooling.nhwc(when=pooling.max_or_ave)
def _(layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    return pooling.pool_layer_nhwc(layer, bottoms, ctx, darknet_spec)


@darknet_pooling.engine
def _(layer, bottom_shapes, planning: Planning) -> str | None:
    return pooling.pool_form(darknet_spec(layer, tuple(bottom_shapes[0])), planning)
