"""Face recognition's margin layers: SphereFace's MarginInnerProduct (A-Softmax, wy1iu/sphereface
@f20b130, tools/caffe-sphereface; the same code in happynear/caffe-windows@504d8a8) and
L-Softmax's LargeMarginInnerProduct (wy1iu/LargeMargin_Softmax_Loss@c3e9f20).

Both take bottoms ``[x, label]`` (x flattened from ``axis``: M rows of K; M labels) and give
``[scores (M.., N), lambda (1,)]``. With c the cosine between x and the label's weight row and
s0 = sign(c), the label's score uses the fork's monotone ψ for margin m (``type``):

* SINGLE (m = 1): the plain inner product, no λ blending at all;
* DOUBLE: ψ = 2·s0·c² − 1;
* TRIPLE: s1 = sign(|c| − ½), s2 = s0·(1 + s1) − 2, ψ = s1·(4c³ − 3c) + s2;
* QUADRUPLE: s3 = s0·sign(2c² − 1), s4 = 2·s0 + s3 − 3, ψ = s3·(8c⁴ − 8c² + 1) + s4;

then every score is (that + λ·x·w)/(1 + λ), the label's being ‖x‖·ψ (A-Softmax) or
(‖x‖‖w‖ + 1e-9)·ψ (L-Softmax), the others x·w. λ = max(base·(1 + gamma·iter)^−power,
lambda_min), ``iter`` = ``iteration`` + the number of forwards this layer ran, counting this
one (the fork's ``iter_``, a member incremented by every forward, TEST ones of a TEST net
included). It is carried from one forward to the next in ``state.carry``, like a recurrent
layer's hidden state; like the fork, a resumed run starts again from ``iteration``.

**A-Softmax's weights and backward are not the true gradient** (margin_inner_product_layer.cpp):

* its forward scales every row of W to unit norm *in the blob itself*; here the forward uses the
  unit rows (so the scores are the fork's for any stored W) but the stored blob is not
  rewritten: after a solver step the fork's next forward starts from the updated unit rows,
  ours from the updated stored rows (same direction only when the stored rows had norm 1, as
  in every .caffemodel the fork writes);
* the weight diff is top_diffᵀ·x for every type, the gradient of a plain inner product with
  the unit rows (no margin, no normalisation term);
* the bottom diff of a label entry is (top_diff/(1 + λ))·(a·ŵ + b·x) where (a, b) is the true
  derivative's pair (∂ψ-term coefficients of ŵ and x) scaled to unit length √(a² + b²) = 1;
  other entries are the true gradient. A custom_vjp (:func:`_sphere_bwd`) applies these rules.

L-Softmax's backward is the true gradient of its forward (its ψ pieces joined smoothly; the
fork adds 1e-9 to ‖w‖ in the backward's ratio ‖x‖/‖w‖, a relative 1e-9 that autodiff does not).
The label is never differentiated.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.registry import Context, ParamDecl, Shape, register
from caffe2jax.lowering.util import canonical_axis, count, fail

Arrays = Sequence[jax.Array]
_TYPES = caffe_pb2.MarginInnerProductParameter.MarginType
#: margin type -> m (SINGLE 1 … QUADRUPLE 4); both forks' enums have the same values
MARGINS = {_TYPES.Value(n): m for n, m in (("SINGLE", 1), ("DOUBLE", 2), ("TRIPLE", 3),
                                            ("QUADRUPLE", 4))}  # fmt: skip


def psi(c: jax.Array, m: int) -> jax.Array:
    """The forks' ψ(θ) = (−1)^k·cos(mθ) − 2k of cosine ``c``, as their sign blobs write it."""
    s0 = jnp.sign(c)
    if m == 1:
        return c
    if m == 2:
        return 2 * s0 * c**2 - 1
    if m == 3:
        s1 = jnp.sign(jnp.abs(c) - 0.5)
        return s1 * (4 * c**3 - 3 * c) + (s0 * (1 + s1) - 2)
    s3 = s0 * jnp.sign(2 * c**2 - 1)
    return s3 * (8 * c**4 - 8 * c**2 + 1) + (2 * s0 + s3 - 3)


def psi_coefficients(c: jax.Array, m: int) -> tuple[jax.Array, jax.Array]:
    """(ψ′(c), ψ(c) − c·ψ′(c)) as the forks' backward writes them: the coefficients of w and
    of ‖w‖/‖x‖·x in the derivative of ‖x‖‖w‖ψ(c) (m ≥ 2)."""
    s0 = jnp.sign(c)
    if m == 2:
        return 4 * s0 * c, -(2 * s0 * c**2 + 1)
    if m == 3:
        s1 = jnp.sign(jnp.abs(c) - 0.5)
        return s1 * (12 * c**2 - 3), -(8 * s1 * c**3 - (s0 * (1 + s1) - 2))
    s3 = s0 * jnp.sign(2 * c**2 - 1)
    s4 = 2 * s0 + s3 - 3
    return s3 * (32 * c**3 - 16 * c), -(s3 * (24 * c**4 - 8 * c**2 - 1) - s4)


def margin_lambda(p, forwards: jax.Array) -> jax.Array:
    """λ of the forward after ``forwards`` earlier ones: max(base·(1 + γ·iter)^−power, λ_min)
    with iter = iteration + forwards + 1 (the fork's ``iter_ += 1`` before use)."""
    it = p.iteration + forwards + 1
    lam = p.base * jnp.power(1 + p.gamma * it, -p.power)
    return jnp.maximum(lam, p.lambda_min)


def _unit_rows(w: jax.Array) -> jax.Array:
    """margin_inner_product_layer.cpp: each row scaled by 1/sqrt(its dot with itself)."""
    return w * (1 / jnp.sqrt(jnp.sum(w * w, axis=1, keepdims=True)))


