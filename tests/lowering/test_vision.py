"""The vision family beyond the golden cases: STOCHASTIC pooling statistics and gradient
routing, MAX pooling ties, Caffe's pooled-size rule at its boundaries, global pooling, N-D and
batched-axis convolution and deconvolution against numpy references, Im2col as Caffe's column
buffer, SPP's single level, and the errors for configurations Caffe refuses."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering import pooling
from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.lowering.registry import Context

jax.config.update("jax_default_matmul_precision", "highest")

RNG = np.random.default_rng(20240607)


def net_text(kind, shapes, param="", tops=("y",), bottoms=("x", "ref")):
    """Input (one top per shape) → one ``kind`` layer named 'layer'."""
    names = bottoms[: len(shapes)]
    input_tops = "".join(f'top: "{n}" ' for n in names)
    input_shapes = "".join("shape { " + "".join(f"dim: {d} " for d in s) + "} " for s in shapes)
    layer_bottoms = "".join(f'bottom: "{n}" ' for n in names)
    layer_tops = "".join(f'top: "{t}" ' for t in tops)
    return (
        "force_backward: true\n"
        f'layer {{ name: "input" type: "Input" {input_tops} input_param {{ {input_shapes} }} }}\n'
        f'layer {{ name: "layer" type: "{kind}" {layer_bottoms} {layer_tops} {param} }}\n'
    )


def run(text, inputs, params=None, phase="TEST", rng=None):
    """Compile and run; returns (model, blobs)."""
    model = compile_net(text, phase=phase)
    init, state = model.init(0)
    if params is not None:
        init["layer"] = [jnp.asarray(p) for p in params]
    blobs, _ = model.apply(init, state, inputs, rng)
    return model, blobs


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# -- pooling ----------------------------------------------------------------------------------


def caffe_max_pool(x, k, s, p, out):
    """Caffe's MaxPoolForward/Backward loops in numpy: (top, mask, backward(top_diff))."""
    n, c, h, w = x.shape
    top = np.zeros((n, c) + out)
    mask = np.full((n, c) + out, -1)
    for b, ch, ph, pw in itertools.product(range(n), range(c), range(out[0]), range(out[1])):
        hs, ws = ph * s[0] - p[0], pw * s[1] - p[1]
        he, we = min(hs + k[0], h), min(ws + k[1], w)
        best = -np.finfo(np.float32).max
        for hh, ww in itertools.product(range(max(hs, 0), he), range(max(ws, 0), we)):
            if x[b, ch, hh, ww] > best:
                best, mask[b, ch, ph, pw] = x[b, ch, hh, ww], hh * w + ww
        top[b, ch, ph, pw] = best

    def backward(dy):
        dx = np.zeros((n, c, h * w))
        for b, ch in itertools.product(range(n), range(c)):
            np.add.at(dx[b, ch], mask[b, ch].ravel(), dy[b, ch].ravel())
        return dx.reshape(x.shape)

    return top, mask, backward


@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (2, 1, 0), (3, 1, 1), (2, 2, 1), (3, 2, 0)])
def test_max_pool_ties_route_to_first_max(k, s, p):
    """Heavily tied inputs: value, mask top and gradient all pick Caffe's first maximum."""
    x = RNG.integers(0, 3, (2, 2, 7, 6)).astype(np.float32)
    param = f"pooling_param {{ pool: MAX kernel_size: {k} stride: {s} pad: {p} }}"
    model = compile_net(net_text("Pooling", [x.shape], param, tops=("y", "mask")))
    params, state = model.init(0)

    def forward(x):
        blobs, _ = model.apply(params, state, {"x": x})
        return blobs["y"], blobs["mask"]

    (y, mask), vjp = jax.vjp(forward, jnp.asarray(x))
    top, ref_mask, backward = caffe_max_pool(x, (k, k), (s, s), (p, p), y.shape[2:])
    np.testing.assert_array_equal(y, top)
    np.testing.assert_array_equal(mask, ref_mask)
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    (dx,) = vjp((jnp.asarray(dy), jnp.ones_like(mask)))  # the mask's diff is ignored
    np.testing.assert_allclose(dx, backward(dy), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["phases", "xla"])
