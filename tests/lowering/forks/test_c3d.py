"""C3D's Convolution3D and Pooling3D (lowering/forks/c3d.py) against NumPy loops written from
C3D's convolution3d_layer.cpp / pool3d_layer.cpp, finite-difference gradients in float64,
C3D's MAX backward on ties, its size rules and refusals; BVLC's N-D Convolution on 5-D blobs;
the C3D v1.0 V1 form with 5-D v1.0 BlobProto weights."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.runtime.formats.weights import load_weights
from tests import jitted
from tests.forks import bvlc_blob, c3d_blob, ld, s, v1_layer, v2_layer
from tests.lowering.nets import net_text, rel, run

RNG = np.random.default_rng(0)
FLT_MAX = float(np.finfo(np.float32).max)


def conv3d_loops(x, w, b, stride, pad):
    """C3D's vol2col + GEMM as plain loops: (N, C, L, H, W) ⊛ (O, C, kd, k, k) + b."""
    n, c, length, h, wd = x.shape
    o, _, kd, k, _ = w.shape
    (ts, s_), (tp, p) = stride, pad
    xp = np.zeros((n, c, length + 2 * tp, h + 2 * p, wd + 2 * p))
    xp[:, :, tp : tp + length, p : p + h, p : p + wd] = x
    lo, ho, wo = ((length + 2 * tp - kd) // ts + 1, (h + 2 * p - k) // s_ + 1,
                  (wd + 2 * p - k) // s_ + 1)  # fmt: skip
    y = np.zeros((n, o, lo, ho, wo))
    for i, f, l_, r, q in itertools.product(range(n), range(o), range(lo), range(ho), range(wo)):
        window = xp[i, :, l_ * ts : l_ * ts + kd, r * s_ : r * s_ + k, q * s_ : q * s_ + k]
        y[i, f, l_, r, q] = np.sum(window * w[f]) + (b[f] if b is not None else 0)
    return y


def pool3d_loops(x, method, k, kd, s_, ts, pad):
    """C3D's Pooling3DLayer::Forward_cpu, loop for loop."""
    n, c, length, h, w = x.shape
    ph_n = int(np.ceil((h + 2 * pad - k) / s_)) + 1
    pw_n = int(np.ceil((w + 2 * pad - k) / s_)) + 1
    pl_n = int(np.ceil((length - kd) / ts)) + 1
    y = np.zeros((n, c, pl_n, ph_n, pw_n))
    for i, ch, pl, ph, pw in itertools.product(range(n), range(c), range(pl_n), range(ph_n),
                                               range(pw_n)):  # fmt: skip
        if method == "MAX":
            hs, ws, ls = ph * s_, pw * s_, pl * ts
            he, we, le = min(hs + k, h), min(ws + k, w), min(ls + kd, length)
            y[i, ch, pl, ph, pw] = max([-FLT_MAX, *x[i, ch, ls:le, hs:he, ws:we].ravel()])
        else:
            hs, ws, ls = ph * s_ - pad, pw * s_ - pad, pl * ts
            he, we, le = min(hs + k, h + pad), min(ws + k, w + pad), min(ls + kd, length)
            size = (he - hs) * (we - ws) * (le - ls)
            hs, ws = max(hs, 0), max(ws, 0)
            he, we = min(he, h), min(we, w)
            y[i, ch, pl, ph, pw] = x[i, ch, ls:le, hs:he, ws:we].sum() / size
    return y


def max_pool3d_backward_loops(x, y, dy, k, kd, s_, ts):
    """C3D's MAX backward: every cell equal to its window's max gets the window's diff."""
    dx = np.zeros_like(x)
    n, c, length, h, w = x.shape
    for i, ch, pl, ph, pw in itertools.product(range(n), range(c), *map(range, y.shape[2:])):
        hs, ws, ls = ph * s_, pw * s_, pl * ts
        he, we, le = min(hs + k, h), min(ws + k, w), min(ls + kd, length)
        region = x[i, ch, ls:le, hs:he, ws:we]
        dx[i, ch, ls:le, hs:he, ws:we] += dy[i, ch, pl, ph, pw] * (region == y[i, ch, pl, ph, pw])
    return dx


def conv_param(num, k, kd, extra=""):
    return (f"convolution3d_param {{ num_output: {num} kernel_size: {k} kernel_depth: {kd} "
            f"{extra} weight_filler {{ type: 'gaussian' std: 0.1 }} "
            "bias_filler { type: 'gaussian' std: 0.1 } }")  # fmt: skip


CONV_CASES = [  # (x shape, num_output, k, kd, stride, temporal_stride, pad, temporal_pad)
    ((2, 3, 5, 6, 7), 4, 3, 3, 1, 1, 1, 1),  # C3D's conv: 3×3×3, pad 1
    ((1, 2, 6, 7, 5), 3, 2, 3, 2, 2, 0, 1),
    ((1, 1, 4, 5, 5), 2, 3, 1, 2, 1, 1, 0),
]


@pytest.mark.parametrize("shape,num,k,kd,st,ts,pad,tp", CONV_CASES)
def test_convolution3d_matches_c3d_loops(shape, num, k, kd, st, ts, pad, tp):
    extra = f"stride: {st} temporal_stride: {ts} pad: {pad} temporal_pad: {tp}"
    text = net_text("Convolution3D", [shape], conv_param(num, k, kd, extra))
    x = RNG.standard_normal(shape).astype(np.float32)
    model, blobs = run(text, {"x": x})
    w, b = (np.asarray(p, np.float64) for p in model.init(0)[0]["layer"])
    assert w.shape == (num, shape[1], kd, k, k) and b.shape == (1, 1, 1, 1, num)
    want = conv3d_loops(x.astype(np.float64), w, b.ravel(), (ts, st), (tp, pad))
    assert blobs["y"].shape == want.shape
    assert rel(blobs["y"], want) < 1e-6


def test_convolution3d_without_bias_and_group_ignored():
    # C3D never reads `group`; filter_group runs the filters in chunks: the same convolution.
    text = net_text("Convolution3D", [(1, 4, 3, 4, 4)],
                    conv_param(4, 3, 3, "pad: 1 temporal_pad: 1 bias_term: false group: 2 "
                               "filter_group: 2"))  # fmt: skip
    x = RNG.standard_normal((1, 4, 3, 4, 4)).astype(np.float32)
    model, blobs = run(text, {"x": x})
    (w,) = model.init(0)[0]["layer"]
    assert w.shape == (4, 4, 3, 3, 3)
    assert rel(blobs["y"], conv3d_loops(x, np.asarray(w), None, (1, 1), (1, 1))) < 1e-6


POOL_CASES = [  # (x shape, method, k, kd, stride, temporal_stride, pad)
    ((2, 2, 5, 6, 6), "MAX", 2, 2, 2, 2, 0),  # C3D's pool2..5; L=5: a clipped last window
    ((1, 2, 4, 7, 7), "MAX", 2, 1, 2, 1, 0),  # pool1: 1×2×2
    ((1, 1, 5, 5, 7), "MAX", 3, 2, 2, 2, 0),
    ((1, 2, 5, 6, 5), "AVE", 3, 2, 2, 2, 1),  # padded cells count, clipped ones do not
    ((2, 1, 4, 5, 5), "AVE", 2, 3, 2, 1, 0),
]


def pool_param(method, k, kd, st, ts, pad):
    return (f"pooling3d_param {{ pool: {method} kernel_size: {k} kernel_depth: {kd} "
            f"stride: {st} temporal_stride: {ts} pad: {pad} }}")  # fmt: skip


@pytest.mark.parametrize("shape,method,k,kd,st,ts,pad", POOL_CASES)
def test_pooling3d_matches_c3d_loops(shape, method, k, kd, st, ts, pad):
    text = net_text("Pooling3D", [shape], pool_param(method, k, kd, st, ts, pad))
    x = RNG.standard_normal(shape).astype(np.float32)
    _, blobs = run(text, {"x": x})
    want = pool3d_loops(x.astype(np.float64), method, k, kd, st, ts, pad)
    assert blobs["y"].shape == want.shape
    assert rel(blobs["y"], want) < 1e-6


def test_pooling3d_sizes_use_ceil_and_no_temporal_pad():
    # H = 6, k = 3, s = 2: ceil(3/2) + 1 = 3 (floor would give 2); L = 5, kd = 2, ts = 2: 3.
    text = net_text("Pooling3D", [(1, 1, 5, 6, 6)], pool_param("AVE", 3, 2, 2, 2, 1))
    model = compile_net(text)
    assert model.net.shapes[model.net.layers[1].tops[0]] == (1, 1, 3, 4, 4)
    text = net_text("Pooling3D", [(1, 1, 5, 6, 6)], pool_param("MAX", 3, 2, 2, 2, 0))
    model = compile_net(text)
    assert model.net.shapes[model.net.layers[1].tops[0]] == (1, 1, 3, 3, 3)


@pytest.mark.parametrize("k,kd,st,ts", [(2, 2, 2, 2), (3, 2, 2, 1), (2, 1, 1, 1)])
def test_max_pool3d_backward_sends_the_diff_to_every_tied_maximum(k, kd, st, ts):
    # disjoint windows (C3D's pools) and overlapping ones (the general scatter form)
    x = RNG.standard_normal((1, 2, 4, 5, 5)).astype(np.float32)
    x[0, 0] = 0.0  # a channel of zeros (a ReLU's output): every window ties
    text = net_text("Pooling3D", [x.shape], pool_param("MAX", k, kd, st, ts, 0))
    model = compile_net(text)
    dy = RNG.standard_normal(model.net.shapes[model.net.layers[1].tops[0]]).astype(np.float32)
    params, state = model.init(0)

    def f(x):
        return jitted.forward(model, params, state, {"x": x})[0]["y"]

    y, vjp = jax.vjp(f, jnp.asarray(x))
    (dx,) = vjp(jnp.asarray(dy))
    want = max_pool3d_backward_loops(x, np.asarray(y), dy, k, kd, st, ts)
    assert np.count_nonzero(want[0, 0, :2, :2, :2]) > 1  # the ties really do share the diff
    np.testing.assert_allclose(np.asarray(dx), want, rtol=1e-6, atol=1e-6)


def _fd_check(layer_text: str, shape, seed: int) -> None:
    """d(Σ top·r)/d(bottom and blobs) against central differences of the float64 forward."""
    with jax.enable_x64(True):
        text = net_text("L", [shape], "").replace('type: "L"', layer_text)
        model = compile_net(text, dtype=jnp.float64)
        params, state = model.init(seed)
        rng = np.random.default_rng(seed)
        r = rng.standard_normal(model.net.shapes[model.net.layers[1].tops[0]])
        args = [rng.standard_normal(shape)] + [np.asarray(p) for p in params.get("layer", [])]

        def loss(*args):
            blobs = model.apply({**params, "layer": list(args[1:])}, state, {"x": args[0]})[0]
            return jnp.sum(blobs["y"] * r)

        # the compiled train step's path: the gradient taken under jax.jit
        grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args)
        for j, (value, grad) in enumerate(zip(args, grads)):
            for index in rng.choice(value.size, size=min(12, value.size), replace=False):
                e = np.zeros(value.size)
                e[index] = 1e-6
                up, down = list(args), list(args)
                up[j], down[j] = value + e.reshape(value.shape), value - e.reshape(value.shape)
                numeric = (float(loss(*up)) - float(loss(*down))) / 2e-6
                assert abs(numeric - float(np.asarray(grad).ravel()[index])) < 1e-6


