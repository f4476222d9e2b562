"""eric612/MobileNet-YOLO's layers in ONNX (lowering/forks/yolo.py's semantics):

* Reorg → darknet's permutation as Reshape, Transpose, Reshape (and its inverse with
  ``reverse``).
* YoloDetectionOutput (YOLOv2) and Yolov3DetectionOutput: the candidates decoded from each
  bottom with elementwise operators (σ, exp, the anchors), then the ``MAX_CANDIDATES`` best
  (TopK, ties in candidate order), class-agnostic NonMaxSuppression on centre-size boxes
  (``center_point_box``), and the fork's rows ``[0, class + 1, confidence, x − w/2, y − h/2,
  x + w/2, y + h/2]`` padded with −1 rows to caffe2jax's static count (the first N rows
  ``[i, −1, …]`` when nothing is kept). The fork drops a box whose IoU with a kept one is ≥
  the threshold; NonMaxSuppression drops it when the IoU is > the threshold (they differ only
  on an exact tie).
"""

from __future__ import annotations

import numpy as np

from caffe2jax.lowering.forks.yolo import MAX_CANDIDATES, darknet_spec
from caffe2jax.runtime.onnx.builder import Builder
from caffe2jax.runtime.onnx.forks.detection_output import no_detection, ones_like
from caffe2jax.runtime.onnx.layers.pooling import pooling_with
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site


@register("Pooling", form="darknet2caffe")
def darknet_pooling(site: Site) -> list[str]:
    """darknet2caffe's PoolingLayer: BVLC's with its one more row and column
    (lowering/forks/yolo.py ``darknet_spec``)."""
    return pooling_with(site, darknet_spec)