@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (2, 2, 0), (3, 3, 0), (2, 2, 1), (3, 1, 1)])
def test_max_pool_backward_forms_both_route_to_first_max(mode, k, s, p, monkeypatch):
    """MAX pooling's two forms (per-offset selects and phase sums, XLA's select_and_scatter)."""
    monkeypatch.setattr(pooling, "POOL_BACKWARD", mode)
    test_max_pool_ties_route_to_first_max(k, s, p)


def caffe_ave_pool(x, k, s, p, out):
    """Caffe's AvePoolForward/Backward loops in numpy (float64): (top, backward(top_diff))."""
    n, c, h, w = x.shape
    top = np.zeros((n, c) + out)
    windows = []
    for ph, pw in itertools.product(range(out[0]), range(out[1])):
        hs, ws = ph * s[0] - p[0], pw * s[1] - p[1]
        he, we = min(hs + k[0], h + p[0]), min(ws + k[1], w + p[1])
        size = (he - hs) * (we - ws)
        rows, cols = slice(max(hs, 0), min(he, h)), slice(max(ws, 0), min(we, w))
        top[:, :, ph, pw] = x[:, :, rows, cols].sum(axis=(2, 3)) / size
        windows.append((ph, pw, rows, cols, size))

    def backward(dy):
        dx = np.zeros(x.shape)
        for ph, pw, rows, cols, size in windows:
            dx[:, :, rows, cols] += dy[:, :, ph, pw, None, None] / size
        return dx

    return top, backward


