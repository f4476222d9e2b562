"""lowering/forks/face.py and face_layers.py: the face recognition forks' layers against NumPy
transcriptions of the forks' C++ loops (margin_inner_product_layer.cpp of wy1iu/sphereface
@f20b130, largemargin_inner_product_layer.cpp of wy1iu/LargeMargin_Softmax_Loss@c3e9f20,
center_loss_layer.cpp of ydwen/caffe-face@48ff38e and happynear/caffe-windows@504d8a8,
label_specific_add.cpp and normalize_layer.cpp of the latter), run jitted and inside
value_and_grad of the net's loss; float64 finite differences where the fork's backward is the
true gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import fd_check, net, ours

RNG = np.random.default_rng(35)
TYPES = ("SINGLE", "DOUBLE", "TRIPLE", "QUADRUPLE")


# -- the forks' loops ---------------------------------------------------------------------------


def _psi(c, m):
    s0 = np.sign(c)
    if m == 1:
        return c
    if m == 2:
        return 2 * s0 * c**2 - 1
    if m == 3:
        s1 = np.sign(abs(c) - 0.5)
        return s1 * (4 * c**3 - 3 * c) + s0 * (1 + s1) - 2
    s3 = s0 * np.sign(2 * c**2 - 1)
    return s3 * (8 * c**4 - 8 * c**2 + 1) + 2 * s0 + s3 - 3


def _coeffs(c, m, ratio):
    """Backward_cpu's coeff_w and coeff_x (before A-Softmax's normalisation); ``ratio`` is
    1/‖x‖ (A-Softmax) or ‖w‖/‖x‖ (L-Softmax's 1/xw_norm_ratio)."""
    s0 = np.sign(c)
    if m == 2:
        return 4 * s0 * c, -ratio * (2 * s0 * c**2 + 1)
    if m == 3:
        s1 = np.sign(abs(c) - 0.5)
        s2 = s0 * (1 + s1) - 2
        return s1 * (12 * c**2 - 3), -ratio * (8 * s1 * c**3 - s2)
    s3 = s0 * np.sign(2 * c**2 - 1)
    s4 = 2 * s0 + s3 - 3
    return s3 * (32 * c**3 - 16 * c), -ratio * (s3 * (24 * c**4 - 8 * c**2 - 1) - s4)


def sphere_loop(x, w, label, m, lam, top_diff):
    """MarginInnerProductLayer's Forward_cpu and Backward_cpu, loop by loop (float64)."""
    w = w / np.sqrt((w * w).sum(1, keepdims=True))  # the forward's in-place normalisation
    top = x @ w.T
    dx, dw = np.zeros_like(x), top_diff.T @ x
    for i, y in enumerate(label.astype(int)):
        norm = np.sqrt(x[i] @ x[i])
        c = top[i, y] / norm
        if m > 1:
            top[i, y] = norm * _psi(c, m)
        for j in range(w.shape[0]):
            if m == 1:
                dx[i] += top_diff[i, j] * w[j]
            elif j != y:
                dx[i] += top_diff[i, j] / (1 + lam) * w[j]
            else:
                a, b = _coeffs(c, m, 1 / norm)
                a, b = a / np.hypot(a, b), b / np.hypot(a, b)
                dx[i] += top_diff[i, j] / (1 + lam) * (a * w[j] + b * x[i])
    if m > 1:
        top = (top + lam * (x @ w.T)) / (1 + lam)
        dx += lam / (1 + lam) * top_diff @ w
    return top, dx, dw


def large_margin_loop(x, w, label, m, lam):
    """LargeMarginInnerProductLayer's Forward_cpu (float64)."""
    top = x @ w.T
    for i, y in enumerate(label.astype(int)):
        xw = np.sqrt(x[i] @ x[i]) * np.sqrt(w[y] @ w[y]) + 1e-9
        if m > 1:
            top[i, y] = xw * _psi(top[i, y] / xw, m)
    return top if m == 1 else (top + lam * (x @ w.T)) / (1 + lam)


def _margin_net(kind: str, param: str, m: str, extra: str = "", shape=(6, 5), n=4) -> str:
    layer = (f'layer {{ name: "fc6" type: "{kind}" bottom: "x" bottom: "label" top: "fc6" '
             f'top: "lambda" {param} {{ num_output: {n} type: {m} '
             f'weight_filler {{ type: "gaussian" std: 1 }} {extra} }} }}')  # fmt: skip
    return net(layer, {"x": shape, "label": (shape[0],)})


SCHEDULE = "base: 10 gamma: 0.5 power: 2 iteration: 3 lambda_min: 0.01"


def _lam(it):
    return max(10 * (1 + 0.5 * it) ** -2, 0.01)


# -- MarginInnerProduct (A-Softmax) -------------------------------------------------------------


@pytest.mark.parametrize("m", range(1, 5))
def test_margin_inner_product_forward_and_backward_are_the_forks(m):
    """Scores, λ and the fork's diffs (not the true gradient) inside value_and_grad of
    Σ c·fc6, jitted, against the transcribed loops; the stored weight rows are not unit."""
    text = _margin_net("MarginInnerProduct", "margin_inner_product_param", TYPES[m - 1], SCHEDULE)
    x, label = RNG.standard_normal((6, 5)), np.array([0, 1, 2, 3, 1, 0], float)
    w = RNG.standard_normal((4, 5)) * 3
    c = RNG.standard_normal((6, 4))
    model = compile_net(text, phase="TRAIN")
    params, state = model.init(0)
    params["fc6"] = [jnp.asarray(w, jnp.float32)]
    feed = {"x": jnp.asarray(x, jnp.float32), "label": jnp.asarray(label, jnp.float32)}

    def loss(p, xx):
        blobs, _ = model.apply(p, state, {**feed, "x": xx}, jax.random.key(0))
        return jnp.sum(blobs["fc6"] * c), (blobs["fc6"], blobs["lambda"])

    (_, (top, lam)), (gp, gx) = jitted.value_and_grad(loss, (0, 1), has_aux=True)(params, feed["x"])
    want, dx, dw = sphere_loop(x, w, label, m, _lam(4), c)
    np.testing.assert_allclose(float(lam[0]), _lam(4), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(top), want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(gx), dx, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(gp["fc6"][0]), dw, rtol=2e-5, atol=2e-5)


def test_margin_lambda_advances_with_every_forward_down_to_lambda_min():
    """The fork's iter_ += 1 per forward: λ of forwards 1, 2, 3 … carried in state.carry;
    lambda_min floors it."""
    text = _margin_net("MarginInnerProduct", "margin_inner_product_param", "DOUBLE",
                       "base: 10 gamma: 0.5 power: 2 iteration: 3 lambda_min: 0.9")  # fmt: skip
    model = compile_net(text, phase="TRAIN")
    params, state = model.init(0)
    feed = {"x": jnp.ones((6, 5)), "label": jnp.zeros((6,))}
    seen = []
    for _ in range(4):
        blobs, state = jitted.forward(model, params, state, feed, jax.random.key(0))
        seen.append(float(blobs["lambda"][0]))
    want = [max(10 * (1 + 0.5 * it) ** -2, 0.9) for it in (4, 5, 6, 7)]
    np.testing.assert_allclose(seen, want, rtol=1e-6)
    assert seen[-1] == pytest.approx(0.9)


# -- LargeMarginInnerProduct (L-Softmax) --------------------------------------------------------


@pytest.mark.parametrize("m", range(1, 5))
def test_large_margin_forward_is_the_forks(m):
    text = _margin_net("LargeMarginInnerProduct", "largemargin_inner_product_param",
                       TYPES[m - 1], SCHEDULE)  # fmt: skip
    x, label = RNG.standard_normal((6, 5)), np.array([3, 1, 2, 0, 1, 0], float)
    w = RNG.standard_normal((4, 5))
    got = ours(text, {"x": x, "label": label}, {"fc6": [w]}, phase="TRAIN")
    want = large_margin_loop(x, w, label, m, _lam(4))
    np.testing.assert_allclose(got["fc6"], want, rtol=2e-5, atol=2e-5)
    assert got["lambda"][0] == pytest.approx(_lam(4), rel=1e-6)


@pytest.mark.parametrize("m", (2, 3, 4))
def test_large_margin_gradient_is_the_true_one(m):
    """L-Softmax's Backward_cpu is the gradient of its forward: float64 central differences."""
    text = _margin_net("LargeMarginInnerProduct", "largemargin_inner_product_param",
                       TYPES[m - 1], SCHEDULE)  # fmt: skip
    fd_check(text, {"x": RNG.standard_normal((6, 5))}, "fc6",
             fixed={"label": np.array([3, 1, 2, 0, 1, 0.0])}, phase="TRAIN")  # fmt: skip


# -- CenterLoss ------------------------------------------------------------------------------


def _center_text(extra: str = "", loss_weight: str = "loss_weight: 0.5") -> str:
    layer = ('layer { name: "center" type: "CenterLoss" bottom: "x" bottom: "label" '
             f'top: "loss" center_loss_param {{ num_output: 4 {extra} '
             f'center_filler {{ type: "gaussian" std: 1 }} }} {loss_weight} }}')  # fmt: skip
    return net(layer, {"x": (6, 3), "label": (6,)})


def center_loop(x, centers, label, per_sample=False, l1=False):
    """CenterLossLayer's forward and backward (top diff 1): loss, bottom diff, center diff."""
    d = x - centers[label.astype(int)]
    m = x.shape[0]
    loss = np.abs(d).sum() / m if l1 else (d * d).sum() / m / 2
    e = np.sign(d) if l1 else d
    diff = np.zeros_like(centers)
    for n in range(centers.shape[0]):
        rows = [i for i in range(m) if int(label[i]) == n]
        total = -sum((e[i] for i in rows), np.zeros(x.shape[1]))
        times = len(rows) if per_sample else 1  # happynear adds it once per sample
        diff[n] = times * total / (len(rows) + 1)
    return loss, e / m, diff


@pytest.mark.parametrize(
    "extra, per_sample, l1",
    [("", False, False), ('distance_type: "L2"', True, False), ('distance_type: "L1"', True, True)],
)
def test_center_loss_diffs_are_the_forks_rule(extra, per_sample, l1):
    """Bottom diff loss_weight·d/M; the centers' diff the fork's update rule, not scaled by
    the loss weight (0.5 here); class 3 has no sample and gets 0."""
    model = compile_net(_center_text(extra), phase="TRAIN")
    params, state = model.init(0)
    x, label = RNG.standard_normal((6, 3)), np.array([0, 1, 1, 2, 2, 2], float)
    feed = {"x": jnp.asarray(x, jnp.float32), "label": jnp.asarray(label, jnp.float32)}

    def objective(p, xx):
        blobs, _ = model.apply(p, state, {**feed, "x": xx}, jax.random.key(0))
        return model.graph.objective(blobs)

    value, (gp, gx) = jitted.value_and_grad(objective, (0, 1))(params, feed["x"])
    loss, dx, dc = center_loop(x, np.asarray(params["center"][0], float), label, per_sample, l1)
    assert float(value) == pytest.approx(0.5 * loss, rel=1e-5)
    np.testing.assert_allclose(np.asarray(gx), 0.5 * dx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gp["center"][0]), dc, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(gp["center"][0])[3] == 0)


