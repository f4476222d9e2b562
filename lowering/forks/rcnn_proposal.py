"""py-faster-rcnn's ``rpn.proposal_layer.ProposalLayer`` as a built-in Python layer.

A net naming ``python_param { module: 'rpn.proposal_layer' layer: 'ProposalLayer' }`` runs
this JAX version unless the user registered their own function for it
(:func:`~caffe2jax.lowering.python_layer.register_python_layer`) or their own
``rpn.proposal_layer`` module is importable from sys.path (then it runs, as in Caffe).

Reproduced from py-faster-rcnn@781a917 lib/rpn/proposal_layer.py, generate_anchors.py,
lib/fast_rcnn/bbox_transform.py, config.py and nms/py_cpu_nms.py:

* ``param_str`` (YAML): ``feat_stride`` (required), ``scales`` (default (8, 16, 32)),
  ``ratios`` (default (0.5, 1, 2): PVANet's and soeaver's py-RFCN-priv layers read it; PVANet's
  7 ratios × 6 scales make 42 anchors) and ``base_size`` (default 16: py-RFCN-priv reads it).
  py-faster-rcnn's and py-R-FCN's own layers read only the first two, but their nets set no
  others; keys no version reads (``num_classes``…) are ignored, as every version ignores them;
* bottoms: rpn_cls_prob_reshape (1, 2A, H, W) (foreground = channels A..2A), rpn_bbox_pred
  (1, 4A, H, W), im_info (1, 3) [height, width, scale]; batch 1 only;
* anchors at every position (row-major, anchors inner), ``bbox_transform_inv`` (+1 widths,
  no −1 on x2), clipped to [0, W−1]×[0, H−1], boxes narrower or shorter than
  ``RPN_MIN_SIZE·scale`` dropped, sorted by score (descending; ties keep anchor order — numpy's
  argsort leaves them unspecified), ``RPN_PRE_NMS_TOP_N`` kept, NMS at ``RPN_NMS_THRESH``
  (+1 areas, IoU ≤ threshold kept), ``RPN_POST_NMS_TOP_N`` kept. Config: TEST 6000 / 300 /
  0.7 / 16, TRAIN 12000 / 2000 / 0.7 / 16 (cfg.TEST / cfg.TRAIN). py-R-FCN's layer
  (form ``rfcn``, frontend/forks/forms.py) is the same code run with
  experiments/cfgs/rfcn_end2end_ohem.yml (its deltas un-normalised first in TRAIN),
  registered in lowering/forks/rfcn.py.

Tops: rois (R, 5) [0, x1, y1, x2, y2] and optionally scores (R, 1). py-faster-rcnn's R is the
number kept; here R is the static ``RPN_POST_NMS_TOP_N`` (capped by the candidates there can
be) and the rows after the kept ones are zeros, as OpenCV's Proposal layer pads them. No
backward (the Python layer's ``backward`` is empty): gradients stop here.
"""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.lowering.boxes.coders import bbox_transform_inv
from caffe2jax.lowering.boxes.iou import RCNN_NMS, iou_row
from caffe2jax.lowering.boxes.nms import compact, greedy_keep_rows, ranked
from caffe2jax.lowering.python_layer import register_builtin_python_layer
from caffe2jax.lowering.util import fail

#: cfg.TEST / cfg.TRAIN of lib/fast_rcnn/config.py: pre-NMS top N, post-NMS top N, NMS
#: threshold, min size.
CONFIG = {ir.TEST: (6000, 300, 0.7, 16), ir.TRAIN: (12000, 2000, 0.7, 16)}

_ENTRY = re.compile(
    r"""['"]?(\w+)['"]?\s*:\s*(?:!!python/tuple\s*)?(\[[^\]]*\]|\([^)]*\)|[^,\n}]+)"""
)


def parse_param_str(param_str: str) -> dict[str, object]:
    """The scalars and number lists of a py-faster-rcnn ``param_str`` (a YAML mapping such as
    ``'feat_stride': 16 \\n'scales': !!python/tuple [4, 8, 16, 32]``)."""
    out: dict[str, object] = {}
    for key, raw in _ENTRY.findall(param_str):
        raw = raw.strip()
        if raw[:1] in "[(":
            out[key] = tuple(float(v) for v in re.split(r"[,\s]+", raw[1:-1].strip()) if v)
        else:
            try:
                out[key] = float(raw)
            except ValueError:
                out[key] = raw.strip("'\"")
    return out


def generate_anchors(base_size=16, ratios=(0.5, 1, 2), scales=(8, 16, 32)) -> np.ndarray:
    """py-faster-rcnn's generate_anchors: (len(ratios)·len(scales), 4), ratio-major; numpy's
    round (halves to even) as the original."""
    w = h = float(base_size)
    cx, cy = 0.5 * (w - 1), 0.5 * (h - 1)
    out = []
    for r in ratios:
        ws = np.round(np.sqrt(w * h / r))
        hs = np.round(ws * r)
        for s in scales:
            a, b = ws * s, hs * s
            half_w, half_h = 0.5 * (a - 1), 0.5 * (b - 1)
            out.append([cx - half_w, cy - half_h, cx + half_w, cy + half_h])
    return np.asarray(out, np.float64)