@pytest.mark.parametrize("mode", ["phases", "phases-rw", "xla"])
@pytest.mark.parametrize("k,s,p", [(3, 2, 0), (3, 2, 1), (2, 3, 1), (3, 1, 1), (5, 3, 2)])
@pytest.mark.parametrize("nhwc", [False, True])
def test_ave_pool_forms_match_caffe(mode, k, s, p, nhwc, monkeypatch):
    """AVE pooling's forms (views or reduce_window forward with the phase-sum backward; XLA's
    reduce_window and its transpose), NCHW and channels-last, against Caffe's loops (ceil
    mode, windows clipped at the padded border)."""
    views = mode != "phases-rw"
    mode = mode.removesuffix("-rw")
    monkeypatch.setattr(pooling, "POOL_BACKWARD", mode)
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    spec = pooling.make_spec(None, pooling.AVE, x.shape[2:], (k, k), (s, s), (p, p))
    to, back = ((lambda a: a.transpose(0, 2, 3, 1)), (lambda a: a.transpose(0, 3, 1, 2)))
    if not nhwc:
        to = back = lambda a: a
    y, vjp = jax.vjp(lambda x: back(pooling.ave_pool(to(x), spec, nhwc, views)), jnp.asarray(x))
    top, backward = caffe_ave_pool(x.astype(np.float64), (k, k), (s, s), (p, p), spec.out)
    np.testing.assert_allclose(y, top, rtol=1e-6, atol=1e-6)
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    np.testing.assert_allclose(vjp(jnp.asarray(dy))[0], backward(dy), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("views", [True, False])
@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (2, 1, 0), (3, 2, 0)])
def test_max_pool_reduce_window_forward_keeps_first_max(views, k, s, p):
    """Behind an expensive layer the MAX forward is XLA's reduce_window (windows.window_max);
    either forward, the backward still routes each diff to Caffe's first maximum."""
    x = RNG.integers(0, 3, (2, 2, 7, 6)).astype(np.float32)
    spec = pooling.make_spec(None, pooling.MAX, x.shape[2:], (k, k), (s, s), (p, p))
    y, vjp = jax.vjp(lambda x: pooling.max_pool(x, spec, views=views), jnp.asarray(x))
    top, _, backward = caffe_max_pool(x, (k, k), (s, s), (p, p), spec.out)
    np.testing.assert_array_equal(y, top)
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    np.testing.assert_allclose(vjp(jnp.asarray(dy))[0], backward(dy), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("producer,reads_once", [("LRN", True), ("ReLU", False)])
def test_pooling_reads_an_expensive_bottom_once(producer, reads_once):
    """Behind LRN (power per element) pooling uses reduce_window, which reads its input once;
    behind ReLU it uses the k_h·k_w strided views XLA fuses (lowering/pooling.py)."""
    text = f"""
input: "x" input_shape {{ dim: 1 dim: 4 dim: 9 dim: 9 }}
layer {{ name: "p" type: "{producer}" bottom: "x" top: "h" }}
layer {{ name: "pool" type: "Pooling" bottom: "h" top: "y"
        pooling_param {{ pool: MAX kernel_size: 3 stride: 2 }} }}
"""
    model = compile_net(text)
    params, state = model.init(0)
    jaxpr = str(jax.make_jaxpr(lambda x: model.apply(params, state, {"x": x})[0]["y"])(
        jnp.zeros((1, 4, 9, 9))))  # fmt: skip
    assert ("reduce_window_max" in jaxpr) == reads_once


@pytest.mark.parametrize(
    "size,k,s,p,ceil,expected",
    [
        (6, 3, 2, 0, True, 3),  # (6-3)/2 = 1.5: ceil 2 + 1
        (6, 3, 2, 0, False, 2),  # floor 1 + 1
        (7, 3, 2, 0, True, 3),  # exact division: both rules agree
        (7, 3, 2, 0, False, 3),
        (5, 2, 2, 1, True, 3),  # ceil gives 4, the last window starts in the pad: dropped
        (6, 2, 2, 1, True, 4),  # (4-1)·2 = 6 < 6+1: kept
        (5, 2, 2, 1, False, 3),
    ],
)
def test_pooled_size_ceil_floor_boundary(size, k, s, p, ceil, expected):
    assert pooling.pooled_size(size, k, s, p, ceil, padded=p > 0) == expected
    mode = "" if ceil else "round_mode: FLOOR"
    param = f"pooling_param {{ pool: AVE kernel_size: {k} stride: {s} pad: {p} {mode} }}"
    model = compile_net(net_text("Pooling", [(1, 1, size, size)], param))
    assert model.net.shapes[model.net.blob_names["y"]] == (1, 1, expected, expected)


def test_pad_correction_applies_to_both_axes_when_any_pad_is_set():
    """Caffe drops a last window starting at or past ``H + pad_h`` on every axis once pad_h or
    pad_w is non-zero: with pad_w only, the unpadded height loses its window starting at H."""
    assert pooling.pooled_size(4, 1, 2, 0, True, padded=False) == 3
    assert pooling.pooled_size(4, 1, 2, 0, True, padded=True) == 2
    param = "pooling_param { pool: MAX kernel_h: 1 kernel_w: 2 stride: 2 pad_h: 0 pad_w: 1 }"
    model = compile_net(net_text("Pooling", [(1, 1, 4, 4)], param))
    assert model.net.shapes[model.net.blob_names["y"]] == (1, 1, 2, 3)


def test_max_pool_empty_window_is_minus_flt_max():
    """kernel < stride without pad: ceil mode adds a window past the input. Caffe outputs its
    −FLT_MAX start there, a −1 mask, and routes no gradient."""
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    param = "pooling_param { pool: MAX kernel_size: 1 stride: 2 }"
    model = compile_net(net_text("Pooling", [x.shape], param, tops=("y", "mask")))
    params, state = model.init(0)

    def forward(x):
        return model.apply(params, state, {"x": x})[0]["y"]

    y, vjp = jax.vjp(forward, jnp.asarray(x))
    top, mask, backward = caffe_max_pool(x, (1, 1), (2, 2), (0, 0), (3, 3))
    np.testing.assert_array_equal(y, top.astype(np.float32))
    assert mask[0, 0, 2, 2] == -1
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    np.testing.assert_allclose(vjp(jnp.asarray(dy))[0], backward(dy * (mask >= 0)), atol=1e-7)


@pytest.mark.parametrize("method,reduce", [("MAX", np.max), ("AVE", np.mean)])
def test_global_pooling(method, reduce):
    x = RNG.standard_normal((2, 3, 5, 7)).astype(np.float32)
    param = f"pooling_param {{ pool: {method} global_pooling: true }}"
    _, blobs = run(net_text("Pooling", [x.shape], param), {"x": x})
    np.testing.assert_allclose(blobs["y"], reduce(x, axis=(2, 3), keepdims=True), atol=1e-6)


def test_global_pooling_refuses_a_kernel_size():
    param = "pooling_param { pool: MAX global_pooling: true kernel_size: 2 }"
    with pytest.raises(NetError, match="'layer'.*global_pooling"):
        compile_net(net_text("Pooling", [(1, 1, 4, 4)], param))


def _stochastic(x, train, key=None):
    spec = pooling.make_spec(None, pooling.STOCHASTIC, x.shape[2:], (2, 2), (2, 2), (0, 0))
    ctx = Context("TRAIN" if train else "TEST", key)
    return pooling.stochastic_pool(x, spec, train, ctx)


def test_stochastic_train_samples_in_proportion_to_value():
    """One 2×2 window repeated 40000 times: each element is drawn with probability x/Σx."""
    window = np.array([[0.5, 1.0], [2.0, 4.5]], np.float32)
    n = 40000
    x = jnp.asarray(np.tile(window, (n, 1, 1, 1)))
    y = np.asarray(_stochastic(x, True, jax.random.key(7)))[:, 0, 0, 0]
    p = window.ravel() / window.sum()
    freq = np.array([(y == v).mean() for v in window.ravel()])
    assert freq.sum() == pytest.approx(1.0)
    # 5 standard errors of a binomial proportion: a false failure has odds below 1e-6.
    np.testing.assert_array_less(np.abs(freq - p), 5 * np.sqrt(p * (1 - p) / n))


def test_stochastic_train_gradient_reaches_only_the_sampled_element():
    x = jnp.asarray(RNG.uniform(0.1, 1.0, (3, 2, 6, 5)).astype(np.float32))  # ceil: 3×3 out
    key = jax.random.key(3)
    y, vjp = jax.vjp(lambda v: _stochastic(v, True, key), x)
    assert y.shape == (3, 2, 3, 3)
    dy = jnp.asarray(RNG.standard_normal(y.shape).astype(np.float32))
    (dx,) = vjp(dy)
    # Values are distinct, so each window's sample is located by its value.
    dx_ref = np.zeros(x.shape, np.float32)
    xs, ys = np.asarray(x), np.asarray(y)
    for b, c, i, j in itertools.product(*map(range, y.shape)):
        patch = xs[b, c, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2]
        (hh,), (ww,) = np.nonzero(patch == ys[b, c, i, j])
        dx_ref[b, c, 2 * i + hh, 2 * j + ww] += dy[b, c, i, j]
    np.testing.assert_array_equal(dx, dx_ref)


def test_stochastic_test_phase_weights_by_value():
    x = RNG.uniform(0.0, 1.0, (2, 3, 5, 4)).astype(np.float32)
    param = "pooling_param { pool: STOCHASTIC kernel_size: 2 stride: 2 }"
    _, blobs = run(net_text("Pooling", [x.shape], param), {"x": x})
    ref = np.zeros((2, 3, 3, 2))
    for i, j in itertools.product(range(3), range(2)):
        patch = x[:, :, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2].astype(np.float64)
        ref[:, :, i, j] = (patch**2).sum((2, 3)) / patch.sum((2, 3))
    np.testing.assert_allclose(blobs["y"], ref, rtol=1e-6)
    _, zeros = run(net_text("Pooling", [x.shape], param), {"x": np.zeros_like(x)})
    np.testing.assert_array_equal(zeros["y"], 0.0)  # Caffe's FLT_MIN start: 0/FLT_MIN


def test_stochastic_refuses_padding_and_mask_top():
    param = "pooling_param { pool: STOCHASTIC kernel_size: 2 pad: 1 }"
    with pytest.raises(NetError, match="'layer'.*padding"):
        compile_net(net_text("Pooling", [(1, 1, 4, 4)], param))
    param = "pooling_param { pool: AVE kernel_size: 2 }"
    with pytest.raises(NetError, match="'layer'.*1 top"):
        compile_net(net_text("Pooling", [(1, 1, 4, 4)], param, tops=("y", "mask")))


def test_spp_single_level_keeps_the_pooled_4d_top():
    x = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
    param = "spp_param { pyramid_height: 1 pool: MAX }"
    _, blobs = run(net_text("SPP", [x.shape], param), {"x": x})
    np.testing.assert_array_equal(blobs["y"], x.max(axis=(2, 3), keepdims=True))


# -- convolution ------------------------------------------------------------------------------


def conv_ref(x, w, b, stride, pad, dil, group):
    """Caffe's grouped N-D convolution in float64 numpy: one einsum per kernel offset."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    ks = w.shape[2:]
    out = tuple(
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, p, d, k, s in zip(x.shape[2:], pad, dil, ks, stride)
    )
    cg, og = x.shape[1] // group, w.shape[0] // group
    y = np.zeros((x.shape[0], w.shape[0]) + out)
    for off in itertools.product(*map(range, ks)):
        idx = tuple(
            slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, n, s in zip(off, dil, out, stride)
        )
        patch = xp[(slice(None), slice(None)) + idx]
        for g in range(group):
            wg = w[(slice(g * og, (g + 1) * og), slice(None)) + off]
            y[:, g * og : (g + 1) * og] += np.einsum(
                "nc...,oc->no...", patch[:, g * cg : (g + 1) * cg], wg
            )
    return y + np.asarray(b, np.float64).reshape((-1,) + (1,) * len(out))


def test_conv_3d_matches_numpy():
    x = RNG.standard_normal((2, 4, 5, 6, 7)).astype(np.float32)
    w = RNG.standard_normal((6, 2, 3, 2, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    param = (
        "convolution_param { num_output: 6 group: 2 kernel_size: 3 kernel_size: 2 "
        "kernel_size: 3 stride: 2 stride: 1 stride: 2 pad: 1 pad: 0 pad: 2 dilation: 1 "
        "dilation: 2 dilation: 1 }"
    )
    _, blobs = run(net_text("Convolution", [x.shape], param), {"x": x}, [w, b])
    ref = conv_ref(x, w, b, (2, 1, 2), (1, 0, 2), (1, 2, 1), 2)
    assert blobs["y"].shape == ref.shape
    assert rel(blobs["y"], ref) < 1e-6


def test_conv_axis_treats_leading_axes_as_batch():
    x = RNG.standard_normal((2, 3, 4, 6, 5)).astype(np.float32)
    w = RNG.standard_normal((5, 4, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(5).astype(np.float32)
    param = "convolution_param { num_output: 5 kernel_size: 3 pad: 1 axis: 2 }"
    _, blobs = run(net_text("Convolution", [x.shape], param), {"x": x}, [w, b])
    ref = conv_ref(x.reshape(6, 4, 6, 5), w, b, (1, 1), (1, 1), (1, 1), 1)
    assert rel(blobs["y"], ref.reshape(2, 3, 5, 6, 5)) < 1e-6


def test_conv_two_bottoms_share_weights():
    x1 = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    x2 = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    text = (
        'layer { name: "in" type: "Input" top: "a" top: "b" '
        "input_param { shape { dim: 1 dim: 2 dim: 5 dim: 5 } } }\n"
        'layer { name: "layer" type: "Convolution" bottom: "a" bottom: "b" top: "ya" top: "yb" '
        "convolution_param { num_output: 3 kernel_size: 3 } }"
    )
    w = RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)
    b = np.zeros(3, np.float32)
    _, blobs = run(text, {"a": x1, "b": x2}, [w, b])
    for x, top in ((x1, "ya"), (x2, "yb")):
        assert rel(blobs[top], conv_ref(x, w, b, (1, 1), (0, 0), (1, 1), 1)) < 1e-6


def deconv_ref(x, w, b, stride, pad, dil, group):
    """Caffe's deconvolution in numpy: every input pixel scatters its kernel (col2im)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    ks, n_in = w.shape[2:], x.shape[2:]
    full = tuple(s * (n - 1) + d * (k - 1) + 1 for s, n, d, k in zip(stride, n_in, dil, ks))
    cg, og = x.shape[1] // group, w.shape[1]
    y = np.zeros((x.shape[0], og * group) + full)
    for off in itertools.product(*map(range, ks)):
        idx = tuple(
            slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, n, s in zip(off, dil, n_in, stride)
        )
        for g in range(group):
            wg = w[(slice(g * cg, (g + 1) * cg), slice(None)) + off]
            y[(slice(None), slice(g * og, (g + 1) * og)) + idx] += np.einsum(
                "nc...,co->no...", x[:, g * cg : (g + 1) * cg], wg
            )
    crop = tuple(slice(p, f - p) for p, f in zip(pad, full))
    return y[(slice(None), slice(None)) + crop] + b.reshape((-1,) + (1,) * len(ks))


@pytest.mark.parametrize(
    "k,s,p,d,group",
    [(3, 2, 1, 1, 2), (2, 3, 0, 2, 1), (1, 2, 1, 1, 1), (3, 2, 3, 1, 3)],  # pad > extent−1
)
def test_deconv_matches_scatter_reference(k, s, p, d, group):
    x = RNG.standard_normal((2, 6, 4, 5)).astype(np.float32)
    w = RNG.standard_normal((6, 2, k, k)).astype(np.float32)
    b = RNG.standard_normal(2 * group).astype(np.float32)
    param = (
        f"convolution_param {{ num_output: {2 * group} kernel_size: {k} stride: {s} pad: {p} "
        f"dilation: {d} group: {group} }}"
    )
    _, blobs = run(net_text("Deconvolution", [x.shape], param), {"x": x}, [w, b])
    ref = deconv_ref(x, w, b, (s, s), (p, p), (d, d), group)
    assert blobs["y"].shape == ref.shape
    assert rel(blobs["y"], ref) < 1e-6


def test_im2col_times_weights_is_convolution():
    """Caffe's convolution is W (O, C·kh·kw) times the Im2col column buffer."""
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 3, 2)).astype(np.float32)
    geometry = "kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 1"
    _, blobs = run(net_text("Im2col", [x.shape], f"convolution_param {{ {geometry} }}"), {"x": x})
    cols = np.asarray(blobs["y"], np.float64)
    ours = np.einsum("ok,nk...->no...", w.reshape(4, -1).astype(np.float64), cols)
    ref = conv_ref(x, w, np.zeros(4), (2, 1), (1, 1), (1, 1), 1)
    assert rel(ours, ref) < 1e-6