@pytest.mark.parametrize("layer", [
    'type: "Convolution3D" ' + conv_param(3, 3, 2, "stride: 2 pad: 1 temporal_pad: 1"),
    'type: "Pooling3D" ' + pool_param("MAX", 2, 2, 2, 1, 0),
    'type: "Pooling3D" ' + pool_param("AVE", 3, 2, 2, 2, 1),
])  # fmt: skip
def test_gradients_match_finite_differences_in_float64(layer):
    _fd_check(layer, (1, 2, 5, 5, 6), seed=3)


@pytest.mark.parametrize("kind,param,match", [
    ("Pooling3D", pool_param("MAX", 2, 2, 2, 2, 1), "padding is implemented only for average"),
    ("Pooling3D", pool_param("STOCHASTIC", 2, 2, 2, 2, 0), "STOCHASTIC pooling is not"),
    ("Pooling3D", "pooling3d_param { kernel_size: 2 }", "kernel_depth must be positive"),
    ("Pooling3D", pool_param("MAX", 2, 7, 2, 2, 0), "empty output"),
    ("Convolution3D", conv_param(2, 3, 9), "kernel 9 is larger than the padded input 5"),
    ("Convolution3D", conv_param(3, 3, 3, "filter_group: 2"), "not divisible by filter_group"),
    ("Convolution3D", "convolution3d_param { kernel_size: 3 kernel_depth: 3 }",
     "num_output must be positive"),
])  # fmt: skip
def test_refusals_name_the_layer(kind, param, match):
    with pytest.raises(NetError, match=f"layer 'layer' \\(type {kind}\\): .*{match}"):
        compile_net(net_text(kind, [(1, 2, 5, 6, 6)], param))