@register("Reorg")
def reorg(site: Site) -> list[str]:
    p = site.param.reorg_param
    n, c, h, w = site.bottom_shapes[0]
    s = p.stride
    g = site.g
    lead = -1 if site.bottom_batch[0] is not None else n
    x = site.bottoms[0]
    if not p.reverse:
        view = g.reshape(x, [lead, c // (s * s), h, s, w, s])
        moved = g.op("Transpose", [view], perm=[0, 3, 5, 1, 2, 4])
        return [site.reshape_top(moved)]
    view = g.reshape(x, [lead, s, s, c // (s * s), h, w])
    moved = g.op("Transpose", [view], perm=[0, 3, 4, 1, 5, 2])
    return [site.reshape_top(moved)]


def _grid(g: Builder, x: str, shape, boxes: int) -> str:
    """(N, H, W, B, 5+K) view of a (N, B·(5+K), H, W) bottom."""
    n, c, h, w = shape
    return g.op("Transpose", [g.reshape(x, [n, boxes, c // boxes, h, w])], perm=[0, 3, 4, 1, 2])


def _cells(g: Builder, h: int, w: int) -> tuple[str, str]:
    j, i = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    as_const = lambda v: g.const(v.astype(np.float32)[None, :, :, None])  # noqa: E731
    return as_const(i), as_const(j)


def _channels(g: Builder, grid: str, start: int, stop: int) -> str:
    return g.slice(grid, [start], [stop], [4])


def _centres(g: Builder, grid: str, shape, wh_scale, biases: np.ndarray) -> list[str]:
    """x, y, w, h of every (N, H, W, B, 1) cell and anchor."""
    _, _, h, w = shape
    i, j = _cells(g, h, w)
    sig = lambda a: g.op("Sigmoid", [_channels(g, grid, a, a + 1)])  # noqa: E731
    bx = g.op("Div", [g.op("Add", [g.unsqueeze(i, [4]), sig(0)]), g.f32(float(wh_scale[0]))])
    by = g.op("Div", [g.op("Add", [g.unsqueeze(j, [4]), sig(1)]), g.f32(float(wh_scale[1]))])
    bw_ = g.const(biases[:, :1].astype(np.float32))
    bh_ = g.const(biases[:, 1:].astype(np.float32))
    bw = g.op("Div", [g.op("Mul", [g.op("Exp", [_channels(g, grid, 2, 3)]), bw_]),
                      g.f32(float(wh_scale[2]))])  # fmt: skip
    bh = g.op("Div", [g.op("Mul", [g.op("Exp", [_channels(g, grid, 3, 4)]), bh_]),
                      g.f32(float(wh_scale[3]))])  # fmt: skip
    return [bx, by, bw, bh]


def _biases(site: Site, values, count: int) -> np.ndarray:
    if len(values) < 2 * count:
        site.refuse(f"needs {2 * count} biases (w, h per anchor), got {len(values)}")
    return np.asarray(list(values)[: 2 * count], np.float32).reshape(count, 2)


def _flat(g: Builder, parts: list[str], width: int) -> str:
    return g.reshape(g.op("Concat", parts, axis=-1), [-1, width])


def _select(site: Site, boxes: str, scores: str, labels: str, valid: str, thr: float) -> str:
    """The fork's (1, 1, K, 7) top from flattened candidates (module docstring)."""
    g = site.g
    total = sum(_candidates_per_bottom(site))
    k = min(total, MAX_CANDIDATES)
    key = g.where(valid, scores, g.f32(float("-inf")))
    values, order = g.op("TopK", [key, g.i64([k])], outputs=2, axis=0)
    cand = g.op("Gather", [boxes, order], axis=0)
    limits = [g.i64([k]), g.f32([thr]), g.f32([float(np.finfo(np.float32).min)])]
    picked = g.op("NonMaxSuppression", [g.unsqueeze(cand, [0]), g.reshape(values, [1, 1, -1]),
                                        *limits], center_point_box=1)  # fmt: skip
    index = g.reshape(g.slice(picked, [2], [3], [1]), [-1])
    x, y, w, h = g.op("Split", [cand, g.i64([1, 1, 1, 1])], outputs=4, axis=1)
    two = g.f32(2.0)
    hw, hh = g.op("Div", [w, two]), g.op("Div", [h, two])
    label = g.op("Add", [g.unsqueeze(g.op("Gather", [labels, order], axis=0), [1]), g.f32(1.0)])
    rows = g.op("Concat", [ones_like(g, x, 0.0), label, g.unsqueeze(values, [1]),
                           g.op("Sub", [x, hw]), g.op("Sub", [y, hh]), g.op("Add", [x, hw]),
                           g.op("Add", [y, hh])], axis=1)  # fmt: skip
    found = g.op("Gather", [rows, index], axis=0)
    count = g.op("Shape", [index])
    size = g.i64([k])
    pads = g.op("Concat", [g.i64([0, 0]), g.op("Sub", [size, count]), g.i64([0])], axis=0)
    out = g.op("Pad", [found, pads, g.f32(-1.0)])
    n = g.i64(site.bottom_shapes[0][0])
    return g.reshape(no_detection(g, out, count, size, n), [1, 1, k, 7])


def _candidates_per_bottom(site: Site) -> list[int]:
    """How many candidates each bottom gives (v2: one per cell and anchor; v3: per class)."""
    if site.layer.type == "YoloDetectionOutput":
        return [int(np.prod(s)) // (5 + site.param.yolo_detection_output_param.num_classes)
                for s in site.bottom_shapes]  # fmt: skip
    return [int(np.prod(s)) // (5 + site.param.yolov3_detection_output_param.num_classes)
            * site.param.yolov3_detection_output_param.num_classes
            for s in site.bottom_shapes]  # fmt: skip


@register("YoloDetectionOutput")
def yolo_detection_output(site: Site) -> list[str]:
    """eric612's YoloDetectionOutputLayer (module docstring)."""
    site.static_batch("YOLO's detection output pools every image's boxes")
    p = site.param.yolo_detection_output_param
    g = site.g
    boxes, scores, labels = [], [], []
    for x, shape in zip(site.bottoms, site.bottom_shapes):
        grid = _grid(g, x, shape, p.num_box)
        side = float(shape[3])  # the fork uses the width for both axes
        biases = _biases(site, p.biases, p.num_box)
        boxes.append(_flat(g, _centres(g, grid, shape, (side,) * 4, biases), 4))
        probs = g.op("Softmax", [_channels(g, grid, 5, 5 + p.num_classes)], axis=-1)
        best = g.reduce("ReduceMax", probs, [4], keepdims=True)
        conf = g.op("Mul", [g.op("Sigmoid", [_channels(g, grid, 4, 5)]), best])
        scores.append(g.reshape(conf, [-1]))
        label = g.op("ArgMax", [probs], axis=4, keepdims=1, select_last_index=0)
        labels.append(g.reshape(g.cast(label, 1), [-1]))
    cat = lambda vs: vs[0] if len(vs) == 1 else g.op("Concat", vs, axis=0)  # noqa: E731
    score = cat(scores)
    valid = g.op("GreaterOrEqual", [score, g.f32(p.confidence_threshold)])
    return [_select(site, cat(boxes), score, cat(labels), valid, p.nms_threshold)]


@register("Yolov3DetectionOutput")
def yolov3_detection_output(site: Site) -> list[str]:
    """eric612's Yolov3DetectionOutputLayer (module docstring)."""
    site.static_batch("YOLO's detection output pools every image's boxes")
    p = site.param.yolov3_detection_output_param
    if p.gaussian_box:
        site.refuse("gaussian_box is not supported (only the plain YOLOv3 decoding)")
    g = site.g
    groups = len(p.mask) // p.mask_group_num
    k = p.num_classes
    boxes, scores, labels = [], [], []
    for t, (x, shape) in enumerate(zip(site.bottoms, site.bottom_shapes)):
        masks = list(p.mask)[t * groups : t * groups + p.num_box]
        biases = _biases(site, p.biases, max(masks) + 1)[masks]
        h, w = shape[2], shape[3]
        scale = p.anchors_scale[t]
        grid = _grid(g, x, shape, p.num_box)
        centre = g.op("Concat", _centres(g, grid, shape, (w, h, w * scale, h * scale), biases),
                      axis=-1)  # fmt: skip
        conf = g.op("Mul", [g.op("Sigmoid", [_channels(g, grid, 5, 5 + k)]),
                            g.op("Sigmoid", [_channels(g, grid, 4, 5)])])  # fmt: skip
        spread = g.op("Expand", [g.unsqueeze(centre, [4]), g.i64([1, 1, 1, 1, k, 1])])
        boxes.append(g.reshape(spread, [-1, 4]))
        scores.append(g.reshape(conf, [-1]))
        ids = g.op("Expand", [g.const(np.arange(k, dtype=np.float32)), g.op("Shape", [conf])])
        labels.append(g.reshape(ids, [-1]))
    cat = lambda vs: vs[0] if len(vs) == 1 else g.op("Concat", vs, axis=0)  # noqa: E731
    score = cat(scores)
    valid = g.op("Greater", [score, g.f32(p.confidence_threshold)])
    return [_select(site, cat(boxes), score, cat(labels), valid, p.nms_threshold)]