# -- LRN and Crop -----------------------------------------------------------------------------


def test_lrn_across_channels_matches_numpy():
    x = RNG.standard_normal((2, 7, 3, 4)).astype(np.float32)
    param = "lrn_param { local_size: 5 alpha: 0.7 beta: 0.6 k: 1.5 }"
    _, blobs = run(net_text("LRN", [x.shape], param), {"x": x})
    sq = np.pad(x.astype(np.float64) ** 2, [(0, 0), (2, 2), (0, 0), (0, 0)])
    window = sum(sq[:, i : i + 7] for i in range(5))
    assert rel(blobs["y"], x * (1.5 + 0.7 / 5 * window) ** -0.6) < 1e-6


def test_crop_one_offset_for_every_cropped_axis():
    x = RNG.standard_normal((2, 5, 6, 7)).astype(np.float32)
    ref = np.zeros((2, 3, 4, 4), np.float32)
    text = net_text("Crop", [x.shape, ref.shape], "crop_param { axis: 1 offset: 1 }")
    _, blobs = run(text, {"x": x, "ref": ref})
    np.testing.assert_array_equal(blobs["y"], x[:, 1:4, 1:5, 1:5])


# -- errors Caffe raises ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,shapes,param,match",
    [
        ("Convolution", [(1, 2, 4, 4)], "convolution_param { num_output: 2 kernel_size: 7 }",
         "larger than the padded input"),
        ("Convolution", [(1, 2, 4, 4)],
         "convolution_param { num_output: 2 kernel_size: 3 dilation: 3 pad: 1 }",
         "larger than the padded input"),
        ("Convolution", [(1, 4, 5, 5)],
         "convolution_param { num_output: 3 kernel_size: 3 group: 2 }",
         "num_output 3 is not divisible by group 2"),
        ("Convolution", [(1, 3, 5, 5)],
         "convolution_param { num_output: 4 kernel_size: 3 group: 2 }",
         "channels 3 are not divisible by group 2"),
        ("Deconvolution", [(1, 3, 5, 5)],
         "convolution_param { num_output: 4 kernel_size: 3 group: 2 }",
         "channels 3 are not divisible by group 2"),
        ("Convolution", [(1, 3, 5, 5)],
         "convolution_param { num_output: 4 kernel_size: 3 kernel_size: 3 kernel_size: 3 }",
         "once per spatial dimension"),
        ("Convolution", [(1, 3, 5, 5, 5)],
         "convolution_param { num_output: 4 kernel_h: 3 kernel_w: 3 }",
         "only be used for 2D"),
        ("Convolution", [(1, 3, 5, 5)], "convolution_param { num_output: 4 }",
         "kernel_size must be specified"),
        ("Crop", [(1, 3, 5, 5), (1, 3, 4, 4)], "crop_param { axis: 2 offset: 2 }",
         "invalid crop in axis 2"),
        ("Crop", [(1, 3, 5, 5), (1, 3, 4, 4)], "crop_param { axis: 1 offset: 0 offset: 1 }",
         "2 offsets given for 3 cropped axes"),
        ("Crop", [(1, 3, 5, 5), (1, 3, 4)], "", "axes; they must be equal"),
        ("Pooling", [(1, 3, 5, 5)], "pooling_param { pool: MAX kernel_size: 2 pad: 2 }",
         "must be smaller than kernel"),
        ("Pooling", [(1, 3, 5, 5)], "pooling_param { pool: MAX kernel_h: 2 }",
         "kernel_size OR both kernel_h and kernel_w"),
        ("Pooling", [(1, 3, 5)], "pooling_param { pool: MAX kernel_size: 2 }", "4 axes"),
        ("Pooling", [(1, 3, 5, 5)], "pooling_param { pool: MAX kernel_size: 7 }",
         "empty output"),
        ("LRN", [(1, 3, 5, 5)], "lrn_param { local_size: 4 }", "odd values"),
        ("SPP", [(1, 3, 5, 5)], "spp_param { pyramid_height: 3 }", "smaller than kernel"),
    ],
)  # fmt: skip
def test_refused_configurations_name_the_layer(kind, shapes, param, match):
    with pytest.raises(NetError, match=rf"layer 'layer' \(type {kind}\).*{match}"):
        compile_net(net_text(kind, shapes, param))