def test_a_4d_bottom_is_refused():
    with pytest.raises(NetError, match="input must have 5 axes"):
        compile_net(net_text("Pooling3D", [(1, 2, 6, 6)], pool_param("MAX", 2, 2, 2, 2, 0)))


def test_bvlc_nd_convolution_runs_on_5d_blobs():
    # BVLC's Convolution is N-D already: three spatial axes, per-axis kernel/stride/pad.
    param = ("convolution_param { num_output: 2 kernel_size: 3 kernel_size: 2 kernel_size: 2 "
             "pad: 1 pad: 0 pad: 1 stride: 1 stride: 2 stride: 1 "
             "weight_filler { type: 'gaussian' std: 0.1 } }")  # fmt: skip
    x = RNG.standard_normal((1, 2, 4, 5, 5)).astype(np.float32)
    model, blobs = run(net_text("Convolution", [x.shape], param), {"x": x})
    w, b = (np.asarray(p) for p in model.init(0)[0]["layer"])
    xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (0, 0), (1, 1)])
    want = np.zeros((1, 2, 4, 2, 6))
    for f, a, r, q in itertools.product(range(2), range(4), range(2), range(6)):
        want[0, f, a, r, q] = (
            np.sum(xp[0, :, a : a + 3, 2 * r : 2 * r + 2, q : q + 2] * w[f]) + b[f]
        )
    assert rel(blobs["y"], want) < 1e-6


