"""RNN, LSTM and LSTMUnit beyond the golden cases: long sequences with resets against a numpy
reference, Caffe's gradient quirks (cont, expose_hidden, fractional cont), param declarations
and the errors for configurations Caffe refuses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted

jax.config.update("jax_default_matmul_precision", "highest")

T, N, I, S, D = 9, 3, 4, 2, 5
FILLERS = (
    'weight_filler { type: "uniform" min: -0.5 max: 0.5 } '
    'bias_filler { type: "uniform" min: -0.5 max: 0.5 }'
)


def net_text(kind, shapes, tops, extra="", num_output=D, bottoms=None, fillers=FILLERS):
    """Input (one top per shape) → one ``kind`` layer named 'layer'."""
    names = ["x", "cont", "xs", "h0", "c0"] if bottoms is None else bottoms
    names = names[: len(shapes)]
    input_tops = "".join(f'top: "{n}" ' for n in names)
    input_shapes = "".join("shape { " + "".join(f"dim: {d} " for d in s) + "} " for s in shapes)
    layer_bottoms = "".join(f'bottom: "{n}" ' for n in names)
    layer_tops = "".join(f'top: "{t}" ' for t in tops)
    param = f"recurrent_param {{ num_output: {num_output} {fillers} {extra} }}"
    if kind == "LSTMUnit":
        param = ""
    return (
        "force_backward: true\n"
        f'layer {{ name: "input" type: "Input" {input_tops} input_param {{ {input_shapes} }} }}\n'
        f'layer {{ name: "layer" type: "{kind}" {layer_bottoms} {layer_tops} {param} }}\n'
    )


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def reference(kind, params, x, cont, xs=None, h0=None, c0=None):
    """Caffe's unrolled RNN/LSTM in float64 numpy, one timestep at a time."""
    p = [np.asarray(v, np.float64) for v in params]
    static = xs is not None
    w_x, b = p[0], p[1]
    w_h = p[2 + static]
    x = np.asarray(x, np.float64).reshape(T, N, -1) @ w_x.T + b
    xs_proj = np.asarray(xs, np.float64).reshape(N, -1) @ p[2].T if static else 0.0
    h = np.zeros((N, D)) if h0 is None else np.asarray(h0, np.float64)[0]
    c = np.zeros((N, D)) if c0 is None else np.asarray(c0, np.float64)[0]
    outs = []
    for t in range(T):
        keep = cont[t][:, None]
        pre = (keep * h) @ w_h.T + x[t] + xs_proj
        if kind == "RNN":
            h = np.tanh(pre)
            outs.append(np.tanh(h @ p[3 + static].T + p[4 + static]))
        else:
            i, f, o, g = np.split(pre, 4, axis=1)
            c = keep * sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
            outs.append(h)
    return np.stack(outs), h[None], c[None]


