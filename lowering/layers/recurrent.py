"""Recurrent layers: RNN, LSTM (Caffe's RecurrentLayer, as one lax.scan over time) and
LSTMUnit. (CRNN's ContinuationIndicator, which makes their ``cont`` input: lowering/forks/crnn.py.)

Caffe unrolls a RecurrentLayer into an inner net over its T timesteps; here one ``lax.scan``
runs the same step. What is reproduced, from Caffe's RecurrentLayer/RNNLayer/LSTMLayer and
LSTMUnitLayer:

- Bottoms ``x`` (T, N, ...), ``cont`` (T, N), an optional static input ``x_static`` (N, ...),
  then, with ``expose_hidden``, the initial state ``h0`` (and ``c0`` for LSTM), each (1, N, D).
  Tops: the output sequence (T, N, D), then, with ``expose_hidden``, ``hT`` (and ``cT``).
- ``x`` enters an InnerProduct over axes 2.. and ``x_static`` one over axes 1.. (no bias).
- ``cont_t = 0`` starts a new sequence: the previous hidden state is multiplied by ``cont_t``
  (and LSTM's forget gate becomes ``cont_t·σ(f)``).
- RNN: ``h_t = tanh(W_hh·(cont_t·h_{t−1}) + W_xh·x_t + b_h [+ W_xh_static·x_static])``,
  ``o_t = tanh(W_ho·h_t + b_o)``; blobs W_xh, b_h, [W_xh_static], W_hh, W_ho, b_o.
- LSTM: gates ``W_hc·(cont_t·h_{t−1}) + W_xc·x_t + b_c [+ W_xc_static·x_static]`` in the
  order i, f, o, g, fed to LSTMUnit; blobs W_xc, b_c, [W_xc_static], W_hc.
- Weights use ``recurrent_param.weight_filler``, biases ``bias_filler``.
- No diff reaches ``cont`` (Caffe refuses to back-propagate to sequence indicators).
- With ``expose_hidden``, Caffe shares only the *data* of the ``h0``/``c0`` bottoms and the
  ``hT``/``cT`` tops with its inner net, never their diffs: the initial-state bottoms get no
  gradient and the final-state tops' diffs are ignored. Both are stop_gradient here.
- Without ``expose_hidden``, Caffe's layer copies ``h_T`` (and ``c_T``) into ``h_0`` before
  each forward, so the state carries across successive forward calls (truncated BPTT when
  ``cont`` is 1 at a batch's first step): the layer declares them as carried values
  (``carry_shapes``), which the graph threads through ``state``, zeros at first, with no
  gradient, and never in a weights file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.lowering.registry import ParamDecl, Shape, register
from caffe2jax.lowering.util import count, fail


@dataclass(frozen=True)
class _Layout:
    """Where a recurrent layer's bottoms sit, and its sizes (Caffe's RecurrentLayer setup)."""

    steps: int  # T
    streams: int  # N
    hidden: int  # D = num_output
    inputs: int  # I = count(x, 2)
    static_inputs: int  # count(x_static, 1), 0 without a static input
    static: bool
    exposed: int  # number of initial-state bottoms (0 without expose_hidden)


def _layout(layer: ir.Layer, shapes: Sequence[Shape], num_states: int) -> _Layout:
    """Validate bottoms and tops the way Caffe's RecurrentLayer::LayerSetUp does."""
    p = layer.param.recurrent_param
    exposed = num_states if p.expose_hidden else 0
    names = ["x", "cont", "[x_static]", "h0", "c0"][: 3 + exposed]
    if not 2 + exposed <= len(shapes) <= 3 + exposed:
        raise fail(
            layer,
            f"takes bottoms {', '.join(names)} (expose_hidden: {bool(p.expose_hidden)}); "
            f"got {len(shapes)} bottom(s)",
        )
    if len(layer.tops) != 1 + exposed:
        tops = "the output" + (", then the final state(s)" if exposed else "")
        raise fail(layer, f"needs {1 + exposed} top(s) ({tops}); got {len(layer.tops)}")
    if p.num_output <= 0:
        raise fail(layer, "recurrent_param.num_output must be positive")
    x, cont = shapes[0], shapes[1]
    if len(x) < 2:
        raise fail(layer, f"bottom x must have at least 2 axes (T, N, ...); got {list(x)}")
    steps, streams = x[0], x[1]
    if tuple(cont) != (steps, streams):
        raise fail(layer, f"bottom cont must have shape [{steps}, {streams}]; got {list(cont)}")
    static = len(shapes) > 2 + exposed
    if static and (len(shapes[2]) < 1 or shapes[2][0] != streams):
        raise fail(layer, f"static input must have shape [{streams}, ...]; got {list(shapes[2])}")
    state_shape = (1, streams, p.num_output)
    for i, shape in enumerate(shapes[2 + static :]):
        if tuple(shape) != state_shape:
            raise fail(
                layer,
                f"initial-state bottom {2 + static + i} must have shape {list(state_shape)}; "
                f"got {list(shape)}",
            )
    return _Layout(
        steps,
        streams,
        p.num_output,
        count(x, 2),
        count(shapes[2], 1) if static else 0,
        static,
        exposed,
    )


