"""CRNN's sequence layers (yalecyu/crnn.caffe@0d95ba2): CtcLoss, LabelsequenceAccuracy and
ContinuationIndicator (CRNN also uses SSD's Permute: lowering/forks/ssd.py).

**CtcLoss** (ctc_loss_layer.cpp + its bundled warp-ctc, cpu_ctc.cuh):

* Bottoms: activations (T, N, C), time-major *unnormalised* scores (warp-ctc applies the
  softmax itself), and labels (N, L). ``alphabet_size`` must be C (warp-ctc strides the
  activations by it) and ``time_step`` (> 0) is every sequence's input length: warp-ctc reads
  the first ``time_step`` steps only. The fork's LossLayer drops BVLC's first-dimension check.
* Labels are truncated to int; every entry equal to ``blank_label`` is dropped wherever it
  stands (padding need not be trailing), the others keep their order. Any entry (padding
  included) outside [0, alphabet_size) is a CHECK failure in the fork; here it makes the loss
  NaN, as does a batch whose labels are all blank (the fork's "total length should be greater
  than 0"). ``blank_label`` itself must be a class (warp-ctc reads its probability).
* A sequence that cannot be aligned (length + repeated neighbours > time_step) costs 0 and gets
  no gradient (warp-ctc returns 0 and leaves its gradient rows unwritten).
* Forward: Σ_n −log p(l_n | x_n) / N.
* Backward: warp-ctc's gradient w.r.t. the scores is p − γ (γ the CTC occupation
  probabilities), which is exactly the autodiff gradient of −log p(l | x) with a log-softmax
  inside; the layer multiplies it by the top's diff **without dividing by N**. So Caffe's
  diff is N times the true gradient of its own forward: reproduced with a custom_vjp.
  Steps past ``time_step`` get no gradient (the fork leaves them unwritten).

**LabelsequenceAccuracy** (labelsequence_accuracy_layer.cpp): bottoms scores (N, T, C) —
batch-major, hence the Permute in CRNN's net — and labels (N, L). Per sample: argmax per step
(the first maximum), drop a step equal to its predecessor or to ``blank_label`` (the
predecessor of step 0 is the blank), and compare with the labels that are not ``blank_label``
(compared as floats, then truncated). The top is the fraction of exact matches; no backward.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.lowering.registry import register
from caffe2jax.lowering.util import fail


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _mean_with_sum_gradient(total: jax.Array, n: int) -> jax.Array:
    """``total / n`` whose backward passes the top's diff through unscaled (CtcLoss's
    Backward_cpu/gpu scale warp-ctc's per-sequence gradients by the top diff only)."""
    return total / n


def _mean_fwd(total, n):
    return total / n, None


def _mean_bwd(n, _, g):
    return (g,)


_mean_with_sum_gradient.defvjp(_mean_fwd, _mean_bwd)


def keep_slots(lengths: jax.Array, width: int) -> jax.Array:
    """(N, width) mask of the first ``lengths[n]`` slots of each row."""
    return jnp.arange(width)[None, :] < lengths[:, None]


def compact(labels: jax.Array, keep: jax.Array, fill: int = -1) -> tuple[jax.Array, jax.Array]:
    """Move the kept entries of each row to its front, in order; the rest become ``fill``.
    Returns (rows, lengths)."""
    order = jnp.argsort(~keep, axis=1, stable=True)
    moved = jnp.take_along_axis(labels, order, axis=1)
    lengths = jnp.sum(keep, axis=1)
    return jnp.where(keep_slots(lengths, labels.shape[1]), moved, fill), lengths


def greedy_decode(scores: jax.Array, blank_label: int) -> tuple[jax.Array, jax.Array]:
    """Best-path CTC decoding of (N, T, C) scores as LabelsequenceAccuracy does it: argmax per
    step, then drop repeats of the previous step and blanks. Returns (labels (N, T) padded
    with -1, lengths (N,))."""
    best = jnp.argmax(scores, axis=2).astype(jnp.int32)
    prev = jnp.concatenate([jnp.full_like(best[:, :1], blank_label), best[:, :-1]], axis=1)
    return compact(best, (best != prev) & (best != blank_label))


