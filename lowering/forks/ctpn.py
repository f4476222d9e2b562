"""CTPN's Caffe (tianzhi0549/CTPN@f77ec9e, caffe/src/caffe/layers/{lstm,reverse,transpose}
_layer.cpp): the three layers of CTPN's bidirectional LSTM.

* Lstm (``lstm_param``): bottoms ``x`` (T, N, …) and optionally ``clip`` (T, N); top (T, N, H),
  H = ``num_output``, I = x.count(2). Blobs in the fork's order and layout: W_x (4H, I),
  W_h (4H, H) (both from ``weight_filler``) and b (4H) (``bias_filler``); the 4H rows are the
  gates [i, f, o, g]. Per step, pre = x_t·W_xᵀ + b (+ h_{t−1}·W_hᵀ where ``cont``),
  i = σ(pre_i), f = cont ? σ(pre_f) : 0, o = σ(pre_o), g = tanh(pre_g), c_t = f·c_{t−1} + i·g,
  h_t = o·tanh(c_t); ``cont`` = clip[t, n] with a clip bottom, else t > 0. Without a clip bottom
  the state starts at zero; with one it starts from the previous forward's last (h, c) (the
  fork's c_T_/h_T_ members), carried in ``state.carry``.
  Backward: the fork's Backward_cpu is the true gradient except that it bounds every step's
  pre-gate diff to ±``clipping_threshold`` (when > 0) before it flows on (to h_{t−1}, the
  weights, b and x): :func:`bounded_grad` does that. (With a clip bottom the fork's W_h diff
  also counts steps where cont is 0 — pre_diff_t·h_{t−1} for every t ≥ 1 and pre_diff_0·h_0 —
  which the true gradient here does not; CTPN's nets have no clip bottom.)
* Reverse (``reverse_param.axis``, 0 ≤ axis < ndim, no negative axes): the bottom flipped along
  ``axis``; its backward flips the diff back (the true gradient).
* Transpose (``transpose_param.dim``, one entry per axis): top axis i is bottom axis dim[i]
  (``x.transpose(dim)``); backward the inverse permutation (the true gradient).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.lowering.registry import Context, ParamDecl, register
from caffe2jax.lowering.util import count, fail

# -- Lstm ------------------------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def bounded_grad(x: jax.Array, bound: float) -> jax.Array:
    """Identity whose backward bounds the diff to [−bound, bound] (the fork's ``caffe_bound``
    of the pre-gate diffs, lstm_layer.cpp Backward_cpu): not the derivative of the forward."""
    return x


def _bounded_fwd(x, bound):
    return x, None


def _bounded_bwd(bound, _, g):
    return (jnp.clip(g, -bound, bound),)


bounded_grad.defvjp(_bounded_fwd, _bounded_bwd)


def lstm_steps(pre_x, w_h, cont, h0, c0, bound: float):
    """The fork's recurrence over (T, N, 4H) input pre-gates; returns (h over T, h_T, c_T)."""
    hidden = w_h.shape[1]

    def step(carry, inputs):
        h_prev, c_prev = carry
        pre_t, cont_t = inputs
        on = cont_t[:, None]
        pre = pre_t + jnp.where(on, h_prev @ w_h.T, jnp.zeros_like(pre_t))
        if bound > 0:
            pre = bounded_grad(pre, bound)
        i, f, o, g = (pre[:, k * hidden : (k + 1) * hidden] for k in range(4))
        f_gate = jnp.where(on, jax.nn.sigmoid(f), jnp.zeros_like(f))
        c = f_gate * c_prev + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    (h_t, c_t), hs = lax.scan(step, (h0, c0), (pre_x, cont))
    return hs, h_t, c_t


@register("Lstm", counts=(1, 2, 1, 1))
def lstm(layer, params, bottoms, ctx: Context):
    """CTPN's LstmLayer forward (module docstring)."""
    p = layer.param.lstm_param
    x = bottoms[0]
    if x.ndim < 2:
        raise fail(layer, f"the bottom must be (T, N, ...), got shape {list(x.shape)}")
    t_len, n = x.shape[0], x.shape[1]
    w_x, w_h, b = params
    if count(x.shape, 2) != w_x.shape[1]:
        raise fail(layer, f"input size {count(x.shape, 2)} differs from W_x's {w_x.shape[1]}")
    pre_x = x.reshape(t_len, n, -1) @ w_x.T + b
    if len(bottoms) == 2:
        clip = lax.stop_gradient(bottoms[1])
        if clip.size != t_len * n:
            raise fail(layer, f"the clip bottom must be (T, N) = ({t_len}, {n}), "
                              f"got {list(clip.shape)}")  # fmt: skip
        cont = clip.reshape(t_len, n) != 0
        h0, c0 = ctx.carry
    else:
        cont = jnp.broadcast_to((jnp.arange(t_len) > 0)[:, None], (t_len, n))
        h0 = c0 = jnp.zeros((n, p.num_output), pre_x.dtype)
    hs, h_t, c_t = lstm_steps(pre_x, w_h, cont, h0, c0, float(p.clipping_threshold))
    if len(bottoms) == 2:
        return [hs], [lax.stop_gradient(h_t), lax.stop_gradient(c_t)]
    return [hs]


@lstm.param_shapes
def _(layer, bottom_shapes):
    p = layer.param.lstm_param
    if p.num_output <= 0:
        raise fail(layer, "lstm_param.num_output must be set (the number of hidden units)")
    h, i = p.num_output, count(bottom_shapes[0], 2)
    return [ParamDecl((4 * h, i), p.weight_filler), ParamDecl((4 * h, h), p.weight_filler),
            ParamDecl((4 * h,), p.bias_filler)]  # fmt: skip


@lstm.carry_shapes
def _(layer, bottom_shapes):
    if len(bottom_shapes) < 2:
        return []
    shape = (bottom_shapes[0][1], layer.param.lstm_param.num_output)
    return [ParamDecl(shape), ParamDecl(shape)]


# -- Reverse, Transpose ----------------------------------------------------------------------


@register("Reverse", counts=(1, 1, 1, 1))
def reverse(layer, params, bottoms, ctx: Context):
    """CTPN's ReverseLayer: the bottom flipped along ``reverse_param.axis``."""
    (x,) = bottoms
    axis = layer.param.reverse_param.axis
    if x.ndim == 0 or not 0 <= axis < x.ndim:
        raise fail(layer, f"axis {axis} must be in [0, {x.ndim}) (no negative axes here)")
    return [jnp.flip(x, axis)]


@register("Transpose", counts=(1, 1, 1, 1))
def transpose(layer, params, bottoms, ctx: Context):
    """CTPN's TransposeLayer: top axis i is bottom axis ``dim[i]``."""
    (x,) = bottoms
    dim = list(layer.param.transpose_param.dim)
    if sorted(dim) != list(range(x.ndim)):
        raise fail(layer, f"transpose_param.dim {dim} must be a permutation of the bottom's "
                          f"{x.ndim} axes")  # fmt: skip
    return [jnp.transpose(x, dim)]