def _split_bottoms(layout: _Layout, bottoms: Sequence[jax.Array]):
    """(x as (T, N, I), cont as (T, N) with no gradient, x_static as (N, S) or None, states)."""
    x = jnp.reshape(bottoms[0], (layout.steps, layout.streams, layout.inputs))
    cont = lax.stop_gradient(bottoms[1]).astype(x.dtype)
    static = jnp.reshape(bottoms[2], (layout.streams, -1)) if layout.static else None
    first = 2 + layout.static
    states = [lax.stop_gradient(b) for b in bottoms[first : first + layout.exposed]]
    return x, cont, static, states


def _ip(x: jax.Array, w: jax.Array, b: jax.Array | None = None) -> jax.Array:
    """Caffe's InnerProduct on the last axis: x·wᵀ (+ b), w stored (out, in)."""
    y = jnp.matmul(x, jnp.swapaxes(w, 0, 1))
    return y if b is None else y + b


def _initial(layout: _Layout, states, index: int, ctx) -> jax.Array:
    """Initial state ``index`` as (N, D): the exposed bottom, else the carried last state of
    the previous forward (zeros at first)."""
    if states:
        return jnp.reshape(states[index], (layout.streams, layout.hidden))
    return ctx.carry[index]


def _carry_decls(layer: ir.Layer, bottom_shapes, num_states: int) -> list[ParamDecl]:
    """h (and c) of the last step, carried into the next forward unless expose_hidden."""
    layout = _layout(layer, bottom_shapes, num_states)
    if layout.exposed:
        return []
    return [ParamDecl((layout.streams, layout.hidden))] * num_states


def _recurrent_decls(layer: ir.Layer, layout: _Layout, gates: int) -> list[ParamDecl]:
    """W_x (G·D × I), b (G·D), [W_x_static (G·D × S)], W_h (G·D × D)."""
    p = layer.param.recurrent_param
    width = gates * layout.hidden
    decls = [
        ParamDecl((width, layout.inputs), p.weight_filler),
        ParamDecl((width,), p.bias_filler),
    ]
    if layout.static:
        decls.append(ParamDecl((width, layout.static_inputs), p.weight_filler))
    decls.append(ParamDecl((width, layout.hidden), p.weight_filler))
    return decls


# --- RNN ------------------------------------------------------------------------------------


@register("RNN", no_force_backward=(1,))
def rnn(layer, params, bottoms, ctx):
    """Caffe's RNNLayer: a tanh recurrence, then a tanh output layer (see the module doc)."""
    layout = _layout(layer, [b.shape for b in bottoms], 1)
    x, cont, static, states = _split_bottoms(layout, bottoms)
    w_xh, b_h = params[0], params[1]
    w_static = params[2] if layout.static else None
    w_hh, w_ho, b_o = params[2 + layout.static :]
    x_proj = _ip(x, w_xh, b_h)
    static_proj = _ip(static, w_static) if layout.static else None

    def step(h, inputs):
        x_t, cont_t = inputs
        pre = _ip(cont_t[:, None] * h, w_hh) + x_t
        if static_proj is not None:
            pre = pre + static_proj
        h = jnp.tanh(pre)
        return h, h

    h_last, hs = lax.scan(step, _initial(layout, states, 0, ctx), (x_proj, cont))
    out = jnp.tanh(_ip(hs, w_ho, b_o))
    if not layout.exposed:
        return [out], [h_last]
    return [out, lax.stop_gradient(h_last[None])]


@rnn.param_shapes
def _(layer, bottom_shapes):
    layout = _layout(layer, bottom_shapes, 1)
    p = layer.param.recurrent_param
    d = layout.hidden
    decls = _recurrent_decls(layer, layout, 1)
    return decls + [ParamDecl((d, d), p.weight_filler), ParamDecl((d,), p.bias_filler)]


@rnn.carry_shapes
def _(layer, bottom_shapes):
    return _carry_decls(layer, bottom_shapes, 1)