def anchor_settings(layer: ir.Layer) -> tuple[dict[str, object], np.ndarray]:
    """The layer's param_str and its anchors: ``generate_anchors(base_size, ratios, scales)``
    from ``base_size``, ``ratios`` and ``scales`` (defaults 16, (0.5, 1, 2), (8, 16, 32)), as
    PVANet's and py-RFCN-priv's proposal and anchor target layers read them."""
    params = parse_param_str(layer.param.python_param.param_str)
    if "feat_stride" not in params:
        raise fail(layer, f"{layer.param.python_param.layer}'s param_str needs 'feat_stride', "
                          f"got {layer.param.python_param.param_str!r}")  # fmt: skip
    for key in ("scales", "ratios"):
        if key in params and not (isinstance(params[key], tuple) and params[key]):
            raise fail(layer, f"param_str '{key}' must be a list of numbers, got {params[key]!r}")
    anchors = generate_anchors(
        float(params.get("base_size", 16)),
        tuple(params.get("ratios", (0.5, 1, 2))),
        tuple(params.get("scales", (8, 16, 32))),
    )
    return params, anchors


def _check_channels(layer: ir.Layer, scores, deltas, params, anchors) -> None:
    """rpn_cls_prob_reshape must have 2·A channels and rpn_bbox_pred 4·A for the A anchors
    the param_str makes (py-faster-rcnn's layer would mis-slice or fail to broadcast)."""
    a = anchors.shape[0]
    if scores.shape[1] == 2 * a and deltas.shape[1] == 4 * a:
        return
    made = (f"A = {a} anchors: {len(params.get('ratios', (0.5, 1, 2)))} ratios × "
            f"{len(params.get('scales', (8, 16, 32)))} scales")  # fmt: skip
    raise fail(layer, f"bottoms need 2·A = {2 * a} and 4·A = {4 * a} channels ({made}), got "
                      f"{list(scores.shape)} and {list(deltas.shape)}")  # fmt: skip


def _proposals(scores, deltas, info, stride: float, anchors: np.ndarray):
    """Every anchor's clipped proposal (K·A, 4), score (K·A,) and min-size validity."""
    a = anchors.shape[0]
    height, width = scores.shape[-2:]
    sx, sy = np.meshgrid(np.arange(width) * stride, np.arange(height) * stride)
    shifts = np.stack([sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel()], axis=1)
    all_anchors = (anchors[None] + shifts[:, None]).reshape(-1, 4)
    fg = scores[0, a:].transpose(1, 2, 0).reshape(-1)
    d = deltas[0].transpose(1, 2, 0).reshape(-1, 4)
    boxes = bbox_transform_inv(jnp.asarray(all_anchors, d.dtype), d)
    hi = jnp.stack([info[1] - 1, info[0] - 1, info[1] - 1, info[0] - 1]).astype(d.dtype)
    boxes = jnp.clip(boxes, 0, hi)  # max(min(x, W − 1), 0)
    return boxes, fg


def proposal_layer(layer: ir.Layer, params, bottoms, ctx, config=CONFIG):
    """The built-in ``rpn.proposal_layer.ProposalLayer`` forward (module docstring), with the
    fork's ``config`` by phase."""
    if len(bottoms) != 3 or len(layer.tops) not in (1, 2):
        got = f"got {len(bottoms)} and {len(layer.tops)}"
        raise fail(layer, f"ProposalLayer takes 3 bottoms and gives 1 or 2 tops, {got}")
    scores, deltas, im_info = (lax.stop_gradient(b) for b in bottoms)
    if scores.shape[0] != 1:
        raise fail(layer, "Only single item batches are supported (ProposalLayer)")
    settings, anchors = anchor_settings(layer)
    _check_channels(layer, scores, deltas, settings, anchors)
    stride = float(settings["feat_stride"])
    pre, post, thresh, min_size = config[ctx.phase]
    info = im_info.reshape(-1)
    boxes, fg = _proposals(scores, deltas, info, stride, anchors)
    ws = boxes[:, 2] - boxes[:, 0] + 1
    hs = boxes[:, 3] - boxes[:, 1] + 1
    valid = (ws >= min_size * info[2]) & (hs >= min_size * info[2])
    order, valid = ranked(fg, valid, min(pre, fg.shape[0]))
    cand = boxes[order]
    size = min(post, order.shape[0])
    keep = greedy_keep_rows(cand, valid, thresh, iou_row(RCNN_NMS), limit=size)
    rows = jnp.concatenate([jnp.zeros_like(cand[:, :1]), cand, fg[order][:, None]], axis=1)
    out = compact(rows, keep, size, jnp.zeros((6,), rows.dtype))
    return [out[:, :5], out[:, 5:]][: len(layer.tops)]


register_builtin_python_layer("rpn.proposal_layer", "ProposalLayer", proposal_layer)