def test_center_loss_without_loss_weight_weighs_nothing():
    """The fork's LayerSetUp skips LossLayer's, which would add loss_weight 1."""
    model = compile_net(_center_text(loss_weight=""), phase="TRAIN")
    layer = next(lyr for lyr in model.net.layers if lyr.name == "center")
    assert layer.loss_weights == (0.0,) and layer.form == ""


# -- LabelSpecificAdd ------------------------------------------------------------------------


def _lsa_text(param: str) -> str:
    layer = ('layer { name: "m" type: "LabelSpecificAdd" bottom: "x" bottom: "label" top: "y" '
             f'top: "b" label_specific_add_param {{ {param} }} }}')  # fmt: skip
    return net(layer, {"x": (3, 4), "label": (3,)})


def test_label_specific_add_in_train_only_where_above_minus_bias():
    x = np.array([[0.5, 0.1, 0.2, 0.3], [0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]])
    label = np.array([0, 2, 1.0])
    got = ours(_lsa_text("bias: -0.35"), {"x": x, "label": label}, phase="TRAIN")
    want = x.copy()
    want[0, 0] -= 0.35  # 0.5 > 0.35
    # row 1: 0.3 is not > 0.35, row 2: 0.2 neither: left as they are
    np.testing.assert_allclose(got["y"], want, rtol=1e-6)
    assert got["b"][0] == pytest.approx(-0.35)
    test = ours(_lsa_text("bias: -0.35 transform_test: true"), {"x": x, "label": label})
    np.testing.assert_array_equal(test["y"], x.astype(np.float32))  # never in TEST


