"""lowering/forks/deeplab.py: Interp (both forms) against hand-worked cases from the forks'
formulas, OpenCV dnn where it has the layer (zoom_factor or height/width) and float64 finite
differences; PSPNet's BN against the fork's formula worked in NumPy (OpenCV has no BN layer)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import channels_last_agrees, fd_check, max_rel, net, opencv, ours


def _one(type_and_param: str, shape, name: str = "y") -> str:
    return net(f'layer {{ name: "{name}" type: {type_and_param} bottom: "x" top: "{name}" }}',
               {"x": shape})  # fmt: skip


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
    ],
)
def test_channels_last(layer):
    text = f'layer {{ name: "y" type: {layer} bottom: "c" top: "y" }}'
    channels_last_agrees(text, (2, 3, 4, 5))


RNG = np.random.default_rng(0)


X = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32) * 2 + 1


SCALE = RNG.standard_normal((1, 3, 1, 1)).astype(np.float32)


SHIFT = RNG.standard_normal((1, 3, 1, 1)).astype(np.float32)


PSPNET = 'layer { name: "bn" type: "BN" bottom: "x" top: "y" bn_param { %s } }'


def _run(text: str, weights: list, phase: str = "TEST", x=X):
    model = compile_net(text, phase=phase)
    params, state = model.init(0)
    decls = model.graph.decls["bn"]
    blobs = [np.asarray(w, np.float32) for w in weights]
    params["bn"] = [None if d.state else b for b, d in zip(blobs, decls)]
    state["bn"] = [b if d.state else None for b, d in zip(blobs, decls)]
    out, new_state = jitted.forward(model, params, state, {"x": x}, jax.random.key(0))
    return {k: np.asarray(v) for k, v in out.items()}, new_state


def test_pspnet_test_and_frozen_use_the_running_statistics():
    mean = RNG.standard_normal((1, 3, 1, 1)).astype(np.float32)
    var = RNG.uniform(0.5, 2, (1, 3, 1, 1)).astype(np.float32)
    expected = SCALE * (X - mean) / np.sqrt(var + 1e-5) + SHIFT
    cases = [("eps: 1e-5", "TEST"), ("frozen: true", "TRAIN")]
    for param, phase in cases:
        text = net(PSPNET % param, {"x": X.shape})
        out, state = _run(text, [SCALE, SHIFT, mean, var], phase)
        np.testing.assert_allclose(out["y"], expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(state["bn"][2], mean)  # not updated
        np.testing.assert_array_equal(state["bn"][3], var)


def test_pspnet_train_normalises_with_the_batch_and_updates_by_momentum():
    mean = np.full((1, 3, 1, 1), 0.5, np.float32)
    var = np.full((1, 3, 1, 1), 2.0, np.float32)
    x = X.astype(np.float64)
    bmean = x.mean(axis=(0, 2, 3), keepdims=True)
    bvar = ((x - bmean) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    text = net(PSPNET % "momentum: 0.95 eps: 1e-4", {"x": X.shape})
    out, state = _run(text, [SCALE, SHIFT, mean, var], "TRAIN")
    expected = SCALE * (x - bmean) / np.sqrt(bvar + 1e-4) + SHIFT
    np.testing.assert_allclose(out["y"], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state["bn"][2], 0.95 * mean + 0.05 * bmean, rtol=1e-5)
    np.testing.assert_allclose(state["bn"][3], 0.95 * var + 0.05 * bvar, rtol=1e-5)


def test_pspnet_running_statistics_move_in_a_solver_step_and_are_not_trained():
    """Through the compiled train step (runtime/train/step.py): the running blobs become
    momentum·blob + (1 − momentum)·batch statistic; the solver leaves them out (lr 0)."""
    from caffe2jax.frontend import caffe_pb2
    from caffe2jax.runtime.train.step import Trainer

    layers = (PSPNET % "momentum: 0.9 slope_filler { type: 'constant' value: 1 }") + (
        '\nlayer { name: "loss" type: "SoftmaxWithLoss" bottom: "y" bottom: "label" top: "loss" }'
    )
    text = net(layers, {"x": X.shape, "label": (2, 1, 4, 5)})
    model = compile_net(text, phase="TRAIN")
    params, state = model.init(0)
    trainer = Trainer(model, caffe_pb2.SolverParameter(base_lr=0.5, lr_policy="fixed"),
                      params, state)  # fmt: skip
    batch = [{"x": X, "label": np.zeros((2, 1, 4, 5), np.float32)}]
    opt = trainer.init(params, state)
    new_params, new_state, *_ = trainer.step(params, state, opt, batch, jax.random.key(0), 0)
    x = X.astype(np.float64)
    np.testing.assert_allclose(np.ravel(new_state["bn"][2]), 0.1 * x.mean(axis=(0, 2, 3)),
                               rtol=1e-5)  # fmt: skip
    np.testing.assert_allclose(np.ravel(new_state["bn"][3]), 0.1 * x.var(axis=(0, 2, 3)),
                               rtol=1e-5)  # fmt: skip
    assert not np.allclose(new_params["bn"][0], params["bn"][0])  # slope trained


def test_pspnet_blobs():
    model = compile_net(net(PSPNET % "frozen: true", {"x": X.shape}))
    assert [d.shape for d in model.graph.decls["bn"]] == [(1, 3, 1, 1)] * 4
    assert [d.state for d in model.graph.decls["bn"]] == [False, False, True, True]
