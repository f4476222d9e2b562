"""lowering/forks/ctpn.py: CTPN's Lstm, Reverse and Transpose against NumPy transcriptions of
the fork's loops (caffe/src/caffe/layers/{lstm,reverse,transpose}_layer.cpp of
tianzhi0549/CTPN@f77ec9e), run jitted and inside value_and_grad; float64 finite differences
where the fork's backward is the true gradient; CTPN's BLSTM section compiled and run."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import fd_check, net, ours

RNG = np.random.default_rng(32)


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstm_loop(x, wx, wh, b, clip=None, h0=None, c0=None, top_diff=None, bound=0.0):
    """LstmLayer::Forward_cpu and Backward_cpu, step by step (float64): top, (h_T, c_T) and
    with ``top_diff`` the diffs of x, W_x, W_h, b."""
    t_len, n = x.shape[:2]
    hid = wh.shape[1]
    xs = x.reshape(t_len, n, -1)
    h0 = np.zeros((n, hid)) if h0 is None else h0
    c0 = np.zeros((n, hid)) if c0 is None else c0
    gate, cell, top = (np.zeros((t_len, n, 4 * hid)), np.zeros((t_len, n, hid)),
                       np.zeros((t_len, n, hid)))  # fmt: skip
    cont = np.zeros((t_len, n), bool)
    for t in range(t_len):
        h_prev, c_prev = (top[t - 1], cell[t - 1]) if t else (h0, c0)
        for m in range(n):
            cont[t, m] = bool(clip[t, m]) if clip is not None else t > 0
            pre = xs[t, m] @ wx.T + b + (wh @ h_prev[m] if cont[t, m] else 0)
            g = gate[t, m]
            g[:hid] = _sig(pre[:hid])
            g[hid : 2 * hid] = _sig(pre[hid : 2 * hid]) if cont[t, m] else 0
            g[2 * hid : 3 * hid] = _sig(pre[2 * hid : 3 * hid])
            g[3 * hid :] = np.tanh(pre[3 * hid :])
            cell[t, m] = g[hid : 2 * hid] * c_prev[m] + g[:hid] * g[3 * hid :]
            top[t, m] = g[2 * hid : 3 * hid] * np.tanh(cell[t, m])
    if top_diff is None:
        return top, (top[-1], cell[-1])
    dtop, dcell, dpre = top_diff.copy(), np.zeros_like(cell), np.zeros_like(gate)
    for t in reversed(range(t_len)):
        c_prev = cell[t - 1] if t else c0
        for m in range(n):
            g, dc = gate[t, m], dcell[t, m]
            i, f, o, gg = g[:hid], g[hid : 2 * hid], g[2 * hid : 3 * hid], g[3 * hid :]
            tc = np.tanh(cell[t, m])
            dc += dtop[t, m] * o * (1 - tc * tc)
            if t:
                dcell[t - 1, m] = dc * f if cont[t, m] else 0
            df = dc * c_prev[m] if cont[t, m] else 0 * dc
            d = np.concatenate([dc * gg * i * (1 - i), df * f * (1 - f),
                                dtop[t, m] * tc * o * (1 - o), dc * i * (1 - gg * gg)])  # fmt: skip
            dpre[t, m] = np.clip(d, -bound, bound) if bound > 0 else d
        if t:
            dtop[t - 1] += np.where(cont[t][:, None], dpre[t] @ wh, 0)
    flat = dpre.reshape(t_len * n, -1)
    dwh = sum(dpre[t].T @ top[t - 1] for t in range(1, t_len)) + dpre[0].T @ h0
    dx = (flat @ wx).reshape(x.shape)
    return top, dx, flat.T @ xs.reshape(t_len * n, -1), dwh, flat.sum(0)


def _lstm_net(extra: str = "", clip: bool = False, shape=(5, 2, 3)) -> str:
    inputs = {"x": shape, **({"clip": shape[:2]} if clip else {})}
    bottoms = 'bottom: "x" ' + ('bottom: "clip" ' if clip else "")
    layer = (f'layer {{ name: "lstm" type: "Lstm" {bottoms}top: "h" lstm_param {{ '
             f'num_output: 4 weight_filler {{ type: "gaussian" std: 0.5 }} '
             f'bias_filler {{ type: "uniform" min: -0.5 max: 0.5 }} {extra} }} }}')  # fmt: skip
    return net(layer, inputs)


def _weights(i=3, hid=4):
    return [RNG.standard_normal((4 * hid, i)) * 0.7, RNG.standard_normal((4 * hid, hid)) * 0.7,
            RNG.standard_normal(4 * hid) * 0.5]  # fmt: skip


@pytest.mark.parametrize("bound", (0.0, 0.05))
def test_lstm_forward_and_the_forks_clipped_backward(bound):
    """Top and the fork's diffs (pre-gate diffs bounded to ±clipping_threshold: not the true
    gradient when the bound bites) inside value_and_grad of Σ c·h, jitted."""
    text = _lstm_net(f"clipping_threshold: {bound}")
    x, w, c = RNG.standard_normal((5, 2, 3)), _weights(), RNG.standard_normal((5, 2, 4))
    model = compile_net(text, phase="TRAIN")
    params, state = model.init(0)
    params["lstm"] = [jnp.asarray(v, jnp.float32) for v in w]

    def loss(p, xx):
        blobs, _ = model.apply(p, state, {"x": xx}, None)
        return jnp.sum(blobs["h"] * c), blobs["h"]

    (_, top), (gp, gx) = jitted.value_and_grad(loss, (0, 1), has_aux=True)(
        params, jnp.asarray(x, jnp.float32)
    )
    want, dx, dwx, dwh, db = lstm_loop(x, *w, top_diff=c, bound=bound)
    np.testing.assert_allclose(np.asarray(top), want, rtol=1e-5, atol=1e-5)
    for got, ref in zip((gx, *gp["lstm"]), (dx, dwx, dwh, db)):
        np.testing.assert_allclose(np.asarray(got), ref, rtol=2e-4, atol=2e-5)
    if bound:  # the bound changed something: the clipped diffs are not the unclipped ones
        assert not np.allclose(lstm_loop(x, *w, top_diff=c)[1], dx, atol=1e-4)


def test_lstm_gradient_without_clipping_is_the_true_one():
    fd_check(_lstm_net(), {"x": RNG.standard_normal((5, 2, 3))}, "h", phase="TRAIN")


def test_lstm_clip_bottom_continues_from_the_previous_forward():
    """With a clip bottom the fork starts from the last forward's (h_T, c_T) (its c_T_/h_T_
    members): two forwards, the second's clip[0] = 1, against the loop."""
    text = _lstm_net(clip=True)
    x1, x2, w = RNG.standard_normal((5, 2, 3)), RNG.standard_normal((5, 2, 3)), _weights()
    clip1 = np.array([[0, 0], [1, 1], [1, 0], [1, 1], [1, 1]], float)
    clip2 = np.array([[1, 0], [1, 1], [0, 1], [1, 1], [1, 1]], float)
    model = compile_net(text, phase="TEST")
    params, state = model.init(0)
    params["lstm"] = [jnp.asarray(v, jnp.float32) for v in w]
    got = []
    for x, clip in ((x1, clip1), (x2, clip2)):
        feed = {"x": jnp.asarray(x, jnp.float32), "clip": jnp.asarray(clip, jnp.float32)}
        blobs, state = jitted.forward(model, params, state, feed)
        got.append(np.asarray(blobs["h"]))
    first, (h_t, c_t) = lstm_loop(x1, *w, clip=clip1)
    second, _ = lstm_loop(x2, *w, clip=clip2, h0=h_t, c0=c_t)
    np.testing.assert_allclose(got[0], first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], second, rtol=1e-5, atol=1e-5)