def test_label_specific_add_anneals_with_its_own_iteration():
    param = "bias_base: -0.1 bias_gamma: 1 bias_power: 1 bias_min: -2 bias_max: 0 iteration: 1"
    model = compile_net(_lsa_text(param), phase="TRAIN")
    params, state = model.init(0)
    feed = {"x": jnp.full((3, 4), 9.0), "label": jnp.zeros((3,))}
    seen = []
    for _ in range(3):
        blobs, state = jitted.forward(model, params, state, feed, jax.random.key(0))
        seen.append(float(blobs["b"][0]))
    # bias = base + (1 + γ·it) − 1 with it = 1, 2, 3, clipped to [−2, 0]
    np.testing.assert_allclose(seen, [0.0, 0.0, 0.0])
    model = compile_net(_lsa_text(param.replace("bias_gamma: 1", "bias_gamma: -0.5")), "TRAIN")
    params, state = model.init(0)
    for want in (-0.6, -1.1, -1.6, -2.0):
        blobs, state = jitted.forward(model, params, state, feed, jax.random.key(0))
        assert float(blobs["b"][0]) == pytest.approx(want, rel=1e-6)


def test_label_specific_add_gradient_is_the_identity():
    fd_check(_lsa_text("bias: -0.35"), {"x": RNG.standard_normal((3, 4))}, "y",
             fixed={"label": np.array([0, 2, 1.0])}, phase="TRAIN")  # fmt: skip


