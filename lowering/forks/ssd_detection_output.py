"""SSD's DetectionOutput layer (weiliu89/caffe, detection_output_layer.cpp, util/bbox_util.cpp).

Bottoms: loc (N, P·L·4) laid out [prior][loc class][4] (L = 1 with ``share_location``, else
``num_classes``), conf (N, P·num_classes) laid out [prior][class] (already normalized by the
net), prior (1, 2, P·4) from PriorBox. Per image:

1. decode every prior with ``code_type`` (CORNER, CENTER_SIZE, CORNER_SIZE), with the prior's
   variances unless ``variance_encoded_in_target`` (boxes not clipped);
2. per class ≠ ``background_label_id``: the priors scoring > ``confidence_threshold`` (unset:
   every score), stable-sorted by score descending, cut to ``nms_param.top_k``, greedy NMS
   (IoU ≤ ``nms_threshold`` kept; adaptive with ``eta``);
3. if ``keep_top_k`` > −1 and more were kept, the ``keep_top_k`` best scores of the image.

Top: rows [image, label, score, xmin, ymin, xmax, ymax], by image, then label ascending, then
score descending, as (1, 1, K, 7). Caffe's K is the number kept; a compiled program needs a
static K, so K is the most that can be kept (N · min(keep_top_k, classes · min(top_k, P))) and
the rows after the kept ones are padding: all −1. When nothing is kept in the whole batch the
first N rows are the fork's "no detection" rows [i, −1, −1, −1, −1, −1, −1], as Caffe writes
them. Readers take the rows whose label (column 1) is ≥ 0.

The C++ sorts the ``keep_top_k`` selection with std::sort (not stable): among equal scores at
the cut, which one survives is unspecified there; here the lower label, then the better rank,
wins. No backward (Caffe's Backward_cpu is NOT_IMPLEMENTED): the top is data-dependent
selection, so gradients through it are stopped.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.boxes.coders import decode_boxes
from caffe2jax.lowering.boxes.iou import SSD_NMS, iou
from caffe2jax.lowering.boxes.nms import compact, greedy_keep, ranked
from caffe2jax.lowering.registry import register
from caffe2jax.lowering.util import fail

CodeType = caffe_pb2.PriorBoxParameter.CodeType


def _warn_unsaved(layer: ir.Layer) -> None:
    """The fork writes result files (VOC / COCO / ILSVRC) when ``save_output_param`` names an
    ``output_directory``; caffe2jax does not, and says so (Python shows a warning once)."""
    out = layer.param.detection_output_param.save_output_param.output_directory
    if out:
        warnings.warn(f"layer '{layer.name}' (DetectionOutput): save_output_param is not "
                      f"supported; no result files are written to {out} (the detections are "
                      "the layer's top; the solver's detection_eval is computed)",
                      UserWarning, stacklevel=2)  # fmt: skip


def detection_settings(layer: ir.Layer, num_priors: int) -> dict:
    """The layer's detection_output_param as DetectionOutputLayer::LayerSetUp reads and checks
    it (``top_k`` unset or −1: every prior); shared with the ONNX exporter."""
    p = layer.param.detection_output_param
    if not p.HasField("num_classes"):
        raise fail(layer, "must specify num_classes")
    nms = p.nms_param
    if nms.nms_threshold < 0:
        raise fail(layer, "nms_threshold must be non-negative")
    if not 0 < nms.eta <= 1:
        raise fail(layer, "eta must be in (0, 1]")
    top_k = nms.top_k if nms.HasField("top_k") and nms.top_k > -1 else num_priors
    _warn_unsaved(layer)
    return dict(
        classes=p.num_classes,
        shared=p.share_location,
        background=p.background_label_id,
        threshold=p.confidence_threshold if p.HasField("confidence_threshold") else None,
        top_k=min(top_k, num_priors),
        keep_top_k=p.keep_top_k,
        nms=nms.nms_threshold,
        eta=nms.eta,
        code=p.code_type,
        encoded=p.variance_encoded_in_target,
    )


def check_bottoms(layer: ir.Layer, loc, conf, prior, s: dict) -> int:
    """Number of priors, after Caffe's Reshape checks."""
    if prior.ndim < 3 or prior.shape[-2] != 2 or prior.shape[-1] % 4:
        raise fail(layer, f"prior bottom must be (1, 2, P·4), got shape {list(prior.shape)}")
    p = prior.shape[-1] // 4
    loc_classes = 1 if s["shared"] else s["classes"]
    if loc.size // loc.shape[0] != p * loc_classes * 4:
        raise fail(layer, f"number of priors must match number of location predictions "
                          f"(loc shape {list(loc.shape)}, {p} priors)")  # fmt: skip
    if conf.size // conf.shape[0] != p * s["classes"]:
        raise fail(layer, f"number of priors must match number of confidence predictions "
                          f"(conf shape {list(conf.shape)}, {p} priors, "
                          f"{s['classes']} classes)")  # fmt: skip
    return p