def unrolled(kind, params, x, cont, xs=None):
    """The same recurrence in jnp with a Python loop: an independent route for gradients."""
    static = xs is not None
    w_x, b, w_h = params[0], params[1], params[2 + static]
    x = jnp.reshape(x, (T, N, -1)) @ w_x.T + b
    extra = jnp.reshape(xs, (N, -1)) @ params[2].T if static else 0.0
    h = c = jnp.zeros((N, D))
    outs = []
    for t in range(T):
        keep = cont[t][:, None]
        pre = (keep * h) @ w_h.T + x[t] + extra
        if kind == "RNN":
            h = jnp.tanh(pre)
            outs.append(jnp.tanh(h @ params[3 + static].T + params[4 + static]))
        else:
            i, f, o, g = jnp.split(pre, 4, axis=1)
            c = keep * jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            outs.append(h)
    return jnp.stack(outs)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def data(seed, static=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, N, 2, 2)).astype(np.float32)  # I = 4 over two axes
    cont = np.ones((T, N), np.float32)
    cont[0] = 0
    cont[3, 1] = cont[5, 0] = cont[6, 2] = 0  # resets mid-sequence, per stream
    inputs = {"x": x, "cont": cont}
    if static:
        inputs["xs"] = rng.standard_normal((N, S)).astype(np.float32)
    return inputs


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
@pytest.mark.parametrize("static", [False, True])
def test_long_sequence_with_resets_matches_numpy(kind, static):
    inputs = data(1, static)
    shapes = [v.shape for v in inputs.values()]
    model = compile_net(net_text(kind, shapes, ["y"]))
    params, state = model.init(3)
    blobs, _ = jax.jit(model.apply)(params, state, inputs)
    want, _, _ = reference(kind, params["layer"], **inputs)
    assert blobs["y"].shape == (T, N, D)
    assert rel(blobs["y"], want) < 1e-5

    def loss(p, inp):
        return jnp.sum(
            jitted.forward(model, p, state, inp)[0]["y"] * jnp.arange(T * N * D).reshape(T, N, D)
        )

    def ref_loss(p, inp):
        y = unrolled(kind, p["layer"], inp["x"], inp["cont"], inp.get("xs"))
        return jnp.sum(y * jnp.arange(T * N * D).reshape(T, N, D))

    grads, in_grads = jax.grad(loss, argnums=(0, 1))(params, inputs)
    ref_grads, ref_in = jax.grad(ref_loss, argnums=(0, 1))(params, inputs)
    for ours, theirs in zip(grads["layer"], ref_grads["layer"]):
        assert rel(ours, theirs) < 1e-5
    assert rel(in_grads["x"], ref_in["x"]) < 1e-5
    if static:
        assert rel(in_grads["xs"], ref_in["xs"]) < 1e-5
    # Caffe never back-propagates to the sequence indicators.
    assert not np.any(in_grads["cont"])


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_reset_isolates_sequences(kind):
    """After cont = 0, the output does not depend on anything before the reset."""
    inputs = data(2)
    model = compile_net(net_text(kind, [v.shape for v in inputs.values()], ["y"]))
    params, state = model.init(0)
    base = jitted.forward(model, params, state, inputs)[0]["y"]
    changed = dict(inputs, x=inputs["x"].copy())
    changed["x"][:5, 0] += 3.0  # stream 0 resets at t = 5
    after = jitted.forward(model, params, state, changed)[0]["y"]
    np.testing.assert_array_equal(np.asarray(after[5:, 0]), np.asarray(base[5:, 0]))
    assert not np.allclose(after[:5, 0], base[:5, 0])


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
@pytest.mark.parametrize("static", [False, True])
def test_expose_hidden_state_flow_and_caffe_gradients(kind, static):
    """h0/c0 (after x_static, when there is one) feed the first step; hT/cT are the last
    state. As in Caffe, the initial-state bottoms get no diff and the final-state tops' diffs
    are ignored."""
    rng = np.random.default_rng(4)
    inputs = data(3, static)
    inputs["cont"][0] = 1  # carry the given initial state into the first step
    states = ["h0"] if kind == "RNN" else ["h0", "c0"]
    for name in states:
        inputs[name] = rng.standard_normal((1, N, D)).astype(np.float32)
    tops = ["y", "hT"] if kind == "RNN" else ["y", "hT", "cT"]
    shapes = [v.shape for v in inputs.values()]
    model = compile_net(
        net_text(
            kind, shapes, tops, "expose_hidden: true", bottoms=[*inputs][: -len(states)] + states
        )
    )
    params, state = model.init(5)
    blobs, _ = jitted.forward(model, params, state, inputs)
    want, h_t, c_t = reference(kind, params["layer"], **inputs)
    assert rel(blobs["y"], want) < 1e-5
    assert rel(blobs["hT"], h_t) < 1e-5
    if kind == "LSTM":
        assert rel(blobs["cT"], c_t) < 1e-5

    def final_state_only(p, inp):
        blobs = jitted.forward(model, p, state, inp)[0]
        return sum(jnp.sum(blobs[t]) for t in tops[1:])

    grads, in_grads = jax.grad(final_state_only, argnums=(0, 1))(params, inputs)
    assert all(not np.any(g) for g in grads["layer"])
    for name in inputs:
        assert not np.any(in_grads[name])


def caffe_lstm_unit_backward(c_prev, x, cont, dc, dh):
    """LSTMUnitLayer::Backward_cpu, transcribed formula by formula (float64)."""
    d = c_prev.shape[-1]
    i, f, o, g = (x[..., k * d : (k + 1) * d] for k in range(4))
    i, o, g = sigmoid(i), sigmoid(o), np.tanh(g)
    f = np.where(cont[..., None] == 0, 0.0, cont[..., None] * sigmoid(f))
    c = f * c_prev + i * g
    tanh_c = np.tanh(c)
    c_term = dc + dh * o * (1 - tanh_c**2)
    dx = np.concatenate(
        [c_term * g * i * (1 - i), c_term * c_prev * f * (1 - f), dh * tanh_c * o * (1 - o),
         c_term * i * (1 - g * g)],
        axis=-1,
    )  # fmt: skip
    return c_term * f, dx