def test_lstm_blobs_are_the_forks_shapes_and_fillers():
    model = compile_net(_lstm_net(shape=(5, 2, 3, 2)), phase="TRAIN")
    params, _ = model.init(0)
    assert [tuple(p.shape) for p in params["lstm"]] == [(16, 6), (16, 4), (16,)]
    assert float(jnp.max(jnp.abs(params["lstm"][2]))) <= 0.5


# -- Reverse, Transpose ----------------------------------------------------------------------


def reverse_loop(x, axis):
    """reverse_cpu: to_index = counts[axis]·(axis_count − 2·ind − 1) + index."""
    flat, out = x.ravel(), np.empty(x.size)
    counts = [int(np.prod(x.shape[i + 1 :])) for i in range(x.ndim)]
    for index in range(x.size):
        ind = (index // counts[axis]) % x.shape[axis]
        out[counts[axis] * (x.shape[axis] - 2 * ind - 1) + index] = flat[index]
    return out.reshape(x.shape)


def transpose_loop(x, dim):
    """transpose_cpu with the forward map: to_index = Σ from_inds[dim[i]]·to_counts[i]."""
    top_shape = [x.shape[d] for d in dim]
    fc = [int(np.prod(x.shape[i + 1 :])) for i in range(x.ndim)]
    tc = [int(np.prod(top_shape[i + 1 :])) for i in range(x.ndim)]
    out = np.empty(x.size)
    for index, v in enumerate(x.ravel()):
        inds, rest = [], index
        for c in fc:
            inds.append(rest // c)
            rest %= c
        out[sum(inds[dim[i]] * tc[i] for i in range(x.ndim))] = v
    return out.reshape(top_shape)


@pytest.mark.parametrize("axis", (0, 1, 3))
def test_reverse_is_the_forks_loop_and_differentiates(axis):
    text = net(f'layer {{ name: "r" type: "Reverse" bottom: "x" top: "y" '
               f"reverse_param {{ axis: {axis} }} }}", {"x": (3, 2, 4, 5)})  # fmt: skip
    x = RNG.standard_normal((3, 2, 4, 5))
    np.testing.assert_array_equal(
        ours(text, {"x": x})["y"], reverse_loop(x.astype(np.float32), axis)
    )
    fd_check(text, {"x": x}, "y")


@pytest.mark.parametrize("dim", ((3, 2, 0, 1), (2, 3, 1, 0), (0, 1, 2, 3)))
def test_transpose_is_the_forks_loop_and_differentiates(dim):
    text = net('layer { name: "t" type: "Transpose" bottom: "x" top: "y" transpose_param { '
               + " ".join(f"dim: {d}" for d in dim) + " } }", {"x": (2, 3, 4, 5)})  # fmt: skip
    x = RNG.standard_normal((2, 3, 4, 5))
    want = transpose_loop(x.astype(np.float32), dim)
    np.testing.assert_array_equal(ours(text, {"x": x})["y"], want)
    fd_check(text, {"x": x}, "y")


@pytest.mark.parametrize(
    "layer, words",
    [
        ('type: "Transpose" transpose_param { dim: 0 dim: 0 dim: 1 dim: 2 }', "permutation"),
        ('type: "Transpose" transpose_param { dim: 1 dim: 0 }', "permutation"),
        ('type: "Reverse" reverse_param { axis: -1 }', "no negative axes"),
    ],
)
def test_bad_parameters_name_the_layer(layer, words):
    text = net(f'layer {{ name: "bad" {layer} bottom: "x" top: "y" }}', {"x": (2, 3, 4, 5)})
    with pytest.raises(NetError, match=f"layer 'bad'.*{words}"):
        compile_net(text).init(0)


# -- CTPN's BLSTM (models/deploy.prototxt of tianzhi0549/CTPN, its layers at small sizes) ---------

BLSTM = """
layer { name: "im2col" bottom: "conv5_3" top: "im2col" type: "Im2col"
  convolution_param { pad: 1 kernel_size: 3 } }
layer { name: "im2col_transpose" top: "im2col_transpose" bottom: "im2col" type: "Transpose"
  transpose_param { dim: 3 dim: 2 dim: 0 dim: 1 } }
layer { name: "lstm_input" type: "Reshape" bottom: "im2col_transpose" top: "lstm_input"
  reshape_param { shape { dim: -1 } axis: 1 num_axes: 2 } }
layer { name: "lstm" type: "Lstm" bottom: "lstm_input" top: "lstm"
  lstm_param { num_output: 6 weight_filler { type: "gaussian" std: 0.3 }
               bias_filler { type: "constant" } clipping_threshold: 1 } }
layer { name: "lstm-reverse1" type: "Reverse" bottom: "lstm_input" top: "rlstm_input"
  reverse_param { axis: 0 } }
layer { name: "rlstm" type: "Lstm" bottom: "rlstm_input" top: "rlstm-output"
  lstm_param { num_output: 6 } }
layer { name: "lstm-reverse2" type: "Reverse" bottom: "rlstm-output" top: "rlstm"
  reverse_param { axis: 0 } }
layer { name: "merge_lstm_rlstm" type: "Concat" bottom: "lstm" bottom: "rlstm"
  top: "merge_lstm_rlstm" concat_param { axis: 2 } }
layer { name: "lstm_output_reshape" type: "Reshape" bottom: "merge_lstm_rlstm"
  top: "lstm_output_reshape" reshape_param { shape { dim: -1 dim: 1 } axis: 1 num_axes: 1 } }
layer { name: "lstm_output" type: "Transpose" bottom: "lstm_output_reshape" top: "lstm_output"
  transpose_param { dim: 2 dim: 3 dim: 1 dim: 0 } }
"""


def test_ctpn_blstm_section_runs_as_the_forks_layers_compose():
    """CTPN's deploy BLSTM (conv5_3 (1, C, H, W) → lstm_output (1, 2H, H, W)): each row of the
    feature map is a sequence over its columns, read both ways; against the loops."""
    shape = (1, 2, 3, 4)
    x = RNG.standard_normal(shape)
    model = compile_net(net(BLSTM, {"conv5_3": shape}), phase="TEST")
    params, state = model.init(0)
    blobs, _ = jitted.forward(model, params, state, {"conv5_3": jnp.asarray(x, jnp.float32)})
    out = np.asarray(blobs["lstm_output"])
    assert out.shape == (1, 12, 3, 4)
    cols = np.asarray(blobs["im2col"], np.float64)  # (1, 18, 3, 4), BVLC's Im2col
    seq = transpose_loop(cols, (3, 2, 0, 1)).reshape(4, 3, 18)  # (W, H, C·9): T = W, N = H
    p = [np.asarray(v, np.float64) for v in params["lstm"]]
    q = [np.asarray(v, np.float64) for v in params["rlstm"]]
    fwd = lstm_loop(seq, *p)[0]
    bwd = reverse_loop(lstm_loop(reverse_loop(seq, 0), *q)[0], 0)
    merged = np.concatenate([fwd, bwd], axis=2).reshape(4, 3, 1, 12)
    np.testing.assert_allclose(out, transpose_loop(merged, (2, 3, 1, 0)), rtol=1e-5, atol=1e-5)