def _per_class(boxes, scores, s: dict):
    """For one image: boxes (C or 1, P, 4), scores (C, P) → (index, keep) per class (C, M)."""
    valid = jnp.ones_like(scores, bool) if s["threshold"] is None else scores > s["threshold"]
    classes = jnp.arange(scores.shape[0])
    valid = valid & (classes != s["background"])[:, None]
    order, valid = ranked(scores, valid, s["top_k"])
    cand = jnp.take_along_axis(jnp.broadcast_to(boxes, (scores.shape[0],) + boxes.shape[1:]),
                               order[..., None], axis=1)  # fmt: skip
    box = cand[..., :4]  # columns past the box (a fork's polygon) ride along, no overlap
    keep = greedy_keep(iou(box, box, SSD_NMS), valid, s["nms"], s["eta"])
    return order, keep, cand


def _image_rows(i, boxes, scores, s: dict):
    """All candidate rows (C·M, 7 + E) of image ``i`` with their keep flags (after
    keep_top_k)."""
    order, keep, cand = _per_class(boxes, scores, s)
    c, m = order.shape
    score = jnp.take_along_axis(scores, order, axis=1)
    label = jnp.broadcast_to(jnp.arange(c, dtype=scores.dtype)[:, None], (c, m))
    image = jnp.full((c, m), i, scores.dtype)
    rows = jnp.concatenate([image[..., None], label[..., None], score[..., None], cand], -1)
    rows, keep, score = rows.reshape(c * m, -1), keep.reshape(-1), score.reshape(-1)
    k = s["keep_top_k"]
    if -1 < k < c * m:
        best, _ = ranked(score, keep, k)
        chosen = jnp.zeros_like(keep).at[best].set(True)
        keep = keep & chosen
    return rows, keep


@register("DetectionOutput", counts=(3, 3, 1, 1), no_force_backward=(0, 1, 2))
def detection_output(layer, params, bottoms, ctx):
    """SSD's DetectionOutputLayer::Forward_cpu with a static, padded top (module docstring)."""
    loc, conf, prior = (lax.stop_gradient(b) for b in bottoms)
    p = prior.shape[-1] // 4
    s = detection_settings(layer, max(p, 1))
    p = check_bottoms(layer, loc, conf, prior, s)
    n = loc.shape[0]
    loc_classes = 1 if s["shared"] else s["classes"]
    priors = prior.reshape(-1, 2, p, 4)[0]
    loc = loc.reshape(n, p, loc_classes, 4).transpose(0, 2, 1, 3)
    boxes = decode_boxes(priors[0], priors[1], loc, s["code"], s["encoded"])
    scores = conf.reshape(n, p, s["classes"]).transpose(0, 2, 1)
    return [detection_rows(boxes, scores, s)]


def detection_rows(boxes, scores, s: dict):
    """The static, padded (1, 1, K, 7 + E) top from decoded ``boxes`` (N, L, P, 4 + E: the
    box, then any columns a fork's rows carry) and ``scores`` (N, C, P): per-class NMS on the
    boxes, keep_top_k, the "no detection" rows (module docstring)."""
    n = boxes.shape[0]
    rows, keep = jax.vmap(lambda i, b, c: _image_rows(i, b, c, s))(jnp.arange(n), boxes, scores)
    targets = s["classes"] - (0 <= s["background"] < s["classes"])
    per_image = max(targets, 1) * s["top_k"]
    if s["keep_top_k"] > -1:
        per_image = min(per_image, s["keep_top_k"])
    size = max(n * per_image, n)
    width = rows.shape[-1]
    fill = jnp.full((width,), -1.0, rows.dtype)
    out = compact(rows.reshape(-1, width), keep.reshape(-1), size, fill)
    none = jnp.sum(keep) == 0
    first = jnp.arange(size) < n
    out = out.at[:, 0].set(jnp.where(none & first, jnp.arange(size, dtype=out.dtype), out[:, 0]))
    return out.reshape(1, 1, size, width)