C3D_V10 = """name: "c3d"
input: "data" input_dim: 1 input_dim: 2 input_dim: 4 input_dim: 4
layers { name: "conv1a" type: CONVOLUTION3D bottom: "data" top: "conv1a"
  convolution_param { num_output: 3 kernel_size: 3 kernel_depth: 3 pad: 1 temporal_pad: 1 } }
layers { name: "pool1" type: POOLING3D bottom: "conv1a" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 kernel_depth: 1 stride: 2 temporal_stride: 1 } }
"""


def test_c3d_v10_net_loads_5d_weights_and_runs(tmp_path):
    # C3D v1.0 nets are V1 text; a 5-D input is declared with input_shape in v1.0's
    # successor, so the 5-D blob enters through an Input layer added by hand here.
    proto = tmp_path / "c3d.prototxt"
    proto.write_text(C3D_V10.replace(
        'input: "data" input_dim: 1 input_dim: 2 input_dim: 4 input_dim: 4',
        'input: "data" input_shape { dim: 1 dim: 2 dim: 3 dim: 4 dim: 4 }'))  # fmt: skip
    w = RNG.standard_normal((3, 2, 3, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    blobs = ld(6, c3d_blob(w.shape, w.ravel())) + ld(6, c3d_blob((1, 1, 1, 1, 3), b))
    weights = tmp_path / "c3d.caffemodel"
    weights.write_bytes(s(1, "c3d") + v1_layer("conv1a", 30, blobs))
    model = compile_net(str(proto))
    assert model.net.dialect == "c3d-v1.0"
    assert model.net.layers[1].type == "Convolution3D" and model.net.layers[1].form == "c3d-v1.0"
    params, state = load_weights(str(weights), model)
    np.testing.assert_array_equal(np.asarray(params["conv1a"][0]), w)
    np.testing.assert_array_equal(np.asarray(params["conv1a"][1]).ravel(), b)
    x = RNG.standard_normal((1, 2, 3, 4, 4)).astype(np.float32)
    out, _ = jitted.forward(model, params, state, {"data": x})
    conv = conv3d_loops(x.astype(np.float64), w, b, (1, 1), (1, 1))
    want = pool3d_loops(conv, "MAX", 2, 1, 2, 1, 0)
    assert rel(out["pool1"], want) < 1e-6


C3D_V11 = """name: "c3d11"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 1 dim: 2 dim: 3 dim: 4 dim: 4 } } }
layer { name: "conv1a" type: "Convolution3D" bottom: "data" top: "conv1a"
  convolution3d_param { num_output: 3 kernel_size: 3 kernel_depth: 3 pad: 1 temporal_pad: 1 } }
"""


def test_c3d_v11_weights_are_bvlc_5d_blobs_and_round_trip(tmp_path):
    from caffe2jax.runtime.formats.weights import save_weights

    proto = tmp_path / "c3d11.prototxt"
    proto.write_text(C3D_V11)
    w = RNG.standard_normal((3, 2, 3, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    blobs = ld(7, bvlc_blob(w.shape, w.ravel())) + ld(7, bvlc_blob((1, 1, 1, 1, 3), b))
    weights = tmp_path / "c3d11.caffemodel"
    weights.write_bytes(s(1, "c3d11") + v2_layer("conv1a", "Convolution3D", blobs))
    model = compile_net(str(proto))
    assert model.net.dialect == "c3d-v1.1"
    params, state = load_weights(str(weights), model)
    np.testing.assert_array_equal(np.asarray(params["conv1a"][0]), w)
    save_weights(tmp_path / "again.caffemodel", model, params, state)
    again, _ = load_weights(str(tmp_path / "again.caffemodel"), model)
    for got, want in zip(again["conv1a"], params["conv1a"], strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
