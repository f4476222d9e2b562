"""lowering/fork_resample.py: Upsample (SegNet max-unpooling, YOLO nearest) and Interp, against
hand-worked cases from the forks' formulas, OpenCV dnn where it has the layer (Interp with
zoom_factor or height/width), and float64 finite differences."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import channels_last_agrees, fd_check, max_rel, net, opencv, ours

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


# -- Upsample: max-unpooling --------------------------------------------------------------


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
        return jnp.sum(jitted.forward(model, p, s, {"x": x})[0]["up"] * g)

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
        return jnp.sum(jitted.forward(model, p, s, {"x": x, "m": m})[0]["up"] * jnp.arange(1.0, 9.0)
                       .reshape(1, 1, 2, 4))  # fmt: skip

    x = jnp.asarray([[[[10.0, 20.0]]]])
    up = jitted.forward(model, p, s, {"x": x, "m": m})[0]["up"]
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


# -- Upsample: nearest ----------------------------------------------------------------------


def test_nearest_upsample_by_hand_and_gradient():
    text = _one('"Upsample" upsample_param { scale: 2 }', (1, 1, 2, 2))
    y = ours(text, {"x": np.array([[[[1, 2], [3, 4]]]])})["y"][0, 0]
    np.testing.assert_array_equal(y, [[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]])
    fd_check(_one('"Upsample" upsample_param { scale: 3 }', (1, 2, 2, 3)),
             {"x": np.random.default_rng(1).standard_normal((1, 2, 2, 3))}, "y")  # fmt: skip


# -- Interp ---------------------------------------------------------------------------------

X23 = np.array([[0, 1, 2], [3, 4, 5]], np.float32)  # x[h, w] = 3h + w: bilinear is exact


@pytest.mark.parametrize(
    "param, expected",
    [
        ("zoom_factor: 2", 3 * np.arange(3)[:, None] / 2 + np.arange(5)[None] / 2),
        ("shrink_factor: 2", [[0, 2]]),
        ("height: 4 width: 2", [[0, 2], [1, 3], [2, 4], [3, 5]]),
        ("shrink_factor: 2 zoom_factor: 3", [[0, 2 / 3, 4 / 3, 2]]),
        ("zoom_factor: 1 pad_beg: -1", [[4, 5]]),
        ("height: 3 width: 2 pad_end: -1", [[0, 1], [0, 1], [0, 1]]),
        ("height: 9 width: 9 zoom_factor: 2", 3 * np.arange(3)[:, None] / 2 +
         np.arange(5)[None] / 2),  # a factor wins over height/width
    ],
)  # fmt: skip
def test_interp_2x3_each_size_rule_by_hand(param, expected):
    y = ours(_one(f'"Interp" interp_param {{ {param} }}', (1, 1, 2, 3)), {"x": X23[None, None]})
    np.testing.assert_allclose(y["y"][0, 0], expected, rtol=0, atol=1e-6)


def test_interp_float32_source_coordinates():
    """The fork computes r·i in float32 and truncates: (4−1)/(7−1) = 0.5 exactly, while
    (3−1)/(4−1)·3 rounds to 2 (row 2 exactly, weight 0 on a clamped neighbour)."""
    x = np.arange(4, dtype=np.float32)[None, None, :, None] * np.ones((1, 1, 1, 3), np.float32)
    y = ours(_one('"Interp" interp_param { height: 7 width: 3 }', (1, 1, 4, 3)), {"x": x})["y"]
    np.testing.assert_allclose(y[0, 0, :, 0], np.arange(7) / 2, atol=1e-6)
    x3 = np.array([[[[0.0], [1.0], [2.0]]]], np.float32)
    y = ours(_one('"Interp" interp_param { height: 4 width: 1 }', (1, 1, 3, 1)), {"x": x3})["y"]
    np.testing.assert_allclose(y[0, 0, :, 0], [0, 2 / 3, 4 / 3, 2], atol=1e-6)


@pytest.mark.parametrize("param", ["zoom_factor: 3", "height: 7 width: 3", "height: 9 width: 11"])
def test_interp_matches_opencv(param):
    x = np.random.default_rng(2).standard_normal((2, 3, 4, 5)).astype(np.float32)
    text = _one(f'"Interp" interp_param {{ {param} }}', x.shape)
    theirs = opencv(text, {"x": x}, ["y"])["y"][0]
    assert max_rel(ours(text, {"x": x})["y"], theirs) < 1e-4


def test_interp_finite_differences():
    x = np.random.default_rng(3).standard_normal((1, 2, 3, 4))
    fd_check(_one('"Interp" interp_param { zoom_factor: 2 pad_beg: -1 }', x.shape), {"x": x}, "y")
    fd_check(_one('"Interp" interp_param { height: 2 width: 3 }', x.shape), {"x": x}, "y")


def test_interp_refusals_and_deeplab_v1_rule():
    with pytest.raises(NetError, match=r"\(type Interp\).*cropping"):
        compile_net(_one('"Interp" interp_param { zoom_factor: 2 pad_beg: 1 }', (1, 1, 4, 4)))
    with pytest.raises(NetError, match="needs shrink_factor, zoom_factor, or height and width"):
        compile_net(_one('"Interp" interp_param { height: 3 }', (1, 1, 4, 4)))
    v1 = ('layers { name: "in" type: INTERP bottom: "x" top: "y" '
          "interp_param { zoom_factor: 2 shrink_factor: 2 } }")  # fmt: skip
    text = 'input: "x" input_shape { dim: 1 dim: 1 dim: 4 dim: 4 }\n' + v1
    with pytest.raises(NetError, match="DeepLab v1's Interp takes exactly one"):
        compile_net(text)
    ok = compile_net(text.replace(" shrink_factor: 2", ""))
    assert ok.net.layers[-1].form == "deeplab-v1"


@pytest.mark.parametrize(
    "layer",
    [
        '"Interp" interp_param { zoom_factor: 2 pad_beg: -1 }',
        '"Interp" interp_param { height: 3 width: 7 }',
        '"Upsample" upsample_param { scale: 2 }',
    ],
)
def test_channels_last(layer):
    text = f'layer {{ name: "y" type: {layer} bottom: "c" top: "y" }}'
    channels_last_agrees(text, (2, 3, 4, 5))


def test_max_unpool_under_bf16_keeps_exact_indices():
    """The mask top stays float32 when Pooling computes in bfloat16 (precision "bf16"), whose
    8-bit mantissa would round indices above 256 and misplace values silently."""
    text = net(UNPOOL % "scale: 2", {"x": (1, 1, 32, 32)})
    x = np.random.default_rng(4).permutation(1024).astype(np.float32).reshape(1, 1, 32, 32)
    model = compile_net(text, precision="bf16")
    p, s = model.init(0)
    blobs = jitted.forward(model, p, s, {"x": jnp.asarray(x)})[0]
    assert blobs["mask"].dtype == jnp.float32
    rounded = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32)  # what bf16 pooling sees
    fp32 = ours(text, {"x": rounded})
    assert fp32["mask"].max() > 900  # indices bfloat16 could not hold exactly
    np.testing.assert_array_equal(blobs["mask"], fp32["mask"])
    np.testing.assert_array_equal(np.asarray(blobs["up"], np.float32), fp32["up"])