def test_lstm_unit_fractional_cont_uses_caffe_backward():
    """For cont ∉ {0, 1}, Caffe's forget-gate diff f·(1−f) is not the true derivative; ours
    reproduces Caffe's (and cont itself gets no diff)."""
    rng = np.random.default_rng(6)
    n, d = 4, 3
    c_prev = rng.standard_normal((1, n, d)).astype(np.float32)
    x = rng.standard_normal((1, n, 4 * d)).astype(np.float32)
    cont = np.array([[0.0, 0.3, 1.0, 0.7]], np.float32)
    dc = rng.standard_normal((1, n, d)).astype(np.float32)
    dh = rng.standard_normal((1, n, d)).astype(np.float32)
    text = net_text(
        "LSTMUnit", [c_prev.shape, x.shape, cont.shape], ["c", "h"], bottoms=["c_prev", "xg", "k"]
    )
    model = compile_net(text)
    params, state = model.init(0)
    inputs = {"c_prev": c_prev, "xg": x, "k": cont}

    def tops(inp):
        blobs = jitted.forward(model, params, state, inp)[0]
        return blobs["c"], blobs["h"]

    (c, h), vjp = jax.vjp(tops, inputs)
    (grads,) = vjp((dc, dh))
    want_dc, want_dx = caffe_lstm_unit_backward(
        c_prev.astype(np.float64), x.astype(np.float64), cont.astype(np.float64), dc, dh
    )
    assert rel(grads["c_prev"], want_dc) < 1e-6
    assert rel(grads["xg"], want_dx) < 1e-6
    assert not np.any(grads["k"])

    # The true derivative differs from Caffe's here (so this test would notice a regression).
    def true_tops(xg):
        i, f, o, g = jnp.split(xg[0], 4, axis=1)
        c = cont[0][:, None] * jax.nn.sigmoid(f) * c_prev[0] + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jnp.sum(c * dc[0] + jax.nn.sigmoid(o) * jnp.tanh(c) * dh[0])

    assert rel(grads["xg"], jax.grad(true_tops)(jnp.asarray(x))) > 1e-3


def test_lstm_unit_forward_and_forward_mode():
    rng = np.random.default_rng(7)
    c_prev = rng.standard_normal((1, 2, 3)).astype(np.float32)
    x = rng.standard_normal((1, 2, 12)).astype(np.float32)
    cont = np.array([[1.0, 0.0]], np.float32)
    model = compile_net(
        net_text("LSTMUnit", [(1, 2, 3), (1, 2, 12), (1, 2)], ["c", "h"], bottoms=["a", "b", "k"])
    )
    params, state = model.init(0)
    inputs = {"a": c_prev, "b": x, "k": cont}
    blobs, _ = jitted.forward(model, params, state, inputs)
    i, f, o, g = np.split(x[0].astype(np.float64), 4, axis=1)
    c = cont[0][:, None] * sigmoid(f) * c_prev[0] + sigmoid(i) * np.tanh(g)
    assert rel(blobs["c"][0], c) < 1e-6
    assert rel(blobs["h"][0], sigmoid(o) * np.tanh(c)) < 1e-6
    # Forward-mode differentiation works too (the custom rule is a JVP).
    tangent = {"a": np.ones_like(c_prev), "b": np.ones_like(x), "k": np.zeros_like(cont)}
    _, jvp_out = jax.jvp(
        lambda inp: jitted.forward(model, params, state, inp)[0]["h"], (inputs,), (tangent,)
    )
    assert jvp_out.shape == (1, 2, 3) and np.all(np.isfinite(jvp_out))


@pytest.mark.parametrize(
    ("kind", "static", "want"),
    [
        ("RNN", False, [(D, I), (D,), (D, D), (D, D), (D,)]),
        ("RNN", True, [(D, I), (D,), (D, S), (D, D), (D, D), (D,)]),
        ("LSTM", False, [(4 * D, I), (4 * D,), (4 * D, D)]),
        ("LSTM", True, [(4 * D, I), (4 * D,), (4 * D, S), (4 * D, D)]),
    ],
)
def test_param_blobs_in_caffe_order_with_fillers(kind, static, want):
    shapes = [(T, N, I), (T, N)] + ([(N, S)] if static else [])
    fillers = (
        'weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "constant" value: 0.25 }'
    )
    model = compile_net(net_text(kind, shapes, ["y"], fillers=fillers))
    decls = model.graph.decls["layer"]
    assert [d.shape for d in decls] == want
    assert not any(d.state for d in decls)
    params, _ = model.init(0)
    for decl, value in zip(decls, params["layer"]):
        assert value.shape == decl.shape
        if len(decl.shape) == 1:  # biases: bias_filler
            assert decl.filler.type == "constant"
            np.testing.assert_array_equal(value, np.full(decl.shape, 0.25, np.float32))
        else:  # weights: weight_filler
            assert decl.filler.type == "gaussian"
            assert 0.05 < float(np.std(value)) < 0.2


def test_float64_and_jit():
    inputs = data(8)
    with jax.enable_x64(True):
        model = compile_net(net_text("LSTM", [(T, N, 2, 2), (T, N)], ["y"]), dtype=jnp.float64)
        params, state = model.init(0)
        blobs, _ = jax.jit(model.apply)(params, state, inputs)
        assert blobs["y"].dtype == jnp.float64
        want, _, _ = reference("LSTM", params["layer"], **inputs)
        assert rel(blobs["y"], want) < 1e-12


