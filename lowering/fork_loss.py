"""SoftmaxWithLoss in SegNet's form (``layer.form == "segnet"``: ``weight_by_label_freqs`` or
``class_weighting`` set), as caffe-segnet's softmax_loss_layer.cpp computes it.

* Each counted pixel's ``−log(max(p_label, FLT_MIN))`` is multiplied by
  ``class_weighting[label]`` when ``weight_by_label_freqs`` is true (one weight per class,
  checked); the ``ignore_label`` pixels do not count.
* The sum is divided by the number of counted pixels when ``normalize`` (SegNet's default:
  **true**), else by the batch size: the plain count, not the sum of the weights (read in
  both softmax_loss_layer.cpp and .cu of caffe-segnet@344c113: ``++count`` / ``counts[i] =
  1`` per non-ignored pixel). The count is not clamped: a batch with every pixel
  ignored gives 0/0, as in the fork.
* The backward, ``class_weighting[label]·(p − onehot)`` over the same divisor, is the true
  gradient of this forward (the clamp aside, which Caffe's backward ignores too).

With ``weight_by_label_freqs: false`` this equals BVLC's layer with ``normalize``.
``normalization`` (BVLC's enum, which the fork's proto does not have) is refused here.
A non-ignored label outside [0, classes) makes the loss NaN (see lowering/layers/loss.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.lowering.util import count, fail

_LOG_FLT_MIN = float(np.log(np.finfo(np.float32).tiny))


def _weights(layer: ir.Layer, classes: int, dtype) -> jax.Array | None:
    p = layer.param.loss_param
    if not p.weight_by_label_freqs:
        return None
    if len(p.class_weighting) != classes:
        raise fail(
            layer,
            f"weight_by_label_freqs needs one class_weighting per class: {classes} classes, "
            f"{len(p.class_weighting)} weights",
        )
    return jnp.asarray(list(p.class_weighting), dtype)


def segnet_softmax_loss(layer: ir.Layer, x: jax.Array, label: jax.Array, axis: int) -> list:
    """SegNet's SoftmaxWithLoss: (loss[, prob]) for scores ``x`` with classes on ``axis``."""
    p = layer.param.loss_param
    if p.HasField("normalization"):
        raise fail(layer, "SegNet's SoftmaxWithLoss reads `normalize` (default true), not "
                          "`normalization`")  # fmt: skip
    outer, classes, inner = count(x.shape, 0, axis), x.shape[axis], count(x.shape, axis + 1)
    if label.size != outer * inner:
        raise fail(layer, f"label {list(label.shape)} has {label.size} values, the scores "
                          f"{list(x.shape)} need {outer * inner}")  # fmt: skip
    z = x.reshape(outer, classes, inner)
    lab = lax.stop_gradient(label).reshape(outer, inner).astype(jnp.int32)
    safe = jnp.clip(lab, 0, classes - 1)
    picked = jnp.take_along_axis(jax.nn.log_softmax(z, axis=1), safe[:, None], axis=1)[:, 0]
    nll = -picked - lax.stop_gradient(jnp.maximum(picked, _LOG_FLT_MIN) - picked)
    weights = _weights(layer, classes, x.dtype)
    if weights is not None:
        nll = nll * weights[safe]
    valid = lab != p.ignore_label if p.HasField("ignore_label") else jnp.ones(lab.shape, bool)
    in_range = (lab >= 0) & (lab < classes)
    terms = jnp.where(valid, jnp.where(in_range, nll, jnp.nan), 0)
    normalize = p.normalize if p.HasField("normalize") else True
    divisor = jnp.sum(valid).astype(x.dtype) if normalize else jnp.asarray(outer, x.dtype)
    tops = [jnp.sum(terms) / divisor]
    if len(layer.tops) > 1:
        tops.append(lax.stop_gradient(jax.nn.softmax(x, axis=axis)))
    return tops
