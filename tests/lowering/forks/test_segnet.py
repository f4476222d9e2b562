"""lowering/forks/segnet.py: BN in SegNet's form (and, beside it, PSPNet's: the finite-difference
and channels-last checks of both BN forms), max-unpooling Upsample, SoftmaxWithLoss with class
weighting and Dropout sampling at TEST, against the fork's formulas worked in NumPy (OpenCV has
no BN layer), hand-worked cases, and float64 finite differences."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests.lowering.fork_nets import channels_last_agrees, fd_check, net, ours

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32) * 2 + 1
SCALE = RNG.standard_normal((1, 3, 1, 1)).astype(np.float32)
SHIFT = RNG.standard_normal((1, 3, 1, 1)).astype(np.float32)
SEGNET = 'layer {{ name: "bn" type: "BN" bottom: "x" {tops} bn_param {{ {param} }} }}'
PSPNET = 'layer { name: "bn" type: "BN" bottom: "x" top: "y" bn_param { %s } }'


def _run(text: str, weights: list, phase: str = "TEST", x=X):
    model = compile_net(text, phase=phase)
    params, state = model.init(0)
    decls = model.graph.decls["bn"]
    blobs = [np.asarray(w, np.float32) for w in weights]
    params["bn"] = [None if d.state else b for b, d in zip(blobs, decls)]
    state["bn"] = [b if d.state else None for b, d in zip(blobs, decls)]
    out, new_state = model.apply(params, state, {"x": x}, jax.random.key(0))
    return {k: np.asarray(v) for k, v in out.items()}, new_state


def _segnet_text(param: str, tops=("y",)) -> str:
    top_lines = " ".join(f'top: "{t}"' for t in tops)
    return net(SEGNET.format(tops=top_lines, param=param), {"x": X.shape})


def test_segnet_learn_uses_batch_statistics_in_test_too():
    """LEARN: E[x], E[x²] − E[x]² over (N, H, W), eps 1e-9, even in phase TEST; tops 1 and 2
    are the mean and the variance before eps."""
    x = X.astype(np.float64)
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    var = (x * x).mean(axis=(0, 2, 3), keepdims=True) - mean**2
    expected = SCALE * (x - mean) / np.sqrt(var + 1e-9) + SHIFT
    text = _segnet_text("bn_mode: LEARN", ("y", "mean", "var"))
    for phase in ("TEST", "TRAIN"):
        out, _ = _run(text, [SCALE, SHIFT], phase)
        np.testing.assert_allclose(out["y"], expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(out["mean"], mean, rtol=1e-5)
        np.testing.assert_allclose(out["var"], var, rtol=1e-4)


def test_segnet_inference_is_scale_and_shift():
    out, _ = _run(_segnet_text("bn_mode: INFERENCE"), [SCALE, SHIFT], "TRAIN")
    # rtol 1e-5 (DESIGN's layer bound), not 1e-6: the jitted forward fuses x·scale + shift into
    # one multiply-add, 5e-6 apart from NumPy's two roundings where the sum nearly cancels
    np.testing.assert_allclose(out["y"], SCALE * X + SHIFT, rtol=1e-5)
    with pytest.raises(NetError, match="INFERENCE has one top"):
        compile_net(_segnet_text("bn_mode: INFERENCE", ("y", "m")))


def test_segnet_blobs_and_fillers():
    model = compile_net(_segnet_text('bn_mode: LEARN scale_filler { type: "constant" value: 1 }'))
    decls = model.graph.decls["bn"]
    assert [d.shape for d in decls] == [(1, 3, 1, 1)] * 2 and not any(d.state for d in decls)
    params, _ = model.init(0)
    np.testing.assert_array_equal(params["bn"][0], np.ones((1, 3, 1, 1)))
    np.testing.assert_array_equal(params["bn"][1], np.zeros((1, 3, 1, 1)))


@pytest.mark.parametrize(
    "text, blobs, phase",
    [
        (_segnet_text("bn_mode: LEARN"), [SCALE, SHIFT], "TEST"),
        (_segnet_text("bn_mode: INFERENCE"), [SCALE, SHIFT], "TRAIN"),
        (net(PSPNET % "eps: 1e-3", {"x": X.shape}), [SCALE, SHIFT, None, None], "TRAIN"),
        (net(PSPNET % "frozen: true", {"x": X.shape}), [SCALE, SHIFT, None, None], "TRAIN"),
        (net(PSPNET % "eps: 1e-3", {"x": X.shape}), [SCALE, SHIFT, None, None], "TEST"),
    ],
)
def test_bn_finite_differences(text, blobs, phase):
    """(PSPNet's running statistics, state, stay as initialised: zeros.)"""
    weights = {"bn": [None if b is None else np.asarray(b, np.float64) for b in blobs]}
    fd_check(text, {"x": X.astype(np.float64)}, "y", weights=weights, phase=phase)


@pytest.mark.parametrize("param", ["bn_mode: LEARN", "bn_mode: INFERENCE", "frozen: true"])
def test_bn_channels_last(param):
    layer = f'layer {{ name: "y" type: "BN" bottom: "c" top: "y" bn_param {{ {param} }} }}'
    channels_last_agrees(layer, (2, 3, 4, 5))


NEURON_RNG = np.random.default_rng(0)


NEURON_X = (NEURON_RNG.standard_normal((2, 3, 4, 5)) * 6).astype(np.float32)


def _neuron(type_and_param: str, shape=NEURON_X.shape) -> str:
    return net(f'layer {{ name: "y" type: {type_and_param} bottom: "x" top: "y" }}', {"x": shape})


DROPOUT = '"Dropout" dropout_param { dropout_ratio: 0.25 %s }'


def test_dropout_sample_weights_test():
    """SegNet / ENet: sample_weights_test drops (and scales) in TEST too."""
    y = ours(_neuron(DROPOUT % "sample_weights_test: true"), {"x": NEURON_X})["y"]
    assert np.all((y == 0) | np.isclose(y, NEURON_X / 0.75)) and np.any(y == 0)
    y = ours(_neuron(DROPOUT % "sample_weights_test: false"), {"x": NEURON_X})["y"]
    np.testing.assert_array_equal(y, NEURON_X)


LOSS_RNG = np.random.default_rng(0)


LOSS_X = LOSS_RNG.standard_normal((2, 3, 2, 3)).astype(np.float32)


LABEL = np.array([[[0, 1, 2], [2, 255, 1]], [[1, 1, 0], [255, 2, 2]]], np.float32)[:, None]


LOSS_W = [0.5, 2.0, 4.0]


def _loss_text(loss_param: str) -> str:
    layer = ('layer { name: "loss" type: "SoftmaxWithLoss" bottom: "x" bottom: "label" '
             f'top: "loss" loss_param {{ {loss_param} }} }}')  # fmt: skip
    return net(layer, {"x": LOSS_X.shape, "label": LABEL.shape})


def _loss_expected(weighted: bool, normalize: bool) -> float:
    x = LOSS_X.astype(np.float64)
    logp = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    total, counted = 0.0, 0
    for n in range(2):
        for h in range(2):
            for w in range(3):
                lab = int(LABEL[n, 0, h, w])
                if lab == 255:
                    continue
                total -= logp[n, lab, h, w] * (LOSS_W[lab] if weighted else 1.0)
                counted += 1
    return total / (counted if normalize else 2)


WEIGHTS = "class_weighting: 0.5 class_weighting: 2 class_weighting: 4"


@pytest.mark.parametrize(
    "param, weighted, normalize",
    [
        (f"weight_by_label_freqs: true ignore_label: 255 {WEIGHTS}", True, True),
        (f"weight_by_label_freqs: true ignore_label: 255 normalize: false {WEIGHTS}", True, False),
        ("weight_by_label_freqs: false ignore_label: 255", False, True),
    ],
)
def test_segnet_softmax_loss_by_formula(param, weighted, normalize):
    text = _loss_text(param)
    assert compile_net(text).net.layers[-1].form == "segnet"
    loss = ours(text, {"x": LOSS_X, "label": LABEL})["loss"]
    np.testing.assert_allclose(loss, _loss_expected(weighted, normalize), rtol=1e-5)


def test_segnet_divisor_is_the_counted_pixels_not_the_weight_sum():
    """Hand-worked, as caffe-segnet's softmax_loss_layer.cpp and .cu divide: two classes, equal
    scores (p = 1/2 everywhere), labels [0, 1, ignored], weights [1, 3]: the loss is
    (1·ln 2 + 3·ln 2) / 2 counted pixels = 2 ln 2 (a weight-sum divisor would give ln 2); the
    gradient at each counted pixel is weight·(p − onehot) / 2, zero at the ignored one."""
    text = ('layer { name: "loss" type: "SoftmaxWithLoss" bottom: "x" bottom: "label" '
            'top: "loss" loss_param { weight_by_label_freqs: true ignore_label: 7 '
            "class_weighting: 1 class_weighting: 3 } }")  # fmt: skip
    x, label = np.zeros((1, 2, 1, 3), np.float32), np.array([[[[0, 1, 7]]]], np.float32)
    text = net(text, {"x": x.shape, "label": label.shape})
    np.testing.assert_allclose(ours(text, {"x": x, "label": label})["loss"], 2 * np.log(2),
                               rtol=1e-6)  # fmt: skip
    model = compile_net(text)
    params, state = model.init(0)

    def loss(v):
        return model.apply(params, state, {"x": v, "label": jnp.asarray(label)})[0]["loss"]

    expected = [[[[-0.25, 0.75, 0]], [[0.25, -0.75, 0]]]]
    np.testing.assert_allclose(jax.grad(loss)(jnp.asarray(x)), expected, rtol=1e-6)


def test_segnet_softmax_loss_gradient():
    fd_check(_loss_text(f"weight_by_label_freqs: true ignore_label: 255 {WEIGHTS}"),
             {"x": LOSS_X.astype(np.float64)}, "loss", fixed={"label": LABEL})  # fmt: skip


def test_segnet_softmax_loss_refusals():
    with pytest.raises(NetError, match=r"\(type SoftmaxWithLoss\).*3 classes, 2 weights"):
        compile_net(_loss_text("weight_by_label_freqs: true class_weighting: 1 class_weighting: 2"))
    with pytest.raises(NetError, match="not `normalization`"):
        compile_net(_loss_text(f"weight_by_label_freqs: true normalization: FULL {WEIGHTS}"))


X4 = np.array([[1, 5, 2, 0], [3, 4, 8, 7], [9, 0, 1, 2], [6, 2, 3, 4]], np.float32)


UNPOOL = """
layer { name: "pool" type: "Pooling" bottom: "x" top: "pool" top: "mask"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "up" type: "Upsample" bottom: "pool" bottom: "mask" top: "up"
        upsample_param { %s } }
"""


def _one(type_and_param: str, shape, name: str = "y") -> str:
    return net(f'layer {{ name: "{name}" type: {type_and_param} bottom: "x" top: "{name}" }}',
               {"x": shape})  # fmt: skip


def test_max_unpool_4x4_by_hand():
    """Pool 2×2/2 with the mask top, then unpool: each maximum back at its place, zeros
    elsewhere; the mask holds h·W + w of the pooling input (Caffe's convention)."""
    blobs = ours(net(UNPOOL % "scale: 2", {"x": (1, 1, 4, 4)}), {"x": X4[None, None]})
    np.testing.assert_array_equal(blobs["pool"][0, 0], [[5, 8], [9, 4]])
    np.testing.assert_array_equal(blobs["mask"][0, 0], [[1, 6], [8, 15]])
    expected = [[0, 5, 0, 0], [0, 0, 8, 0], [9, 0, 0, 0], [0, 0, 0, 4]]
    np.testing.assert_array_equal(blobs["up"][0, 0], expected)


def test_max_unpool_gradient_gathers_at_the_mask():
    model = compile_net(net(UNPOOL % "scale: 2", {"x": (1, 1, 4, 4)}))
    p, s = model.init(0)
    g = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4) + 1

    def f(x):
        return jnp.sum(model.apply(p, s, {"x": x})[0]["up"] * g)

    dx = np.asarray(jax.grad(f)(jnp.asarray(X4[None, None])))[0, 0]
    expected = np.zeros((4, 4), np.float32)
    for flat in (1, 6, 8, 15):  # the diff of each maximum: g at its own place
        expected.flat[flat] = g.flat[flat]
    np.testing.assert_array_equal(dx, expected)