ERRORS = [
    # (kind, shapes, tops, extra, bottoms, num_output, message fragment)
    ("RNN", [(T, N, I)], ["y"], "", None, D, "got 1 bottom"),
    ("RNN", [(T, N, I), (T, N), (N, S), (N, S)], ["y"], "", None, D, "got 4 bottom"),
    ("LSTM", [(T, N, I), (T, N), (1, N, D)], ["y", "hT", "cT"], "expose_hidden: true",
     ["x", "cont", "h0"], D, "got 3 bottom"),
    ("RNN", [(T, N, I), (T, N)], ["y", "z"], "", None, D, "needs 1 top"),
    ("LSTM", [(T, N, I), (T, N), (1, N, D), (1, N, D)], ["y"], "expose_hidden: true",
     ["x", "cont", "h0", "c0"], D, "needs 3 top"),
    ("RNN", [(T, N, I), (T + 1, N)], ["y"], "", None, D, "cont must have shape"),
    ("LSTM", [(T, N, I), (T, N, 1)], ["y"], "", None, D, "cont must have shape"),
    ("RNN", [(T, N, I), (T, N), (N + 1, S)], ["y"], "", None, D, "static input"),
    ("RNN", [(T, N, I), (T, N), (1, N, D + 1)], ["y", "hT"], "expose_hidden: true",
     ["x", "cont", "h0"], D, "initial-state bottom 2"),
    ("RNN", [(T, N, I), (T, N)], ["y"], "", None, 0, "num_output must be positive"),
    ("LSTMUnit", [(1, N, D), (1, N, 4 * D + 1), (1, N)], ["c", "h"], "", None, D, "bottom x"),
    ("LSTMUnit", [(1, N, D), (1, N, 4 * D), (2, N)], ["c", "h"], "", None, D, "bottom cont"),
    ("LSTMUnit", [(2, N, D), (1, N, 4 * D), (1, N)], ["c", "h"], "", None, D, "c_prev"),
    ("LSTMUnit", [(1, N, D), (1, N, 4 * D), (1, N)], ["c"], "", None, D, "2 top"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "shapes", "tops", "extra", "bottoms", "num", "msg"), ERRORS)
def test_caffe_refused_configurations_fail_at_compile(kind, shapes, tops, extra, bottoms, num, msg):
    names = bottoms or (["a", "b", "k"] if kind == "LSTMUnit" else None)
    with pytest.raises(NetError) as err:
        compile_net(net_text(kind, shapes, tops, extra, num, names))
    text = str(err.value)
    assert "\n" not in text
    assert f"layer 'layer' (type {kind})" in text
    assert msg in text


CONT_NET = """
layer { name: "indicator" type: "ContinuationIndicator" top: "cont"
  continuation_indicator_param { time_step: 3 batch_size: 2 } }
"""


def test_continuation_indicator_is_zero_at_the_first_step_then_one():
    model = compile_net(CONT_NET)
    blobs, _ = jitted.forward(model, *model.init(0), {})
    # CRNN's Forward_cpu: t == 0 ? 0 : 1, for every sequence of the batch, (T, N) = (3, 2)
    np.testing.assert_array_equal(np.asarray(blobs["cont"]), [[0, 0], [1, 1], [1, 1]])


def test_continuation_indicator_feeds_an_lstm_as_cont():
    text = CONT_NET + (
        'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 3 dim: 2 '
        'dim: 4 } } }\nlayer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "y" '
        "recurrent_param { num_output: 5 weight_filler { type: 'gaussian' std: 0.1 } } }"
    )
    model = compile_net(text)
    assert model.net.shapes[model.net.layers[-1].tops[0]] == (3, 2, 5)
    params, state = model.init(0)
    x = np.random.default_rng(0).standard_normal((3, 2, 4)).astype(np.float32)
    blobs, _ = jitted.forward(model, params, state, {"x": x})
    given = compile_net(text.replace(CONT_NET, 'layer { name: "c" type: "Input" top: "cont" '
                                     "input_param { shape { dim: 3 dim: 2 } } }"))  # fmt: skip
    cont = np.array([[0, 0], [1, 1], [1, 1]], np.float32)
    want, _ = jitted.forward(given, params, state, {"x": x, "cont": cont})
    np.testing.assert_array_equal(np.asarray(blobs["y"]), np.asarray(want["y"]))


@pytest.mark.parametrize("param", ["time_step: 0 batch_size: 2", "time_step: 3"])
def test_continuation_indicator_refuses_zero_sizes(param):
    text = CONT_NET.replace("time_step: 3 batch_size: 2", param)
    with pytest.raises(NetError, match="'indicator' \\(type ContinuationIndicator\\): "
                                       "time_step .* must both be positive"):  # fmt: skip
        compile_net(text)
