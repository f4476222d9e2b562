"""Face recognition's other fork layers: center loss's CenterLoss (ydwen/caffe-face@48ff38e, and
happynear/caffe-windows@504d8a8's variant, form ``happynear``), and happynear's (the Caffe of
AM-Softmax): LabelSpecificAdd, Normalize (``normalize_param``, form ``happynear``; SSD's
Normalize is lowering/forks/ssd.py), InnerProduct with ``normalize: true`` (form
``happynear``) and Flip.

* **CenterLoss** (center_loss_layer.cpp): bottoms [x (M, K…), label (M,)], blob: centers
  (num_output, K) filled by ``center_filler``. d_i = x_i − c_{y_i}; loss = Σ‖d‖²/M/2. The
  bottom diff is top_diff·d/M (the true gradient). **The centers' diff is the fork's update
  rule, not a gradient**: Δc_n = −Σ_{y_i=n} d_i / (1 + #{i: y_i = n}), independent of the
  top's diff (of ``loss_weight``); the solver then applies it with the centers' lr_mult and
  decay like any diff. happynear's form multiplies Δc_n by the class's count (its CPU loop adds
  it once per sample of the class) and has ``distance_type: "L1"`` (loss Σ|d|/M, sign(d) in
  place of d in both diffs). The fork's LayerSetUp skips LossLayer's, so a CenterLoss without
  ``loss_weight`` weighs 0 (frontend/build.py).
* **LabelSpecificAdd** (label_specific_add.cpp): in TRAIN, ``bias`` is added to each row's
  label entry where that entry is above −bias; in TEST nothing (its ``transform_test`` is
  and-ed with phase TRAIN, so it never applies). With ``bias_base`` set the bias anneals:
  bias = bias_base + (1 + bias_gamma·it)^bias_power − 1 clipped to [bias_min, bias_max], it =
  ``iteration`` + the TRAIN forwards before this one (carried in ``state.carry``). Optional
  top[1]: the bias (0 in TEST, where the fork leaves it unwritten). Backward: identity.
* **Normalize** ``happynear`` (normalize_layer.cpp): per sample and position, x over the
  channels divided by √(Σx² + 1e-6) (L2) or Σ|x| + 1e-6 (L1); tops (N, C, H, W) as the fork's
  legacy 4-D Reshape writes them (a (N, C) bottom gives (N, C, 1, 1)), optional top[1] the
  norms (N, 1, H, W). Backward: the true gradient (the fork's formula); the norms' diff is
  used only with ``bp_norm``.
* **InnerProduct** ``happynear`` (``normalize: true``): every weight row divided by
  √(Σw² + 1e-6) before the product. Like A-Softmax's (lowering/forks/face.py) the fork writes
  the unit rows back into the blob and its weight diff is top_diffᵀ·x, the gradient of the
  product with the unit rows (a custom_vjp); the stored blob is not rewritten here.
* **Flip**: the width (``flip_width``, default true) and/or height axis reversed; its backward
  reverses the diff (autodiff).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.lowering.registry import Context, ParamDecl, register
from caffe2jax.lowering.util import canonical_axis, count, fail

Arrays = Sequence[jax.Array]


# -- CenterLoss -------------------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def center_loss(x, centers, idx, l1: bool, per_sample: bool):
    """The loss of rows ``x`` (M, K) about ``centers`` (N, K) for labels ``idx`` (M,)."""
    return _center_fwd(x, centers, idx, l1, per_sample)[0]


def _center_fwd(x, centers, idx, l1, per_sample):
    d = x - centers[idx]
    m = x.shape[0]
    loss = jnp.sum(jnp.abs(d)) / m if l1 else jnp.sum(d * d) / m / 2
    return loss, (jnp.sign(d) if l1 else d, idx, centers.shape[0])


def _center_bwd(l1, per_sample, res, g):
    """Bottom: top_diff·d/M. Centers: the fork's rule, not scaled by the top's diff."""
    e, idx, n = res
    onehot = (idx[:, None] == jnp.arange(n)[None, :]).astype(e.dtype)
    sums = -(onehot.T @ e)
    counts = jnp.sum(onehot, axis=0)[:, None]
    delta = sums / (counts + 1)
    if per_sample:
        delta = delta * counts
    return g * e / e.shape[0], delta, None


center_loss.defvjp(_center_fwd, _center_bwd)


def _center_rows(layer: ir.Layer, shape) -> tuple[int, int]:
    p = layer.param.center_loss_param
    axis = canonical_axis(layer, p.axis, len(shape))
    return count(shape, 0, axis), count(shape, axis)


def _center(layer, params, bottoms, per_sample: bool):
    x, label = bottoms
    m, k = _center_rows(layer, x.shape)
    if label.size != x.shape[0] or m != x.shape[0]:
        raise fail(layer, f"needs one label per item of the first bottom {list(x.shape)}, "
                          f"got label shape {list(label.shape)} (and axis 1)")  # fmt: skip
    kind = layer.param.center_loss_param.distance_type if per_sample else "L2"
    if kind not in ("L1", "L2"):
        raise fail(layer, f"distance_type must be L1 or L2, got {kind!r}")
    idx = lax.stop_gradient(label).reshape(-1).astype(jnp.int32)
    return [center_loss(x.reshape(m, k), params[0], idx, kind == "L1", per_sample)]


@register("CenterLoss", counts=(2, 2, 1, None))
def center_loss_layer(layer, params, bottoms, ctx):
    """ydwen/caffe-face's CenterLoss (module docstring)."""
    return _center(layer, params, bottoms, per_sample=False)


