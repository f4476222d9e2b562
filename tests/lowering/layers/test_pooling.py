"""The Pooling family (lowering/layers/pooling.py) beyond the golden cases: MAX pooling ties and its
mask top, Caffe's pooled-size rule at its boundaries, global pooling, STOCHASTIC pooling
statistics and gradient routing, SPP's single level, the engine switch for forward-mode
autodiff, and the errors for configurations Caffe refuses. The pooling forms themselves
(strided views, phase sums, reduce_window) are tested in tests/lowering/engines/test_windows.py."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.engines.policy import POOL_ENV, EnginePolicy, PolicyError
from caffe2jax.lowering.layers import pooling
from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.lowering.registry import Context
from tests import jitted
from tests.lowering.fork_nets import max_rel, net, opencv, ours
from tests.lowering.nets import net_text, run

jax.config.update("jax_default_matmul_precision", "highest")

RNG = np.random.default_rng(20240607)


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
    max_pool_ties_route_to_first_max(k, s, p)


def max_pool_ties_route_to_first_max(k, s, p, policy=None):
    """A MAX Pooling net with a mask top, under the engine ``policy``, against Caffe's loops."""
    x = RNG.integers(0, 3, (2, 2, 7, 6)).astype(np.float32)
    param = f"pooling_param {{ pool: MAX kernel_size: {k} stride: {s} pad: {p} }}"
    model = compile_net(net_text("Pooling", [x.shape], param, tops=("y", "mask")), policy=policy)
    params, state = model.init(0)

    def forward(x):
        blobs, _ = jitted.forward(model, params, state, {"x": x})
        return blobs["y"], blobs["mask"]

    (y, mask), vjp = jax.vjp(forward, jnp.asarray(x))
    top, ref_mask, backward = caffe_max_pool(x, (k, k), (s, s), (p, p), y.shape[2:])
    np.testing.assert_array_equal(y, top)
    np.testing.assert_array_equal(mask, ref_mask)
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    (dx,) = vjp((jnp.asarray(dy), jnp.ones_like(mask)))  # the mask's diff is ignored
    np.testing.assert_allclose(dx, backward(dy), rtol=1e-6, atol=1e-6)


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
        return jitted.forward(model, params, state, {"x": x})[0]["y"]

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


@pytest.mark.parametrize(
    "kind,shapes,param,match",
    [
        ("Pooling", [(1, 3, 5, 5)], "pooling_param { pool: MAX kernel_size: 2 pad: 2 }",
         "must be smaller than kernel"),
        ("Pooling", [(1, 3, 5, 5)], "pooling_param { pool: MAX kernel_h: 2 }",
         "kernel_size OR both kernel_h and kernel_w"),
        ("Pooling", [(1, 3, 5)], "pooling_param { pool: MAX kernel_size: 2 }", "4 axes"),
        ("Pooling", [(1, 3, 5, 5)], "pooling_param { pool: MAX kernel_size: 7 }",
         "empty output"),
        ("SPP", [(1, 3, 5, 5)], "spp_param { pyramid_height: 3 }", "smaller than kernel"),
    ],
)  # fmt: skip
def test_refused_configurations_name_the_layer(kind, shapes, param, match):
    with pytest.raises(NetError, match=rf"layer 'layer' \(type {kind}\).*{match}"):
        compile_net(net_text(kind, shapes, param))