def test_forward_mode_autodiff_through_pooling_with_the_xla_form(monkeypatch):
    """The fast pooling form is a custom VJP (reverse mode only); ``CAFFE2JAX_POOL=xla`` gives
    XLA's reduce_window, which jax.jvp goes through, with the same tangent as the reverse
    mode's Jacobian."""
    x = RNG.standard_normal((1, 2, 7, 7)).astype(np.float32)
    t = RNG.standard_normal(x.shape).astype(np.float32)
    for method in ("MAX", "AVE"):
        param = f"pooling_param {{ pool: {method} kernel_size: 3 stride: 2 pad: 1 }}"
        model = compile_net(net_text("Pooling", [x.shape], param))
        params, state = model.init(0)

        def f(x, model=model, params=params, state=state):
            return model.apply(params, state, {"x": x})[0]["y"]

        monkeypatch.setenv(pooling.POOL_ENV, "phases")
        with pytest.raises(TypeError, match="custom_vjp"):
            jax.jvp(f, (x,), (t,))
        y, vjp = jax.vjp(f, x)
        monkeypatch.setenv(pooling.POOL_ENV, "xla")
        _, tangent = jax.jvp(f, (x,), (t,))
        # <J t, u> = <t, J^T u> for a random u: forward and reverse modes agree
        u = RNG.standard_normal(y.shape).astype(np.float32)
        np.testing.assert_allclose(np.vdot(tangent, u), np.vdot(t, vjp(u)[0]), rtol=1e-5)
    monkeypatch.setenv(pooling.POOL_ENV, "fast")
    with pytest.raises(NetError, match="CAFFE2JAX_POOL='fast': use auto, phases or xla"):
        compile_net(net_text("Pooling", [x.shape], "pooling_param { pool: MAX kernel_size: 2 }"))