def _blend(plain: jax.Array, label_score: jax.Array, onehot: jax.Array, lam: jax.Array):
    """(scores with the label's replaced + λ·x·w) · 1/(1 + λ), the forks' last two steps."""
    scores = jnp.where(onehot, label_score[:, None], plain)
    return (scores + lam * plain) * (1 / (1 + lam))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def sphere_scores(x, w, onehot, lam, m: int):
    """A-Softmax's scores (M, N) of rows ``x`` (M, K) and weights ``w`` (N, K)."""
    return _sphere_fwd(x, w, onehot, lam, m)[0]


def _sphere_fwd(x, w, onehot, lam, m):
    wn = _unit_rows(w)
    plain = x @ wn.T
    norm = jnp.sqrt(jnp.sum(x * x, axis=1))
    if m == 1:
        return plain, (x, wn, onehot, lam, norm, plain)
    cos = plain * (1 / norm)[:, None]
    label_cos = jnp.sum(jnp.where(onehot, cos, 0), axis=1)
    scores = _blend(plain, norm * psi(label_cos, m), onehot, lam)
    return scores, (x, wn, onehot, lam, norm, label_cos)


def _sphere_bwd(m, res, g):
    """The fork's Backward_cpu: weight diff gᵀ·x; bottom diff as the module docstring says."""
    x, wn, onehot, lam, norm, label_cos = res
    dw = g.T @ x
    if m == 1:
        return g @ wn, dw, None, jnp.zeros_like(lam)
    a, b = psi_coefficients(label_cos, m)
    b = b / norm
    length = jnp.sqrt(a * a + b * b)
    g_label = jnp.sum(jnp.where(onehot, g, 0), axis=1) / (1 + lam)
    w_label = onehot.astype(g.dtype) @ wn
    dx = (jnp.where(onehot, 0, g) / (1 + lam)) @ wn
    dx = dx + (g_label * a / length)[:, None] * w_label + (g_label * b / length)[:, None] * x
    dx = dx + (lam / (1 + lam)) * (g @ wn)
    return dx, dw, None, jnp.zeros_like(lam)


sphere_scores.defvjp(_sphere_fwd, _sphere_bwd)


def large_margin_scores(x, w, onehot, lam, m: int):
    """L-Softmax's scores (largemargin_inner_product_layer.cpp); autodiff is its backward."""
    plain = x @ w.T
    if m == 1:
        return plain
    xw = jnp.sqrt(jnp.sum(x * x, axis=1))[:, None] * jnp.sqrt(jnp.sum(w * w, axis=1)) + 1e-9
    cos = plain / xw
    label_cos = jnp.sum(jnp.where(onehot, cos, 0), axis=1)
    label_xw = jnp.sum(jnp.where(onehot, xw, 0), axis=1)
    return _blend(plain, label_xw * psi(label_cos, m), onehot, lam)


# -- registrations -----------------------------------------------------------------------------


def _dims(layer: ir.Layer, p, shape: Shape) -> tuple[int, int]:
    axis = canonical_axis(layer, p.axis, len(shape))
    if p.num_output < 1:
        raise fail(layer, "num_output must be at least 1")
    return axis, count(shape, axis)


def _margin(layer: ir.Layer, p) -> int:
    if p.type not in MARGINS:
        raise fail(layer, f"unknown margin type {p.type}")
    return MARGINS[p.type]


def _margin_layer(layer, params, bottoms, ctx: Context, p, scores_fn):
    x, label = bottoms
    axis, k = _dims(layer, p, x.shape)
    flat = x.reshape(count(x.shape, 0, axis), k)
    if label.size != flat.shape[0]:
        raise fail(layer, f"{label.size} labels for {flat.shape[0]} rows of the first bottom")
    idx = lax.stop_gradient(label).reshape(-1).astype(jnp.int32)
    onehot = idx[:, None] == jnp.arange(p.num_output)[None, :]
    (forwards,) = ctx.carry
    lam = margin_lambda(p, forwards[0]).astype(flat.dtype)
    scores = scores_fn(flat, params[0], onehot, lax.stop_gradient(lam), _margin(layer, p))
    tops = [scores.reshape(x.shape[:axis] + (p.num_output,)), lam.reshape(1)]
    return tops[: len(layer.tops)], [forwards + 1]


@register("MarginInnerProduct", counts=(2, 2, 1, 2))
def margin_inner_product(layer, params, bottoms, ctx):
    """SphereFace's A-Softmax scores and λ (module docstring)."""
    return _margin_layer(layer, params, bottoms, ctx, layer.param.margin_inner_product_param,
                         sphere_scores)  # fmt: skip


@register("LargeMarginInnerProduct", counts=(2, 2, 1, 2))
def large_margin_inner_product(layer, params, bottoms, ctx):
    """L-Softmax's scores and λ (module docstring)."""
    p = layer.param.largemargin_inner_product_param
    return _margin_layer(layer, params, bottoms, ctx, p, large_margin_scores)


def _weights(p, layer, bottom_shapes) -> list[ParamDecl]:
    _, k = _dims(layer, p, bottom_shapes[0])
    return [ParamDecl((p.num_output, k), p.weight_filler)]


def _counter(layer, bottom_shapes) -> list[ParamDecl]:
    return [ParamDecl((1,))]


@margin_inner_product.param_shapes
def _(layer, bottom_shapes):
    return _weights(layer.param.margin_inner_product_param, layer, bottom_shapes)


@large_margin_inner_product.param_shapes
def _(layer, bottom_shapes):
    return _weights(layer.param.largemargin_inner_product_param, layer, bottom_shapes)


margin_inner_product.carry_shapes(_counter)
large_margin_inner_product.carry_shapes(_counter)