def test_max_unpool_sizes_upsample_hw_and_pad_out():
    text = net(UNPOOL % "upsample_h: 5 upsample_w: 5", {"x": (1, 1, 5, 5)})
    x = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5)
    up = ours(text, {"x": x})["up"]
    assert up.shape == (1, 1, 5, 5)
    maxima = [6, 8, 9, 16, 18, 19, 21, 23, 24]  # 3×3 windows (ceil), the last ones clipped
    np.testing.assert_array_equal(up[0, 0], np.where(np.isin(x[0, 0], maxima), x[0, 0], 0))
    text = net(UNPOOL % "scale: 2 pad_out_h: true", {"x": (1, 1, 5, 5)})
    assert ours(text, {"x": x})["up"].shape == (1, 1, 5, 6)  # 3·2 − 1, 3·2


def test_max_unpool_shared_index_last_wins_and_backward_gathers_to_each():
    """Two values with one mask index: the later one reaches the top (Caffe's loop order);
    SegNet's backward gives the diff at that index to both (not the true gradient)."""
    text = net('layer { name: "up" type: "Upsample" bottom: "x" bottom: "m" top: "up" '
               "upsample_param { scale: 2 } }", {"x": (1, 1, 1, 2), "m": (1, 1, 1, 2)})  # fmt: skip
    model = compile_net(text)
    p, s = model.init(0)
    m = jnp.asarray([[[[3.0, 3.0]]]])

    def f(x):
        return jnp.sum(model.apply(p, s, {"x": x, "m": m})[0]["up"] * jnp.arange(1.0, 9.0)
                       .reshape(1, 1, 2, 4))  # fmt: skip

    x = jnp.asarray([[[[10.0, 20.0]]]])
    up = model.apply(p, s, {"x": x, "m": m})[0]["up"]
    np.testing.assert_array_equal(up[0, 0], [[0, 0, 0, 20], [0, 0, 0, 0]])
    np.testing.assert_array_equal(jax.grad(f)(x)[0, 0], [[4.0, 4.0]])


