"""Recurrent layers in ONNX: RNN and LSTM unrolled over their T steps with Caffe's ``cont``
input (ONNX's RNN/LSTM operators have no sequence-continuation input), LSTMUnit, and CRNN's
ContinuationIndicator (lowering/layers/recurrent.py's semantics).

Each step: RNN ``h_t = tanh(W_hh·(cont_t·h_{t−1}) + W_xh·x_t + b_h [+ W_static·x_static])``,
output ``tanh(W_ho·h_t + b_o)``; LSTM gates ``W_hc·(cont_t·h_{t−1}) + W_xc·x_t + b_c [+ …]`` in
the order i, f, o, g, ``f ← cont·σ(f)``, ``c = f·c_{t−1} + σ(i)·tanh(g)``, ``h = σ(o)·tanh(c)``.
The state starts from the ``h0``/``c0`` bottoms with ``expose_hidden``, else from zeros: an
exported model runs each forward from a fresh state (caffe2jax's first forward; Caffe's layer
carries h_T into its next forward, which a stateless ONNX graph cannot).
"""

from __future__ import annotations

import numpy as np

from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import BatchDim, Site


def _ip(site: Site, x: str, j: int, bias: int | None = None) -> str:
    """``x·W_jᵀ (+ b)`` with Caffe's (out, in) weight blob ``j``."""
    g = site.g
    y = g.op("MatMul", [x, g.const(site.array(j).T.copy(), hint="wT")])
    return y if bias is None else g.op("Add", [y, site.blob(bias)])


class _Unrolled:
    """The bottoms of a RecurrentLayer laid out as its steps read them."""

    def __init__(self, site: Site, states: int):
        p = site.param.recurrent_param
        g = site.g
        self.site, self.g = site, g
        x_shape = site.bottom_shapes[0]
        self.steps, self.streams, self.hidden = x_shape[0], x_shape[1], p.num_output
        self.exposed = states if p.expose_hidden else 0
        self.static = len(site.bottoms) > 2 + self.exposed
        batch = site.bottom_batch[0]
        if batch is not None and batch.axis != 1:
            site.refuse("a recurrent input whose batch is not its axis 1 (T, N, ...)")
        self.batch = None if batch is None else BatchDim(0, batch.per_batch)
        n = -1 if batch is not None else self.streams
        self.x = g.reshape(site.bottoms[0], [self.steps, n, int(np.prod(x_shape[2:]))])
        self.cont = site.bottoms[1]

    def step_inputs(self, proj: str, t: int) -> tuple[str, str]:
        """(x_proj[t], cont[t] as (N, 1))."""
        g = self.g
        x_t = g.op("Gather", [proj, g.i64(t)], axis=0)
        cont_t = g.unsqueeze(g.op("Gather", [self.cont, g.i64(t)], axis=0), [1])
        return x_t, cont_t

    def initial(self, index: int) -> str:
        """State ``index`` at t = 0 as (N, D): the exposed bottom, else zeros."""
        g = self.g
        if self.exposed:
            bottom = self.site.bottoms[2 + self.static + index]
            return g.squeeze(bottom, [0])
        zeros = g.const(np.zeros((1, self.hidden), np.float32), hint="zeros")
        if self.batch is None:
            return g.op("Expand", [zeros, g.i64([self.streams, self.hidden])])
        shape = self.site.shape_value([self.streams, self.hidden], self.batch)
        return g.op("Expand", [zeros, shape])

    def static_projection(self, j: int) -> str | None:
        if not self.static:
            return None
        g = self.g
        shape = self.site.bottom_shapes[2]
        flat = g.op("Flatten", [self.site.bottoms[2]], axis=1) if len(shape) != 2 else None
        return _ip(self.site, flat or self.site.bottoms[2], j)

    def stack(self, values: list[str]) -> str:
        g = self.g
        return g.op("Concat", [g.unsqueeze(v, [0]) for v in values], axis=0)


@register("RNN")
def rnn(site: Site) -> list[str]:
    """RNNLayer, unrolled (module docstring)."""
    u = _Unrolled(site, 1)
    g = site.g
    proj = _ip(site, u.x, 0, bias=1)
    static = u.static_projection(2)
    w_hh = 2 + u.static
    h = u.initial(0)
    hs = []
    for t in range(u.steps):
        x_t, cont_t = u.step_inputs(proj, t)
        pre = g.op("Add", [_ip(site, g.op("Mul", [cont_t, h]), w_hh), x_t])
        if static is not None:
            pre = g.op("Add", [pre, static])
        h = g.op("Tanh", [pre])
        hs.append(h)
    out = g.op("Tanh", [_ip(site, u.stack(hs), w_hh + 1, bias=w_hh + 2)])
    return [out, g.unsqueeze(h, [0])] if u.exposed else [out]


def lstm_step(site: Site, c_prev: str, gates: str, cont: str) -> tuple[str, str]:
    """LSTMUnit: (c, h) from (N, D) c_prev, (N, 4D) gates [i f o g] and (N, 1) cont."""
    g = site.g
    i, f, o, gg = g.op("Split", [gates, g.i64([gates_width(site)] * 4)], outputs=4, axis=-1)
    forget = g.where(g.op("Equal", [cont, g.f32(0.0)]), g.f32(0.0),
                     g.op("Mul", [cont, g.op("Sigmoid", [f])]))  # fmt: skip
    c = g.op("Add", [g.op("Mul", [forget, c_prev]),
                     g.op("Mul", [g.op("Sigmoid", [i]), g.op("Tanh", [gg])])])  # fmt: skip
    return c, g.op("Mul", [g.op("Sigmoid", [o]), g.op("Tanh", [c])])


def gates_width(site: Site) -> int:
    """D of an LSTM / LSTMUnit layer."""
    if site.layer.type == "LSTM":
        return site.param.recurrent_param.num_output
    return site.bottom_shapes[0][-1]


@register("LSTM")
def lstm(site: Site) -> list[str]:
    """LSTMLayer, unrolled (module docstring)."""
    u = _Unrolled(site, 2)
    g = site.g
    proj = _ip(site, u.x, 0, bias=1)
    static = u.static_projection(2)
    w_hc = len(site.blobs) - 1
    h, c = u.initial(0), u.initial(1)
    hs = []
    for t in range(u.steps):
        x_t, cont_t = u.step_inputs(proj, t)
        gates = g.op("Add", [_ip(site, g.op("Mul", [cont_t, h]), w_hc), x_t])
        if static is not None:
            gates = g.op("Add", [gates, static])
        c, h = lstm_step(site, c, gates, cont_t)
        hs.append(h)
    out = u.stack(hs)
    if not u.exposed:
        return [out]
    return [out, g.unsqueeze(h, [0]), g.unsqueeze(c, [0])]


@register("LSTMUnit")
def lstm_unit(site: Site) -> list[str]:
    """LSTMUnitLayer: one step on (1, N, ·) blobs."""
    g = site.g
    c_prev, x, cont = (g.squeeze(b, [0]) for b in site.bottoms)
    c, h = lstm_step(site, c_prev, x, g.unsqueeze(cont, [1]))
    return [g.unsqueeze(c, [0]), g.unsqueeze(h, [0])]


@register("ContinuationIndicator")
def continuation_indicator(site: Site) -> list[str]:
    """CRNN's ContinuationIndicatorLayer: (T, N) of 0 at t = 0 and 1 after."""
    steps, streams = site.top_shapes[0]
    value = np.ones((steps, streams), np.float32)
    value[0] = 0.0
    return [site.g.const(value, hint="cont")]
