"""SSD's Normalize, Permute, PriorBox and SmoothL1Loss (lowering/forks/ssd.py): OpenCV dnn parity
with the same weights, hand-worked priors where the fork and OpenCV differ, float64
finite-difference gradients, and SmoothL1Loss's value and fork backward (f'(d)/N without the
weight factor)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import net
from tests.lowering.opencv_parity import both, check_fd, input_layer, rel_to_max

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 6, 5, 4)).astype(np.float32)


def _norm(across: bool, shared: bool) -> str:
    return (
        input_layer({"x": X.shape})
        + 'layer { name: "y" type: "Normalize" bottom: "x" top: "y" norm_param { '
        f"across_spatial: {str(across).lower()} channel_shared: {str(shared).lower()} "
        'scale_filler { type: "gaussian" std: 2 } } }\n'
    )


# OpenCV 4.14 refuses across_spatial: true with channel_shared: false (its forward asserts one
# scale per channel); the formula test below covers that case.
@pytest.mark.parametrize(("across", "shared"), [(True, True), (False, True), (False, False)])
def test_normalize_matches_opencv(tmp_path, across, shared):
    ours, theirs = both(tmp_path, _norm(across, shared), {"x": X}, ["y"])
    assert rel_to_max(ours["y"], theirs["y"]) <= 1e-4


@pytest.mark.parametrize("across", [True, False])
def test_normalize_formula_eps_inside_the_root(across):
    text = input_layer({"x": X.shape}) + (
        'layer { name: "y" type: "Normalize" bottom: "x" top: "y" norm_param { '
        f"across_spatial: {str(across).lower()} channel_shared: true eps: 0.5 }} }}\n"
    )
    model = caffe2jax.compile(text)
    params, state = model.init(0)
    assert params["y"][0].shape == ()  # the fork's 0-axis blob, constant 1
    y = np.asarray(jitted.forward(model, params, state, {"x": X})[0]["y"])
    x = X.astype(np.float64)
    axes = (1, 2, 3) if across else (1,)
    want = x / np.sqrt((x * x).sum(axis=axes, keepdims=True) + 0.5)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("across", [True, False])
@pytest.mark.parametrize("shared", [True, False])
def test_normalize_gradients_finite_differences(across, shared):
    x = RNG.normal(size=(2, 3, 2, 2))
    text = _norm(across, shared).replace(
        "dim: 2 dim: 6 dim: 5 dim: 4", "dim: 2 dim: 3 dim: 2 dim: 2"
    )
    check_fd(text, {"x": x}, "y")


# OpenCV needs every axis listed; the fork appends the missing ones (checked against numpy).
@pytest.mark.parametrize("order", [(0, 2, 3, 1), (1, 0), (3, 2)])
def test_permute_matches_opencv_and_appends_missing_axes(tmp_path, order):
    orders = " ".join(f"order: {a}" for a in order)
    text = input_layer({"x": X.shape}) + (
        f'layer {{ name: "y" type: "Permute" bottom: "x" top: "y" permute_param {{ {orders} }} }}\n'
    )
    full = list(order) + [a for a in range(4) if a not in order]
    if len(order) < 4:
        y = jitted.forward(caffe2jax.compile(text), {}, {}, {"x": X})[0]["y"]
        np.testing.assert_array_equal(np.asarray(y), np.transpose(X, full))
        text = text.replace(orders, " ".join(f"order: {a}" for a in full))
    ours, theirs = both(tmp_path, text, {"x": X}, ["y"])
    np.testing.assert_array_equal(ours["y"], np.transpose(X, full))
    assert rel_to_max(ours["y"], theirs["y"]) == 0.0


def test_permute_gradient_and_refusals():
    text = input_layer({"x": (2, 3, 4)}) + (
        'layer { name: "y" type: "Permute" bottom: "x" top: "y" '
        "permute_param { order: 2 order: 0 } }\n"
    )
    check_fd(text, {"x": RNG.normal(size=(2, 3, 4))}, "y")
    for bad, why in (("order: 1 order: 1", "duplicate"), ("order: 4", "out of range")):
        with pytest.raises(NetError, match=why):
            caffe2jax.compile(text.replace("order: 2 order: 0", bad))


PRIORS = [
    "min_size: 10 max_size: 20 aspect_ratio: 2 aspect_ratio: 3 flip: true clip: false "
    "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2",
    "min_size: 7 aspect_ratio: 2 aspect_ratio: 0.5 flip: true clip: true variance: 0.1",
    "min_size: 16 max_size: 33 aspect_ratio: 2 flip: false clip: false step: 8 offset: 0.25 "
    "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2",
    "min_size: 20 min_size: 40 max_size: 40 max_size: 64 aspect_ratio: 3 flip: true clip: false "
    "variance: 0.2",
    "min_size: 12 clip: false step_h: 9 step_w: 6 variance: 0.1",
]


@pytest.mark.parametrize("config", PRIORS)
def test_priorbox_matches_opencv(tmp_path, config):
    shapes = {"data": (1, 3, 36, 30), "feat": (1, 4, 5, 4)}
    text = input_layer(shapes) + (
        'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
        f"prior_box_param {{ {config} }} }}\n"
    )
    inputs = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    ours, theirs = both(tmp_path, text, inputs, ["pb"])
    assert rel_to_max(ours["pb"], theirs["pb"]) <= 1e-6


def test_priorbox_hand_worked_truncates_sizes_and_defaults():
    """The fork truncates min/max sizes to int (OpenCV does not), variance defaults to 0.1 and
    clip to false (OpenCV's proto: true). One 1×1 feature map on a 10×20 (h×w) image."""
    shapes = {"data": (1, 3, 10, 20), "feat": (1, 1, 1, 1)}
    text = input_layer(shapes) + (
        'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
        "prior_box_param { min_size: 8.9 max_size: 18.7 aspect_ratio: 4 flip: false } }\n"
    )
    model = caffe2jax.compile(text)
    inputs = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    pb = np.asarray(jitted.forward(model, *model.init(0), inputs)[0]["pb"])
    assert pb.shape == (1, 2, 12)
    cx, cy = 10.0, 5.0  # (0 + 0.5) · step, steps 20 and 10
    side = np.sqrt(8 * 18)
    sizes = [(8, 8), (side, side), (16, 4)]  # ar 4: 8·2 wide, 8/2 high
    want = [[(cx - w / 2) / 20, (cy - h / 2) / 10, (cx + w / 2) / 20, (cy + h / 2) / 10]
            for w, h in sizes]  # fmt: skip
    np.testing.assert_allclose(pb[0, 0], np.ravel(want), rtol=1e-6)
    assert pb[0, 0].min() < 0  # not clipped
    np.testing.assert_allclose(pb[0, 1], 0.1)


@pytest.mark.parametrize(
    ("config", "img_w", "img_h"), [("img_size: 48", 48, 48), ("img_h: 40 img_w: 30", 30, 40)]
)
def test_priorbox_image_size_fields(config, img_w, img_h):
    """img_size / img_h & img_w replace the image bottom's size, for the steps too (OpenCV
    4.14 ignores them and uses the bottom's size: no parity there). 2×2 map on a 36×30 image."""
    shapes = {"data": (1, 3, 36, 30), "feat": (1, 1, 2, 2)}
    text = input_layer(shapes) + (
        'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
        f"prior_box_param {{ min_size: 6 {config} }} }}\n"
    )
    model = caffe2jax.compile(text)
    inputs = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    pb = np.asarray(jitted.forward(model, {}, {}, inputs)[0]["pb"])[0, 0].reshape(2, 2, 4)
    sw, sh = img_w / 2, img_h / 2
    for h in range(2):
        for w in range(2):
            cx, cy = (w + 0.5) * sw, (h + 0.5) * sh
            want = [(cx - 3) / img_w, (cy - 3) / img_h, (cx + 3) / img_w, (cy + 3) / img_h]
            np.testing.assert_allclose(pb[h, w], want, rtol=1e-6)


def test_priorbox_refuses_bad_sizes():
    shapes = {"data": (1, 3, 10, 10), "feat": (1, 1, 2, 2)}
    base = input_layer(shapes) + (
        'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
        "prior_box_param { PARAMS } }\n"
    )
    for params, why in (
        ("max_size: 4", "must provide min_size"),
        ("min_size: 4 max_size: 3", "greater than min_size"),
        ("min_size: 4 variance: 0.1 variance: 0.2", "1 or 4 variances"),
    ):
        with pytest.raises(NetError, match=why):
            caffe2jax.compile(base.replace("PARAMS", params))


L1_RNG = np.random.default_rng(3)


PRED = (L1_RNG.standard_normal((3, 8)) * 1.5).astype(np.float32)


TARGET = L1_RNG.standard_normal((3, 8)).astype(np.float32)


WEIGHTS = L1_RNG.uniform(0, 2, (3, 8)).astype(np.float32)


def _l1_run(names):
    bottoms = " ".join(f'bottom: "{n}"' for n in names)
    # an SSD-only layer beside it: with two bottoms the net's dialect decides the form
    text = net(f'layer {{ name: "l1" type: "SmoothL1Loss" {bottoms} top: "loss" }}\n'
               'layer { name: "n" type: "Normalize" bottom: "x" top: "xn" }',
               {**{n: PRED.shape for n in names}, "x": (1, 2, 2, 2)})  # fmt: skip
    model = compile_net(text, phase="TRAIN")
    assert [la.form for la in model.net.layers if la.name == "l1"] == ["ssd"]
    params, state = model.init(0)
    feed = {"pred": PRED, "target": TARGET, "w": WEIGHTS}
    feed = {n: jnp.asarray(feed[n]) for n in names}
    ones = jnp.ones((1, 2, 2, 2))

    def f(x):
        return model.apply(params, state, {**x, "x": ones}, jax.random.key(0))[0]["loss"]

    value, vjp = jax.vjp(f, feed)
    return float(value), {k: np.asarray(v) for k, v in vjp(jnp.float32(2.0))[0].items()}


def _l1_fork(weighted: bool):
    d = (PRED.astype(np.float64) - TARGET) * (WEIGHTS if weighted else 1.0)
    f = np.where(np.abs(d) < 1, 0.5 * d * d, np.abs(d) - 0.5)
    df = np.where(np.abs(d) < 1, d, np.sign(d))
    return f.sum() / 3, 2.0 * df / 3  # top diff 2, N = 3, no weight factor


@pytest.mark.parametrize("weighted", [False, True])
def test_ssd_smooth_l1_value_and_fork_backward(weighted):
    names = ["pred", "target", "w"] if weighted else ["pred", "target"]
    value, grads = _l1_run(names)
    loss, diff = _l1_fork(weighted)
    np.testing.assert_allclose(value, loss, rtol=1e-6)
    np.testing.assert_allclose(grads["pred"], diff, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads["target"], -diff, rtol=1e-5, atol=1e-7)
    if weighted:
        assert not np.any(grads["w"])


def fork_prior_box(fh, fw, ih, iw, min_sizes, max_sizes, ratios, flip, offset=0.5):
    """PriorBoxLayer::LayerSetUp and Forward_cpu (weiliu89/caffe@4817bf8) transcribed with
    the fork's types: float ratios (1./ar stored as float), float box sides from double
    sqrt, float centres, double coordinates stored as float."""
    f = np.float32
    ars = [f(1.0)]
    for r in map(f, ratios):
        if all(abs(float(r) - float(a)) >= 1e-6 for a in ars):
            ars += [r] + ([f(1.0 / float(r))] if flip else [])
    step_w, step_h = f(iw) / f(fw), f(ih) / f(fh)
    out = []
    for h in range(fh):
        for w in range(fw):
            cx, cy = f(f(w) + f(offset)) * step_w, f(f(h) + f(offset)) * step_h
            for s, ms in enumerate(int(m) for m in min_sizes):
                sides = [(f(ms), f(ms))]
                if max_sizes:
                    side = f(np.sqrt(float(ms * int(max_sizes[s]))))
                    sides.append((side, side))
                sides += [(f(ms * np.sqrt(float(a))), f(ms / np.sqrt(float(a))))
                          for a in ars if abs(float(a) - 1.0) >= 1e-6]  # fmt: skip
                for bw, bh in sides:
                    for c, half, size in ((cx, bw, iw), (cy, bh, ih), (cx, -bw, iw), (cy, -bh, ih)):
                        out.append(f((float(c) - float(half) / 2.0) / size))
    return np.asarray(out, np.float32)


def test_priorbox_equals_the_forks_float_types_bit_for_bit():
    """SSD300's conv4_3 head (38×38 on 300×300, min 30, max 60, ratio 2) and a 10×10 head
    with ratios 2 and 3: every coordinate bit for bit; the sides kept in double (as before)
    missed the fork's float rounding in a third of them."""
    for (fh, fw), mins, maxs, ratios in [((38, 38), [30], [60], [2]),
                                         ((10, 10), [111], [162], [2, 3])]:  # fmt: skip
        shapes = {"data": (1, 3, 300, 300), "feat": (1, 1, fh, fw)}
        fields = " ".join(
            [f"min_size: {m}" for m in mins] + [f"max_size: {m}" for m in maxs]
            + [f"aspect_ratio: {r}" for r in ratios] + ["flip: true"]
        )  # fmt: skip
        text = input_layer(shapes) + (
            'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
            f"prior_box_param {{ {fields} }} }}\n"
        )
        model = caffe2jax.compile(text)
        inputs = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
        pb = np.asarray(jitted.forward(model, {}, {}, inputs)[0]["pb"])[0, 0]
        want = fork_prior_box(fh, fw, 300, 300, mins, maxs, ratios, flip=True)
        np.testing.assert_array_equal(pb.view(np.uint32), want.view(np.uint32))