def _conv_form_vs_lax_conv(monkeypatch, attr, on_off, x, conv_param, tol):
    """A conv+ReLU net with ``vision.<attr>`` set to each of ``on_off``: the 'on' form uses no
    lax.conv (on CPU), and its top and every gradient equal the 'off' form's to ``tol`` of
    each array's largest magnitude. Returns the top's shape."""
    from caffe2jax.lowering import vision

    dims = " ".join(f"dim: {n}" for n in x.shape)
    text = f"""
input: "x" input_shape {{ {dims} }}
layer {{ name: "c" type: "Convolution" bottom: "x" top: "y"
        convolution_param {{ {conv_param} weight_filler {{ type: "gaussian" std: 1 }}
                             bias_filler {{ type: "gaussian" std: 1 }} }} }}
layer {{ name: "r" type: "ReLU" bottom: "y" top: "y" }}
"""
    results = []
    for value in on_off:
        monkeypatch.setattr(vision, attr, value)
        model = compile_net(text)
        params, state = model.init(0)

        def f(params, x, model=model, state=state):
            return model.apply(params, state, {"x": x})[0]["y"]

        jaxpr = str(jax.make_jaxpr(f)(params, x))
        uses_conv = "conv_general_dilated" in jaxpr
        assert uses_conv == (value == on_off[1] or jax.default_backend() != "cpu"), attr
        y, vjp = jax.vjp(f, params, x)
        dy = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
        results.append((y, *vjp(dy)))
    for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())
    return results[0][0].shape


