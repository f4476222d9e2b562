"""Loss layers and Accuracy, as Caffe's LossLayer subclasses compute them (BVLC 9b89154).

Conventions reproduced throughout:

- The loss top is a 0-d blob holding the *unweighted* loss; the graph multiplies by
  ``loss_weight`` (which is also the diff Caffe's backward starts from).
- LossLayer::Reshape requires bottom 0 and bottom 1 to share their first dimension.
- Labels arrive as floats and are truncated to int (``static_cast<int>``). Caffe refuses to
  differentiate them (``no_force_backward``), and they carry no gradient here.
- The normaliser (SoftmaxWithLoss, SigmoidCrossEntropyLoss, InfogainLoss) is
  ``max(1, n)`` for FULL, VALID, BATCH_SIZE or NONE; legacy ``normalize`` maps to VALID/BATCH_SIZE.
- Out-of-range labels: Caffe only DCHECKs them (a debug-build abort; release builds read
  stray memory). Here a non-ignored label outside [0, classes) makes the loss (or the
  accuracy) NaN, so the mistake shows instead of training silently on garbage.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from google.protobuf.message import DecodeError
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.registry import register
from caffe2jax.lowering.util import canonical_axis, count, fail

_MODE = caffe_pb2.LossParameter
LOG_FLT_MIN = float(np.log(np.finfo(np.float32).tiny))  # Caffe clamps prob at FLT_MIN
_LOG_THRESHOLD = 1e-20  # Caffe's kLOG_THRESHOLD (InfogainLoss, MultinomialLogisticLoss)

# -- shared helpers -----------------------------------------------------------------------


def check_first_dim(layer: ir.Layer, a: jax.Array, b: jax.Array) -> None:
    """LossLayer::Reshape: the data and label share their first dimension."""
    if a.ndim == 0 or b.ndim == 0 or a.shape[0] != b.shape[0]:
        raise fail(
            layer,
            "the data and label should have the same first dimension: "
            f"'{layer.bottom_names[0]}' {list(a.shape)}, '{layer.bottom_names[1]}' {list(b.shape)}",
        )


def loss_normalization(layer: ir.Layer, default: int) -> int:
    """``normalization`` if set, else legacy ``normalize`` (true: VALID, false: BATCH_SIZE)."""
    lp = layer.param.loss_param
    if lp.HasField("normalization"):
        return lp.normalization
    if lp.HasField("normalize"):
        return _MODE.VALID if lp.normalize else _MODE.BATCH_SIZE
    return default


def _normalizer(mode: int, outer: int, inner: int, valid: jax.Array, dtype) -> jax.Array:
    """Caffe's get_normalizer: FULL outer·inner, VALID the non-ignored count, BATCH_SIZE
    outer, NONE 1; at least 1 (a batch with every label ignored gives loss 0, not NaN)."""
    n = {
        _MODE.FULL: outer * inner,
        _MODE.VALID: jnp.sum(valid),
        _MODE.BATCH_SIZE: outer,
        _MODE.NONE: 1,
    }[mode]
    return jnp.maximum(jnp.asarray(n, dtype), 1)


def _class_view(layer: ir.Layer, x: jax.Array, label: jax.Array, axis: int):
    """x as (outer, classes, inner) and the labels as int (outer, inner), checking that there
    is one label per position outside ``axis``."""
    outer, classes, inner = count(x.shape, 0, axis), x.shape[axis], count(x.shape, axis + 1)
    if label.size != outer * inner:
        raise fail(
            layer,
            f"label '{layer.bottom_names[1]}' {list(label.shape)} has {label.size} values but "
            f"'{layer.bottom_names[0]}' {list(x.shape)} needs {outer * inner}: one per position "
            f"outside axis {axis}, with integer values in [0, {classes})",
        )
    lab = lax.stop_gradient(label).reshape(outer, inner).astype(jnp.int32)
    return x.reshape(outer, classes, inner), lab


def _counted(lab: jax.Array, ignore_label: int | None) -> jax.Array:
    """True where a label counts (not ``ignore_label``)."""
    if ignore_label is None:
        return jnp.ones(lab.shape, bool)
    return lab != ignore_label


def _loss_valid(layer: ir.Layer, lab: jax.Array) -> jax.Array:
    lp = layer.param.loss_param
    return _counted(lab, lp.ignore_label if lp.HasField("ignore_label") else None)


def _pick(values: jax.Array, lab: jax.Array) -> jax.Array:
    """values[i, lab[i, j], j] for (outer, classes, inner) values (label clipped in range)."""
    safe = jnp.clip(lab, 0, values.shape[1] - 1)
    return jnp.take_along_axis(values, safe[:, None, :], axis=1)[:, 0, :]


def _masked(term: jax.Array, lab: jax.Array, classes: int, valid: jax.Array) -> jax.Array:
    """Zero where ignored; NaN where a counted label is out of [0, classes)."""
    in_range = (lab >= 0) & (lab < classes)
    return jnp.where(valid, jnp.where(in_range, term, jnp.nan), 0)


# -- SoftmaxWithLoss ----------------------------------------------------------------------


@register("SoftmaxWithLoss", counts=(2, 2, 1, 2), no_force_backward=(1,))
def softmax_with_loss(layer, params, bottoms, ctx):
    """Σ −log(max(softmax(x)[label], FLT_MIN)) over counted positions / normaliser.

    Default normalisation VALID. The optional 2nd top is the softmax; Caffe's backward reads
    only the loss top's diff, so the prob top carries no gradient (stop_gradient).
    """
    x, label = bottoms
    check_first_dim(layer, x, label)
    axis = canonical_axis(layer, layer.param.softmax_param.axis, x.ndim)
    z, lab = _class_view(layer, x, label, axis)
    picked = _pick(jax.nn.log_softmax(z, axis=1), lab)
    # The value is Caffe's clamped −log(max(p, FLT_MIN)); the gradient stays p − onehot, as
    # Caffe's backward ignores the clamp.
    nll = -picked - lax.stop_gradient(jnp.maximum(picked, LOG_FLT_MIN) - picked)
    valid = _loss_valid(layer, lab)
    mode = loss_normalization(layer, _MODE.VALID)
    norm = _normalizer(mode, z.shape[0], z.shape[2], valid, x.dtype)
    tops = [jnp.sum(_masked(nll, lab, z.shape[1], valid)) / norm]
    if len(layer.tops) > 1:
        tops.append(lax.stop_gradient(jax.nn.softmax(x, axis=axis)))
    return tops


# -- SigmoidCrossEntropyLoss --------------------------------------------------------------


@register("SigmoidCrossEntropyLoss", counts=(2, 2, 1, 1), no_force_backward=(1,))
def sigmoid_cross_entropy_loss(layer, params, bottoms, ctx):
    """Σ softplus(x) − x·t over positions whose int(t) is not ignore_label / normaliser.

    Default normalisation BATCH_SIZE (outer = shape(0)); gradient σ(x) − t.
    """
    x, target = bottoms
    check_first_dim(layer, x, target)
    if x.size != target.size:
        raise fail(
            layer,
            f"inputs must have the same count: '{layer.bottom_names[0]}' {list(x.shape)}, "
            f"'{layer.bottom_names[1]}' {list(target.shape)}",
        )
    t = lax.stop_gradient(target).reshape(x.shape)
    valid = _loss_valid(layer, t.astype(jnp.int32))
    term = jnp.where(valid, jax.nn.softplus(x) - x * t, 0)
    mode = loss_normalization(layer, _MODE.BATCH_SIZE)
    norm = _normalizer(mode, x.shape[0], count(x.shape, 1), valid, x.dtype)
    return [jnp.sum(term) / norm]


# -- EuclideanLoss ------------------------------------------------------------------------


@register("EuclideanLoss", counts=(2, 2, 1, 1))
def euclidean_loss(layer, params, bottoms, ctx):
    """Σ(a − b)² / N / 2, N = shape(0); both bottoms get a gradient (and may be forced)."""
    a, b = bottoms
    check_first_dim(layer, a, b)
    if count(a.shape, 1) != count(b.shape, 1):
        raise fail(
            layer,
            f"inputs must have the same dimension: '{layer.bottom_names[0]}' {list(a.shape)}, "
            f"'{layer.bottom_names[1]}' {list(b.shape)}",
        )
    diff = a - b.reshape(a.shape)
    return [jnp.sum(diff * diff) / a.shape[0] / 2]


# -- HingeLoss ----------------------------------------------------------------------------


@register("HingeLoss", counts=(2, 2, 1, 1), no_force_backward=(1,))
def hinge_loss(layer, params, bottoms, ctx):
    """Σ max(0, 1 − δ·x) / N with δ = +1 at the label and −1 elsewhere (L2: squared).

    The hinge has gradient 0 where 1 − δ·x is exactly 0, as Caffe's sign().
    """
    x, label = bottoms
    check_first_dim(layer, x, label)
    num, dim = x.shape[0], count(x.shape, 1)
    scores = x.reshape(num, dim)
    lab = lax.stop_gradient(label).reshape(-1)[:num].astype(jnp.int32)
    at_label = lab[:, None] == jnp.arange(dim)[None, :]
    margin = 1 + jnp.where(at_label, -scores, scores)
    hinge = jnp.where(margin > 0, margin, 0)
    if layer.param.hinge_loss_param.norm == caffe_pb2.HingeLossParameter.L2:
        hinge = hinge * hinge
    loss = jnp.sum(hinge) / num
    return [jnp.where(jnp.all((lab >= 0) & (lab < dim)), loss, jnp.nan)]


# -- ContrastiveLoss ----------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _margin_sq(dist_sq: jax.Array, margin: float) -> jax.Array:
    """max(margin − √d², 0)² for the dissimilar pairs of ContrastiveLoss.

    custom_vjp because Caffe's backward divides by (d + 1e-4), not d: the gradient w.r.t. d²
    is −max(margin − d, 0) / (d + 1e-4), which also stays finite at d = 0.
    """
    return jnp.square(jnp.maximum(margin - jnp.sqrt(dist_sq), 0))


def _margin_sq_fwd(dist_sq, margin):
    return _margin_sq(dist_sq, margin), dist_sq


def _margin_sq_bwd(margin, dist_sq, g):
    dist = jnp.sqrt(dist_sq)
    short = margin - dist
    return (g * jnp.where(short > 0, -short / (dist + 1e-4), 0),)


_margin_sq.defvjp(_margin_sq_fwd, _margin_sq_bwd)


def _check_contrastive(layer: ir.Layer, a: jax.Array, b: jax.Array, sim: jax.Array) -> None:
    """ContrastiveLossLayer::LayerSetUp: a, b (N, C, 1, 1) alike; similarity (N, 1, 1, 1)."""
    names = layer.bottom_names
    if a.shape[:2] != b.shape[:2] or any(d != 1 for d in a.shape[2:] + b.shape[2:]):
        raise fail(
            layer,
            f"bottoms '{names[0]}' {list(a.shape)} and '{names[1]}' {list(b.shape)} must both "
            "be (N, C, 1, 1) with the same C",
        )
    if sim.ndim == 0 or any(d != 1 for d in sim.shape[1:]) or sim.shape[0] != a.shape[0]:
        raise fail(
            layer, f"similarity '{names[2]}' {list(sim.shape)} must be ({a.shape[0]}, 1, 1, 1)"
        )


@register("ContrastiveLoss", counts=(3, 3, 1, 1), no_force_backward=(2,))
def contrastive_loss(layer, params, bottoms, ctx):
    """Σ [y ? d² : max(margin − d, 0)²] / N / 2 with d = ‖a − b‖ (int(y) ≠ 0: similar).

    ``legacy_version`` uses max(margin − d², 0) for dissimilar pairs.
    """
    a, b, sim = bottoms
    check_first_dim(layer, a, b)
    _check_contrastive(layer, a, b, sim)
    p = layer.param.contrastive_loss_param
    n = a.shape[0]
    diff = (a - b).reshape(n, -1)
    dist_sq = jnp.sum(diff * diff, axis=1)
    similar = lax.stop_gradient(sim).reshape(n).astype(jnp.int32) != 0
    if p.legacy_version:
        short = p.margin - dist_sq
        dissimilar = jnp.where(short > 0, short, 0)
    else:
        dissimilar = _margin_sq(dist_sq, p.margin)
    return [jnp.sum(jnp.where(similar, dist_sq, dissimilar)) / n / 2]


# -- InfogainLoss -------------------------------------------------------------------------


def _read_blob(path: str) -> np.ndarray:
    """The values of a binary BlobProto file (Caffe's ReadProtoFromBinaryFile + FromProto),
    parsed once per version of the file."""
    stat = Path(path).stat()
    return _parse_blob(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _parse_blob(path: str, mtime_ns: int, size: int) -> np.ndarray:
    blob = caffe_pb2.BlobProto()
    blob.ParseFromString(Path(path).read_bytes())
    values = blob.double_data if len(blob.double_data) else blob.data
    return np.asarray(values, np.float64)


def _infogain_matrix(layer: ir.Layer, bottoms, classes: int, dtype) -> jax.Array:
    """H from bottom 2, else from infogain_param.source; it must hold classes² values."""
    if len(bottoms) > 2:
        h, where = bottoms[2], f"bottom '{layer.bottom_names[2]}' {list(bottoms[2].shape)}"
    else:
        source = layer.param.infogain_loss_param.source
        if not source:
            raise fail(layer, "Infogain matrix source must be specified (or give a 3rd bottom)")
        try:
            h = jnp.asarray(_read_blob(source), dtype)
        except (OSError, ValueError, DecodeError) as err:
            raise fail(layer, f"cannot read the infogain matrix '{source}': {err}") from None
        where = f"source '{source}'"
    if h.size != classes * classes:
        raise fail(layer, f"H from {where} has {h.size} values; {classes} classes need {classes}²")
    # Caffe cannot back-propagate to H (LOG(FATAL)): it carries no gradient.
    return lax.stop_gradient(h).reshape(classes, classes)


@register("InfogainLoss", counts=(2, 3, 1, 2), no_force_backward=(1, 2))
def infogain_loss(layer, params, bottoms, ctx):
    """−Σ_l H[label, l]·log(max(softmax(x)_l, 1e-20)) over counted positions / normaliser.

    This version takes logits (it applies softmax along ``axis`` itself); normalisation
    defaults to VALID and the legacy ``normalize`` is refused, as in Caffe. The optional 2nd
    top is the softmax, with no gradient (Caffe's backward ignores its diff).
    """
    if layer.param.loss_param.HasField("normalize"):
        raise fail(layer, 'normalize is deprecated. use "normalization"')
    x, label = bottoms[:2]
    check_first_dim(layer, x, label)
    axis = canonical_axis(layer, layer.param.infogain_loss_param.axis, x.ndim)
    z, lab = _class_view(layer, x, label, axis)
    classes = z.shape[1]
    h = _infogain_matrix(layer, bottoms, classes, x.dtype)
    logp = jax.nn.log_softmax(z, axis=1)
    # Caffe's value clamps p at 1e-20; its gradient p·ΣH[label] − H[label] ignores the clamp.
    logp = logp + lax.stop_gradient(jnp.maximum(logp, np.log(_LOG_THRESHOLD)) - logp)
    rows = jnp.moveaxis(h[jnp.clip(lab, 0, classes - 1)], -1, 1)  # (outer, classes, inner)
    term = -jnp.sum(rows * logp, axis=1)
    valid = _loss_valid(layer, lab)
    norm = _normalizer(layer.param.loss_param.normalization, z.shape[0], z.shape[2], valid, x.dtype)
    tops = [jnp.sum(_masked(term, lab, classes, valid)) / norm]
    if len(layer.tops) > 1:
        tops.append(lax.stop_gradient(jax.nn.softmax(x, axis=axis)))
    return tops


# -- MultinomialLogisticLoss --------------------------------------------------------------


@register("MultinomialLogisticLoss", counts=(2, 2, 1, 1), no_force_backward=(1,))
def multinomial_logistic_loss(layer, params, bottoms, ctx):
    """−Σ log(max(p[label], 1e-20)) / N over probabilities p (N, C, 1, 1) and labels (N,).

    Caffe's gradient −1/max(p, 1e-20) at the label is kept below the clamp too.
    """
    x, label = bottoms
    check_first_dim(layer, x, label)
    if any(d != 1 for d in label.shape[1:]):
        raise fail(
            layer, f"label '{layer.bottom_names[1]}' {list(label.shape)} must be (N, 1, 1, 1)"
        )
    num, dim = x.shape[0], count(x.shape, 1)
    lab = lax.stop_gradient(label).reshape(num).astype(jnp.int32)
    prob = _pick(x.reshape(num, dim, 1), lab[:, None])[:, 0]
    prob = prob + lax.stop_gradient(jnp.maximum(prob, _LOG_THRESHOLD) - prob)
    loss = -jnp.sum(jnp.log(prob)) / num
    return [jnp.where(jnp.all((lab >= 0) & (lab < dim)), loss, jnp.nan)]


# -- Accuracy -----------------------------------------------------------------------------


@register("Accuracy", counts=(2, 2, 1, 2))
def accuracy(layer, params, bottoms, ctx):
    """Fraction of counted positions whose true class scores among the top_k.

    A position is right when fewer than top_k *other* classes score >= the true class (ties
    count against it). 0 when nothing is counted. The optional 2nd top holds per-class
    accuracy (0 for a class with no counted label). No backward: outputs carry no gradient.
    """
    p = layer.param.accuracy_param
    x, label = (lax.stop_gradient(b) for b in bottoms)
    axis = canonical_axis(layer, p.axis, x.ndim)
    z, lab = _class_view(layer, x, label, axis)
    classes = z.shape[1]
    if p.top_k > x.size // max(label.size, 1):
        raise fail(layer, f"top_k {p.top_k} must be at most the number of classes {classes}")
    valid = _counted(lab, p.ignore_label if p.HasField("ignore_label") else None)
    better = jnp.sum(z >= _pick(z, lab)[:, None, :], axis=1)  # counts the true class too
    hit = (better <= p.top_k) & valid
    dtype = x.dtype
    n_valid = jnp.sum(valid).astype(dtype)
    acc = jnp.where(n_valid > 0, jnp.sum(hit).astype(dtype) / jnp.maximum(n_valid, 1), 0)
    in_range = (lab >= 0) & (lab < classes)
    tops = [jnp.where(jnp.all(in_range | ~valid), acc, jnp.nan)]
    if len(layer.tops) > 1:
        onehot = (lab[..., None] == jnp.arange(classes)) & valid[..., None]
        totals = jnp.sum(onehot, axis=(0, 1)).astype(dtype)
        hits = jnp.sum(onehot & hit[..., None], axis=(0, 1)).astype(dtype)
        tops.append(jnp.where(totals > 0, hits / jnp.maximum(totals, 1), 0))
    return tops
