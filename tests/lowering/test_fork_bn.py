"""lowering/fork_bn.py: the forks' BN layer in SegNet/ENet's and PSPNet's forms, against the
forks' formulas worked in NumPy (OpenCV has no BN layer), and float64 finite differences."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import channels_last_agrees, fd_check, net

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
    out, new_state = jitted.forward(model, params, state, {"x": x}, jax.random.key(0))
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
    # atol: under jit XLA fuses scale·x + shift into one multiply-add (one rounding where the
    # fork's caffe_mul then caffe_add round twice); where the sum cancels, the two differ by
    # up to half an ulp of scale·x (~6e-8 here), a large relative error on a small result
    np.testing.assert_allclose(out["y"], SCALE * X + SHIFT, rtol=1e-6, atol=1e-7)
    with pytest.raises(NetError, match="INFERENCE has one top"):
        compile_net(_segnet_text("bn_mode: INFERENCE", ("y", "m")))


def test_segnet_blobs_and_fillers():
    model = compile_net(_segnet_text('bn_mode: LEARN scale_filler { type: "constant" value: 1 }'))
    decls = model.graph.decls["bn"]
    assert [d.shape for d in decls] == [(1, 3, 1, 1)] * 2 and not any(d.state for d in decls)
    params, _ = model.init(0)
    np.testing.assert_array_equal(params["bn"][0], np.ones((1, 3, 1, 1)))
    np.testing.assert_array_equal(params["bn"][1], np.zeros((1, 3, 1, 1)))


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