def test_forward_mode_autodiff_through_pooling_with_the_xla_form(monkeypatch):
    """The fast pooling form is a custom VJP (reverse mode only); ``CAFFE2JAX_POOL=xla`` gives
    XLA's reduce_window, which jax.jvp goes through, with the same tangent as the reverse
    mode's Jacobian; a value the switch does not take is refused by name."""
    x = RNG.standard_normal((1, 2, 7, 7)).astype(np.float32)
    t = RNG.standard_normal(x.shape).astype(np.float32)
    for method in ("MAX", "AVE"):
        param = f"pooling_param {{ pool: {method} kernel_size: 3 stride: 2 pad: 1 }}"
        f = {}
        for form in ("phases", "xla"):  # the switch is read when a net is compiled
            monkeypatch.setenv(POOL_ENV, form)
            model = compile_net(net_text("Pooling", [x.shape], param))
            assert model.graph.engines["layer"] == form
            params, state = model.init(0)

            def apply(x, model=model, params=params, state=state):
                return jitted.forward(model, params, state, {"x": x})[0]["y"]

            f[form] = apply
        with pytest.raises(TypeError, match="custom_vjp"):
            jax.jvp(f["phases"], (x,), (t,))
        y, vjp = jax.vjp(f["phases"], x)
        _, tangent = jax.jvp(f["xla"], (x,), (t,))
        # <J t, u> = <t, J^T u> for a random u: forward and reverse modes agree
        u = RNG.standard_normal(y.shape).astype(np.float32)
        np.testing.assert_allclose(np.vdot(tangent, u), np.vdot(t, vjp(u)[0]), rtol=1e-5)
    monkeypatch.setenv(POOL_ENV, "fast")
    with pytest.raises(NetError, match="CAFFE2JAX_POOL='fast': use auto, phases or xla"):
        compile_net(net_text("Pooling", [x.shape], "pooling_param { pool: MAX kernel_size: 2 }"))
    with pytest.raises(PolicyError, match="CAFFE2JAX_POOL='fast': use auto, phases or xla"):
        EnginePolicy.from_env()


# -- the forks' forms: ceil_mode (upgraded to round_mode), darknet2caffe's extra row/column --

FORK_POOL = (
    'layer {{ name: "y" type: "Pooling" bottom: "x" top: "y" {tops} pooling_param {{ {p} }} }}'
)


@pytest.mark.parametrize(
    "param",
    [
        "pool: MAX kernel_size: 3 stride: 2 ceil_mode: true",
        "pool: MAX kernel_size: 3 stride: 2 ceil_mode: false",
        "pool: AVE kernel_size: 3 stride: 2 pad: 1 ceil_mode: false",
        "pool: AVE kernel_size: 2 stride: 2 ceil_mode: true",
        "pool: MAX kernel_size: 3 stride: 2 pad: 1",
    ],
)
def test_ceil_mode_and_mask_match_opencv(param):
    x = RNG.standard_normal((2, 3, 8, 7)).astype(np.float32)
    tops = 'top: "m"' if "MAX" in param else ""
    text = net(FORK_POOL.format(tops=tops, p=param), {"x": x.shape})
    mine, theirs = ours(text, {"x": x}), opencv(text, {"x": x}, ["y"])["y"]
    assert max_rel(mine["y"], theirs[0]) < 1e-4
    if tops:  # the mask top: h·W + w of the input plane, as Caffe and OpenCV write it
        np.testing.assert_array_equal(mine["m"], theirs[1])


def test_darknet2caffe_form_adds_a_row_and_a_column():
    """darknet2caffe (chosen here by the Mish layer): (kernel − stride) odd → one more output
    row and column, windows clipped (yolov3-tiny's 2×2 stride-1 max pool keeps 3×3 at 3×3)."""
    pool = FORK_POOL.format(tops="", p="pool: MAX kernel_size: 2 stride: 1")
    text = net(
        pool + '\nlayer { name: "m" type: "Mish" bottom: "y" top: "m" }', {"x": (1, 1, 3, 3)}
    )
    model = compile_net(text)
    assert model.net.layers[1].form == "darknet2caffe"
    x = np.array([[1, 5, 2], [3, 4, 8], [9, 0, 1]], np.float32)[None, None]
    np.testing.assert_array_equal(
        ours(text, {"x": x})["y"][0, 0], [[5, 8, 8], [9, 8, 8], [9, 1, 1]]
    )
    bvlc = net(pool, {"x": (1, 1, 3, 3)})
    assert ours(bvlc, {"x": x})["y"].shape == (1, 1, 2, 2)
    mish = '\nlayer { name: "m" type: "Mish" bottom: "y" top: "m" }'
    even = net(FORK_POOL.format(tops="", p="pool: MAX kernel_size: 2 stride: 2") + mish,
               {"x": (1, 1, 4, 4)})  # fmt: skip
    assert ours(even, {"x": np.ones((1, 1, 4, 4))})["y"].shape == (1, 1, 2, 2)