def test_max_unpool_index_outside_the_top_is_nan_not_a_silent_number():
    text = net('layer { name: "up" type: "Upsample" bottom: "x" bottom: "m" top: "up" '
               "upsample_param { scale: 2 } }", {"x": (1, 2, 1, 2), "m": (1, 2, 1, 2)})  # fmt: skip
    m = np.array([[[[0, 1]], [[0, 8]]]], np.float32)  # 8 ≥ 2·4: outside channel 1's top
    up = ours(text, {"x": np.ones((1, 2, 1, 2)), "m": m})["up"]
    assert np.all(np.isfinite(up[0, 0])) and np.all(np.isnan(up[0, 1]))


def test_max_unpool_finite_differences():
    mask = np.array([[[[1, 6], [8, 15]], [[0, 3], [9, 14]]]], np.float32)
    text = net('layer { name: "up" type: "Upsample" bottom: "x" bottom: "m" top: "up" '
               "upsample_param { scale: 2 } }", {"x": (1, 2, 2, 2), "m": (1, 2, 2, 2)})  # fmt: skip
    x = np.random.default_rng(0).standard_normal((1, 2, 2, 2))
    fd_check(text, {"x": x}, "up", fixed={"m": mask})


def test_max_unpool_refusals():
    with pytest.raises(NetError, match=r"layer 'up' \(type Upsample\).*greater than 1"):
        compile_net(net(UNPOOL % "scale: 1", {"x": (1, 1, 4, 4)}))
    with pytest.raises(NetError, match="scale of 2"):
        compile_net(net(UNPOOL % "scale: 3 pad_out_w: true", {"x": (1, 1, 6, 6)}))


def test_max_unpool_under_bf16_keeps_exact_indices():
    """The mask top stays float32 when Pooling computes in bfloat16 (precision "bf16"), whose
    8-bit mantissa would round indices above 256 and misplace values silently."""
    text = net(UNPOOL % "scale: 2", {"x": (1, 1, 32, 32)})
    x = np.random.default_rng(4).permutation(1024).astype(np.float32).reshape(1, 1, 32, 32)
    model = compile_net(text, precision="bf16")
    p, s = model.init(0)
    blobs = model.apply(p, s, {"x": jnp.asarray(x)})[0]
    assert blobs["mask"].dtype == jnp.float32
    rounded = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32)  # what bf16 pooling sees
    fp32 = ours(text, {"x": rounded})
    assert fp32["mask"].max() > 900  # indices bfloat16 could not hold exactly
    np.testing.assert_array_equal(blobs["mask"], fp32["mask"])
    np.testing.assert_array_equal(np.asarray(blobs["up"], np.float32), fp32["up"])