# --- LSTM -----------------------------------------------------------------------------------


@jax.custom_jvp
def _forget_gate(pre: jax.Array, cont: jax.Array) -> jax.Array:
    """LSTMUnit's ``f = cont·σ(pre)`` (exactly 0 where cont is 0)."""
    return jnp.where(cont == 0, jnp.zeros_like(pre), cont * jax.nn.sigmoid(pre))


@_forget_gate.defjvp
def _forget_gate_jvp(primals, tangents):
    # Caffe's LSTMUnit backward uses f·(1 − f) as the gate's derivative, with f = cont·σ(pre);
    # the true derivative is cont·σ·(1 − σ). They agree for cont ∈ {0, 1}, not for fractional
    # cont, so this rule reproduces Caffe's. cont gets no derivative (Caffe refuses one).
    # A JVP rule (not a custom_vjp) keeps forward-mode working; JAX transposes it for grads.
    pre, cont = primals
    d_pre, _ = tangents
    f = _forget_gate(pre, cont)
    return f, f * (1 - f) * d_pre


def _lstm_unit(c_prev: jax.Array, gates: jax.Array, cont: jax.Array):
    """One LSTMUnit step on (N, D) c_prev, (N, 4D) gates [i f o g], (N,) cont → (c, h)."""
    i, f, o, g = jnp.split(gates, 4, axis=-1)
    f = _forget_gate(f, cont[:, None])
    c = f * c_prev + jax.nn.sigmoid(i) * jnp.tanh(g)
    return c, jax.nn.sigmoid(o) * jnp.tanh(c)


@register("LSTM", no_force_backward=(1,))
def lstm(layer, params, bottoms, ctx):
    """Caffe's LSTMLayer: gate inputs from x and cont·h_{t−1}, then LSTMUnit per step."""
    layout = _layout(layer, [b.shape for b in bottoms], 2)
    x, cont, static, states = _split_bottoms(layout, bottoms)
    w_xc, b_c = params[0], params[1]
    w_hc = params[-1]
    static_proj = _ip(static, params[2]) if layout.static else None
    x_proj = _ip(x, w_xc, b_c)

    def step(carry, inputs):
        h, c = carry
        x_t, cont_t = inputs
        gates = _ip(cont_t[:, None] * h, w_hc) + x_t
        if static_proj is not None:
            gates = gates + static_proj
        c, h = _lstm_unit(c, gates, cont_t)
        return (h, c), h

    init = (_initial(layout, states, 0, ctx), _initial(layout, states, 1, ctx))
    (h_last, c_last), hs = lax.scan(step, init, (x_proj, cont))
    if not layout.exposed:
        return [hs], [h_last, c_last]
    return [hs, lax.stop_gradient(h_last[None]), lax.stop_gradient(c_last[None])]


@lstm.param_shapes
def _(layer, bottom_shapes):
    return _recurrent_decls(layer, _layout(layer, bottom_shapes, 2), 4)


@lstm.carry_shapes
def _(layer, bottom_shapes):
    return _carry_decls(layer, bottom_shapes, 2)


# --- LSTMUnit -------------------------------------------------------------------------------


def _unit_check(layer: ir.Layer, shapes: Sequence[Shape]) -> None:
    """LSTMUnitLayer::Reshape: c_prev (1, N, D), x (1, N, 4D), cont (1, N); tops c, h (the
    counts are the registry's)."""
    c_prev, x, cont = (tuple(s) for s in shapes)
    if len(c_prev) != 3 or c_prev[0] != 1:
        raise fail(layer, f"bottom c_prev must have shape [1, N, D]; got {list(c_prev)}")
    n, d = c_prev[1], c_prev[2]
    if x != (1, n, 4 * d):
        raise fail(layer, f"bottom x must have shape [1, {n}, {4 * d}]; got {list(x)}")
    if cont != (1, n):
        raise fail(layer, f"bottom cont must have shape [1, {n}]; got {list(cont)}")


@register("LSTMUnit", counts=(3, 3, 2, 2), no_force_backward=(2,))
def lstm_unit(layer, params, bottoms, ctx):
    """Caffe's LSTMUnitLayer: one step, ``c = cont·σ(f)·c_prev + σ(i)·tanh(g)``,
    ``h = σ(o)·tanh(c)``; no diff reaches cont."""
    _unit_check(layer, [b.shape for b in bottoms])
    c_prev, x, cont = bottoms
    cont = lax.stop_gradient(cont).astype(c_prev.dtype)
    c, h = _lstm_unit(c_prev[0], x[0], cont[0])
    return [c[None], h[None]]