# -- Normalize (happynear), InnerProduct normalize, Flip --------------------------------------


def _norm_text(param: str, shape=(2, 3, 2, 2)) -> str:
    layer = ('layer { name: "n" type: "Normalize" bottom: "x" top: "y" top: "norm" '
             f"normalize_param {{ {param} }} }}")  # fmt: skip
    return net(layer, {"x": shape})


@pytest.mark.parametrize("kind", ("L2", "L1"))
def test_happynear_normalize_forward_and_gradient(kind):
    x = RNG.standard_normal((2, 3, 2, 2))
    got = ours(_norm_text(f'normalize_type: "{kind}"'), {"x": x})
    norm = np.sqrt((x * x).sum(1, keepdims=True) + 1e-6) if kind == "L2" else (
        np.abs(x).sum(1, keepdims=True) + 1e-6)  # fmt: skip
    np.testing.assert_allclose(got["y"], x / norm, rtol=1e-5)
    np.testing.assert_allclose(got["norm"], norm, rtol=1e-5)
    fd_check(_norm_text(f'normalize_type: "{kind}" bp_norm: true'), {"x": x}, "y")
    fd_check(_norm_text(f'normalize_type: "{kind}" bp_norm: true'), {"x": x}, "norm")


def test_bare_normalize_of_an_am_softmax_net_is_happynears_and_2d_gives_4d():
    text = net('layer { name: "n" type: "Normalize" bottom: "x" top: "y" }\n'
               'layer { name: "m" type: "LabelSpecificAdd" bottom: "y" bottom: "label" '
               'top: "z" label_specific_add_param { bias: -0.3 } }',
               {"x": (2, 3), "label": (2,)})  # fmt: skip
    model = compile_net(text)
    assert model.net.dialect == "happynear"
    assert next(lyr for lyr in model.net.layers if lyr.name == "n").form == "happynear"
    got = ours(text, {"x": np.array([[3.0, 0, 4], [0, 1, 0]]), "label": np.zeros(2)})
    assert got["y"].shape == (2, 3, 1, 1)
    np.testing.assert_allclose(got["y"][:, :, 0, 0], [[0.6, 0, 0.8], [0, 1, 0]], atol=1e-6)


def test_inner_product_normalize_uses_unit_rows_and_the_forks_weight_diff():
    text = net('layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param '
               '{ num_output: 3 normalize: true bias_term: false weight_filler { type: "gaussian" '
               "std: 2 } } }", {"x": (4, 5)})  # fmt: skip
    model = compile_net(text, phase="TRAIN")
    params, state = model.init(0)
    assert next(lyr for lyr in model.net.layers if lyr.name == "ip").form == "happynear"
    x, c = RNG.standard_normal((4, 5)), RNG.standard_normal((4, 3))
    w = np.asarray(params["ip"][0], float)
    unit = w / np.sqrt((w * w).sum(1, keepdims=True) + 1e-6)

    def loss(p, xx):
        y = model.apply(p, state, {"x": xx}, jax.random.key(0))[0]["y"]
        return jnp.sum(y * c), y

    (_, y), (gp, gx) = jitted.value_and_grad(loss, (0, 1), has_aux=True)(
        params, jnp.asarray(x, jnp.float32)
    )
    np.testing.assert_allclose(np.asarray(y), x @ unit.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gx), c @ unit, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gp["ip"][0]), c.T @ x, rtol=1e-5, atol=1e-6)


def test_flip_reverses_width_and_height():
    x = RNG.standard_normal((1, 2, 3, 4))
    text = net('layer { name: "f" type: "Flip" bottom: "x" top: "y" '
               "flip_param { flip_height: true } }", {"x": x.shape})  # fmt: skip
    want = x.astype(np.float32)[:, :, ::-1, ::-1]
    np.testing.assert_array_equal(ours(text, {"x": x})["y"], want)
    fd_check(text, {"x": x}, "y")