def _check_ctc(layer: ir.Layer, x: jax.Array, label: jax.Array) -> int:
    p = layer.param.ctc_loss_param
    if x.ndim != 3 or label.ndim != 2:
        raise fail(layer, f"needs activations (T, N, C) and labels (N, L); got "
                          f"{list(x.shape)} and {list(label.shape)}")  # fmt: skip
    if label.shape[0] != x.shape[1]:
        raise fail(layer, f"labels {list(label.shape)} need one row per sequence of the "
                          f"activations {list(x.shape)} (T, N, C): N = {x.shape[1]}")  # fmt: skip
    if p.alphabet_size != x.shape[2]:
        raise fail(layer, f"alphabet_size ({p.alphabet_size}) must equal the activations' "
                          f"class axis C = {x.shape[2]}")  # fmt: skip
    if not 0 <= p.blank_label < p.alphabet_size:
        raise fail(layer, f"blank_label ({p.blank_label}) must be in [0, alphabet_size = "
                          f"{p.alphabet_size})")  # fmt: skip
    if not 0 < p.time_step <= x.shape[0]:
        raise fail(layer, f"time_step ({p.time_step}) must be in [1, T = {x.shape[0]}] for "
                          f"activations {list(x.shape)} (T, N, C)")  # fmt: skip
    return p.time_step


@register("CtcLoss", counts=(2, 2, 1, 1), no_force_backward=(1,))
def ctc_loss(layer, params, bottoms, ctx):
    """CRNN's CtcLoss: Σ_n CTC_n / N over (T, N, C) scores; Caffe's diff is N× the gradient
    of that (see the module docstring)."""
    x, label = bottoms
    steps = _check_ctc(layer, x, label)
    p = layer.param.ctc_loss_param
    lab = lax.stop_gradient(label).astype(jnp.int32)
    keep = lab != p.blank_label
    flat, lengths = compact(lab, keep, fill=0)
    repeats = jnp.sum((flat[:, 1:] == flat[:, :-1]) & keep_slots(lengths, flat.shape[1])[:, 1:],
                      axis=1)  # fmt: skip
    feasible = lengths + repeats <= steps
    logits = jnp.transpose(x[:steps], (1, 0, 2)).astype(jnp.promote_types(x.dtype, jnp.float32))
    paddings = (~keep_slots(lengths, flat.shape[1])).astype(logits.dtype)
    import optax  # here, not at the top: optax's import is ~0.3 s of every net's start-up

    cost = optax.ctc_loss(logits, jnp.zeros(logits.shape[:2], logits.dtype), flat, paddings,
                          blank_id=p.blank_label)  # fmt: skip
    total = jnp.sum(jnp.where(feasible, cost, 0)).astype(x.dtype)
    bad = jnp.any((lab < 0) | (lab >= x.shape[2])) | (jnp.sum(lengths) == 0)
    return [jnp.where(bad, jnp.nan, _mean_with_sum_gradient(total, x.shape[1]))]


@register("LabelsequenceAccuracy", counts=(2, 2, 1, 1))
def labelsequence_accuracy(layer, params, bottoms, ctx):
    """CRNN's LabelsequenceAccuracy: the fraction of samples whose greedy CTC decoding of the
    (N, T, C) scores equals their label sequence with the blanks removed."""
    x, label = (lax.stop_gradient(b) for b in bottoms)
    if x.ndim != 3 or label.ndim != 2 or x.shape[0] != label.shape[0]:
        raise fail(layer, f"needs scores (N, T, C) and labels (N, L) with the same N; got "
                          f"{list(x.shape)} and {list(label.shape)}")  # fmt: skip
    blank = layer.param.labelsequence_accuracy_param.blank_label
    pred, pred_len = greedy_decode(x, blank)
    truth, truth_len = compact(label.astype(jnp.int32), label != blank)
    width = max(pred.shape[1], truth.shape[1])
    pred = jnp.pad(pred, ((0, 0), (0, width - pred.shape[1])), constant_values=-1)
    truth = jnp.pad(truth, ((0, 0), (0, width - truth.shape[1])), constant_values=-1)
    same = (pred_len == truth_len) & jnp.all(pred == truth, axis=1)
    return [jnp.mean(same.astype(ctx.dtype))]


@register("ContinuationIndicator", counts=(0, 0, 1, 1))
def continuation_indicator(layer, params, bottoms, ctx):
    """CRNN's ContinuationIndicatorLayer: the ``cont`` input of a recurrent layer over
    ``time_step`` steps of ``batch_size`` sequences, (T, N) of 0 at t = 0 and 1 after (each
    batch is one set of new sequences). It has no bottoms and computes no gradient."""
    p = layer.param.continuation_indicator_param
    if p.time_step <= 0 or p.batch_size <= 0:
        raise fail(layer, f"time_step ({p.time_step}) and batch_size ({p.batch_size}) must "
                          "both be positive")  # fmt: skip
    steps = jnp.arange(p.time_step)[:, None] > 0
    return [jnp.broadcast_to(steps, (p.time_step, p.batch_size)).astype(ctx.dtype)]