@pytest.mark.parametrize("stride", [1, 2])
def test_pointwise_convolution_as_a_matrix_product_equals_the_convolution(stride, monkeypatch):
    """On CPU a channels-last 1×1 convolution is one matrix product over channels
    (lowering/vision.py POINTWISE_DOT): the same top and gradients as lax.conv, to float
    rounding (the two sum the channels in different orders)."""
    monkeypatch.setenv("CAFFE2JAX_CPU_CONV", "xla")
    x = RNG.standard_normal((2, 6, 7, 5)).astype(np.float32)
    param = f"num_output: 4 kernel_size: 1 stride: {stride}"
    shape = _conv_form_vs_lax_conv(monkeypatch, "POINTWISE_DOT", (True, False), x, param, 1e-6)
    assert shape == (2, 4, -(-7 // stride), -(-5 // stride))


@pytest.mark.parametrize("c,k,s,p,d", [(1, 5, 1, 0, 1), (3, 5, 1, 2, 1), (3, 3, 2, 1, 1),
                                       (3, 3, 1, 2, 2), (4, 2, 3, 1, 1)])  # fmt: skip
def test_few_channel_convolution_as_patches_equals_the_convolution(c, k, s, p, d, monkeypatch):
    """On CPU a convolution of ≤ 4 input channels that oneDNN does not take is im2col + one
    matrix product (lowering/vision.py FEW_CHANNELS): the same top and gradients as lax.conv,
    to float rounding, padded, strided and dilated."""
    monkeypatch.delenv("CAFFE2JAX_CPU_CONV", raising=False)
    x = RNG.standard_normal((2, c, 9, 8)).astype(np.float32)
    param = f"num_output: 5 kernel_size: {k} stride: {s} pad: {p} dilation: {d}"
    _conv_form_vs_lax_conv(monkeypatch, "FEW_CHANNELS", (4, 0), x, param, 1e-5)


@pytest.mark.parametrize("k,s", [(2, 2), (3, 2)])
def test_pooling_off_the_cpu_keeps_the_forms_the_gpu_table_measured(k, s, monkeypatch):
    """``auto`` off the CPU: reduce_window forwards, per-offset selects for non-overlapping
    MAX windows, select_and_scatter for overlapping ones; the same values and diffs, ties
    included, as the xla form."""
    x = jnp.asarray(RNG.integers(0, 3, (2, 2, 8, 8)).astype(np.float32))
    spec = pooling.make_spec(None, pooling.MAX, (8, 8), (k, k), (s, s), (0, 0))
    results = {}
    for form in ("auto", "xla"):
        monkeypatch.setenv(pooling.POOL_ENV, form)
        with monkeypatch.context() as m:
            m.setattr(jax, "default_backend", lambda: "gpu")
            f = lambda x: pooling.max_pool(x, spec)  # noqa: E731
            jaxpr = str(jax.make_jaxpr(f)(x))
            y, vjp = jax.vjp(f, x)
            results[form] = y, vjp(jnp.arange(y.size, dtype=y.dtype).reshape(y.shape))[0]
        assert "reduce_window_max" in jaxpr
        assert ("custom_vjp" in jaxpr) == (form == "auto" and k <= s)
    for a, b in zip(results["auto"], results["xla"]):
        np.testing.assert_array_equal(a, b)
