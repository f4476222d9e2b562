"""The test-time outputs of a TEST net in ONNX: SoftmaxWithLoss and Accuracy
(lowering/layers/loss.py's semantics), so that a train_val prototxt's TEST net exports whole.

* SoftmaxWithLoss: ``Σ −log(max(softmax(x)[label], FLT_MIN))`` over the counted positions
  (``ignore_label`` left out) over the normaliser (VALID by default, FULL, BATCH_SIZE, NONE; at
  least 1); a label outside ``[0, classes)`` makes it NaN. Its optional second top is the
  softmax. SegNet's class-weighted form is refused.
* Accuracy: the fraction of counted positions whose true class has fewer than ``top_k`` other
  classes scoring ≥ it; its optional second top the per-class accuracy.

Other loss layers have nothing to compute at inference: they are refused, and a net that
ends in them is exported up to the blobs they read (``outputs=`` / ``--output``).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.forks.forms import FORMS
from caffe2jax.lowering.layers.loss import LOG_FLT_MIN, loss_normalization
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site

_MODE = caffe_pb2.LossParameter
#: Loss layers refused with the hint to export the blobs they read.
LOSSES = ("ContrastiveLoss", "EuclideanLoss", "HingeLoss", "InfogainLoss", "MultiBoxLoss",
          "MultinomialLogisticLoss", "SigmoidCrossEntropyLoss", "SmoothL1Loss", "CtcLoss",
          "SoftmaxWithLossOHEM", "SmoothL1LossOHEM", "MemoryLoss")  # fmt: skip


def _class_view(site: Site, axis: int) -> tuple[str, str, int]:
    """(scores as (outer, classes, inner), int64 labels as (outer, inner), classes)."""
    g = site.g
    shape = site.bottom_shapes[0]
    outer, classes = int(np.prod(shape[:axis])), shape[axis]
    inner = int(np.prod(shape[axis + 1 :]))
    if site.dynamic and not (site.batch_at(0) and site.batch_at(1)):
        site.refuse("scores or labels whose batch is not their axis 0")
    outer = -1 if site.bottom_batch[0] is not None else outer
    z = g.reshape(site.bottoms[0], [outer, classes, inner])
    lab = g.cast(g.reshape(site.bottoms[1], [outer, inner]), TensorProto.INT64)
    return z, lab, classes


def _picked(site: Site, values: str, lab: str, classes: int) -> str:
    """``values[i, lab[i, j], j]`` (labels clipped into range) as (outer, inner)."""
    g = site.g
    safe = g.op("Clip", [lab, g.i64(0), g.i64(classes - 1)])
    picked = g.op("GatherElements", [values, g.unsqueeze(safe, [1])], axis=1)
    return g.squeeze(picked, [1])


def _in_range(site: Site, lab: str, classes: int) -> str:
    g = site.g
    return g.op("And", [g.op("GreaterOrEqual", [lab, g.i64(0)]),
                        g.op("Less", [lab, g.i64(classes)])])  # fmt: skip


def _counted(site: Site, lab: str, ignore: int | None) -> str:
    g = site.g
    if ignore is None:
        return g.op("Equal", [lab, lab])
    return g.op("Not", [g.op("Equal", [lab, g.i64(ignore)])])


def _normalizer(site: Site, mode: int, lab: str, valid: str) -> str:
    g = site.g
    if mode == _MODE.VALID:
        n = g.reduce("ReduceSum", g.cast(valid, TensorProto.FLOAT), [0, 1], keepdims=False)
    elif mode == _MODE.FULL:
        n = g.cast(g.op("Size", [lab]), TensorProto.FLOAT)
    elif mode == _MODE.BATCH_SIZE:
        n = g.cast(g.reshape(g.slice(g.op("Shape", [lab]), [0], [1], [0]), []), 1)
    else:
        n = g.f32(1.0)
    return g.op("Max", [n, g.f32(1.0)])


@register("SoftmaxWithLoss")
def softmax_with_loss(site: Site) -> list[str]:
    g = site.g
    axis = site.param.softmax_param.axis % len(site.bottom_shapes[0])
    z, lab, classes = _class_view(site, axis)
    picked = _picked(site, g.op("LogSoftmax", [z], axis=1), lab, classes)
    nll = g.op("Neg", [g.op("Max", [picked, g.f32(LOG_FLT_MIN)])])
    lp = site.param.loss_param
    valid = _counted(site, lab, lp.ignore_label if lp.HasField("ignore_label") else None)
    term = g.where(valid, g.where(_in_range(site, lab, classes), nll, g.f32(np.nan)),
                   g.f32(0.0))  # fmt: skip
    total = g.reduce("ReduceSum", term, [0, 1], keepdims=False)
    norm = _normalizer(site, loss_normalization(site.layer, _MODE.VALID), lab, valid)
    tops = [g.op("Div", [total, norm])]
    if len(site.tops) > 1:
        tops.append(g.op("Softmax", [site.bottoms[0]], axis=axis))
    return tops


@register("Accuracy")
def accuracy(site: Site) -> list[str]:
    p = site.param.accuracy_param
    g = site.g
    axis = p.axis % len(site.bottom_shapes[0])
    z, lab, classes = _class_view(site, axis)
    valid = _counted(site, lab, p.ignore_label if p.HasField("ignore_label") else None)
    truth = g.unsqueeze(_picked(site, z, lab, classes), [1])
    better = g.reduce("ReduceSum", g.cast(g.op("GreaterOrEqual", [z, truth]), 1), [1], False)
    hit = g.op("And", [g.op("LessOrEqual", [better, g.f32(float(p.top_k))]), valid])
    n_valid = g.reduce("ReduceSum", g.cast(valid, 1), [0, 1], keepdims=False)
    hits = g.reduce("ReduceSum", g.cast(hit, 1), [0, 1], keepdims=False)
    acc = g.op("Div", [hits, g.op("Max", [n_valid, g.f32(1.0)])])
    bad = g.op("And", [valid, g.op("Not", [_in_range(site, lab, classes)])])
    any_bad = g.op("Greater", [g.reduce("ReduceSum", g.cast(bad, 1), [0, 1], False),
                               g.f32(0.0)])  # fmt: skip
    tops = [g.where(any_bad, g.f32(np.nan), acc)]
    if len(site.tops) > 1:
        onehot = g.op("And", [g.op("Equal", [g.unsqueeze(lab, [-1]), g.i64(np.arange(classes))]),
                              g.unsqueeze(valid, [-1])])  # fmt: skip
        totals = g.reduce("ReduceSum", g.cast(onehot, 1), [0, 1], False)
        per = g.op("And", [onehot, g.unsqueeze(hit, [-1])])
        right = g.reduce("ReduceSum", g.cast(per, 1), [0, 1], False)
        ratio = g.op("Div", [right, g.op("Max", [totals, g.f32(1.0)])])
        tops.append(g.where(g.op("Greater", [totals, g.f32(0.0)]), ratio, g.f32(0.0)))
    return tops


def refuse_loss(site: Site) -> list[str]:
    """A loss layer: nothing to compute at inference (module docstring)."""
    blobs = ", ".join(site.layer.bottom_names)
    site.refuse(f"a loss layer has no inference form; export the blobs it reads instead "
                f"(outputs=[...] / --output BLOB: {blobs})")  # fmt: skip


for _type in LOSSES:
    register(_type, form=FORMS.get(_type, ("",)))(refuse_loss)