@register("CenterLoss", form="happynear", counts=(2, 2, 1, None))
def center_loss_happynear(layer, params, bottoms, ctx):
    """happynear/caffe-windows's CenterLoss: per-sample center diff, L1 or L2 distance."""
    return _center(layer, params, bottoms, per_sample=True)


def _centers(layer, bottom_shapes) -> list[ParamDecl]:
    p = layer.param.center_loss_param
    if p.num_output < 1:
        raise fail(layer, "num_output must be at least 1")
    _, k = _center_rows(layer, bottom_shapes[0])
    return [ParamDecl((p.num_output, k), p.center_filler)]


center_loss_layer.param_shapes(_centers)
center_loss_happynear.param_shapes(_centers)


# -- LabelSpecificAdd -------------------------------------------------------------------------


def _annealed_bias(p, it: jax.Array) -> jax.Array:
    bias = p.bias_base + jnp.power(1 + p.bias_gamma * it, p.bias_power) - 1
    return jnp.minimum(jnp.maximum(bias, p.bias_min), p.bias_max)


@register("LabelSpecificAdd", counts=(2, None, 1, 2))
def label_specific_add(layer, params, bottoms, ctx: Context):
    """AM-Softmax's margin: ``bias`` added to the label's score in TRAIN (module docstring)."""
    p = layer.param.label_specific_add_param
    x, label = bottoms[:2]
    (forwards,) = ctx.carry
    if not ctx.train:
        tops = [x, jnp.zeros((1,), x.dtype)]
        return tops[: len(layer.tops)], [forwards]
    rows = x.reshape(x.shape[0], -1)
    bias = _annealed_bias(p, p.iteration + forwards[0]) if p.HasField("bias_base") else p.bias
    bias = jnp.asarray(bias, x.dtype)
    idx = lax.stop_gradient(label).reshape(-1).astype(jnp.int32)
    hit = (idx[:, None] == jnp.arange(rows.shape[1])[None, :]) & (rows > -bias)
    tops = [jnp.where(hit, rows + bias, rows).reshape(x.shape), bias.reshape(1)]
    return tops[: len(layer.tops)], [forwards + 1]


@label_specific_add.carry_shapes
def _(layer, bottom_shapes):
    return [ParamDecl((1,))]


# -- Normalize (happynear) --------------------------------------------------------------------


def _legacy4(layer: ir.Layer, shape) -> tuple[int, int, int, int]:
    """Blob::num/channels/height/width of a blob of at most 4 axes (1 past its end)."""
    if len(shape) > 4:
        raise fail(layer, f"needs a blob of at most 4 axes, got {list(shape)}")
    full = tuple(shape) + (1,) * (4 - len(shape))
    return full[0], full[1], full[2], full[3]


@register("Normalize", form="happynear", counts=(1, 1, 1, 2))
def normalize_happynear(layer, params, bottoms, ctx):
    """happynear's NormalizeLayer: L2 or L1 over the channels (module docstring)."""
    p = layer.param.normalize_param
    x = bottoms[0].reshape(_legacy4(layer, bottoms[0].shape))
    if p.normalize_type == "L2":
        norm = jnp.sqrt(jnp.sum(x * x, axis=1, keepdims=True) + 1e-6)
    elif p.normalize_type == "L1":
        norm = jnp.sum(jnp.abs(x), axis=1, keepdims=True) + 1e-6
    else:
        raise fail(layer, f"normalize_type must be L2 or L1, got {p.normalize_type!r}")
    tops = [x / norm, norm if p.bp_norm else lax.stop_gradient(norm)]
    return tops[: len(layer.tops)]


# -- InnerProduct (happynear, normalize: true) ------------------------------------------------


@jax.custom_vjp
def unit_row_product(x, w):
    """x · (W with unit rows)ᵀ; backward: x's true diff, W's the product's (the fork's)."""
    return x @ (w * (1 / jnp.sqrt(jnp.sum(w * w, axis=1, keepdims=True) + 1e-6))).T


def _unit_fwd(x, w):
    wn = w * (1 / jnp.sqrt(jnp.sum(w * w, axis=1, keepdims=True) + 1e-6))
    return x @ wn.T, (x, wn)


def _unit_bwd(res, g):
    x, wn = res
    return g @ wn, g.T @ x


unit_row_product.defvjp(_unit_fwd, _unit_bwd)


@register("InnerProduct", form="happynear", counts=(1, 1, 1, 1))
def inner_product_normalized(layer, params, bottoms, ctx):
    """happynear's InnerProduct with ``normalize: true``: unit weight rows (module docstring)."""
    p = layer.param.inner_product_param
    if p.transpose:
        raise fail(layer, "normalize: true with transpose: true is not supported (the fork "
                          "normalises the rows of the untransposed layout)")  # fmt: skip
    (x,) = bottoms
    axis = canonical_axis(layer, p.axis, x.ndim)
    flat = x.reshape(count(x.shape, 0, axis), count(x.shape, axis))
    y = unit_row_product(flat, params[0])
    if p.bias_term:
        y = y + params[1]
    return [y.reshape(x.shape[:axis] + (p.num_output,))]


@inner_product_normalized.param_shapes
def _(layer, bottom_shapes):
    p = layer.param.inner_product_param
    shape = bottom_shapes[0]
    k = count(shape, canonical_axis(layer, p.axis, len(shape)))
    decls = [ParamDecl((p.num_output, k), p.weight_filler)]
    return decls + ([ParamDecl((p.num_output,), p.bias_filler)] if p.bias_term else [])


# -- Flip -------------------------------------------------------------------------------------


@register("Flip", counts=(1, 1, 1, 1))
def flip(layer, params, bottoms, ctx):
    """happynear's FlipLayer: width and/or height reversed on the (N, C, H, W) view."""
    p = layer.param.flip_param
    (x,) = bottoms
    y = x.reshape(_legacy4(layer, x.shape))
    axes = tuple(a for a, on in ((3, p.flip_width), (2, p.flip_height)) if on)
    return [jnp.flip(y, axes).reshape(x.shape) if axes else x]
