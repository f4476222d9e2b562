"""lowering/smooth_l1_ssd.py and lowering/smooth_l1.py: SSD's SmoothL1Loss (loss Σf(w·(p−t))/N,
backward f'(d)/N without the weight factor) and the form dispatch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import net

RNG = np.random.default_rng(3)
PRED = (RNG.standard_normal((3, 8)) * 1.5).astype(np.float32)
TARGET = RNG.standard_normal((3, 8)).astype(np.float32)
WEIGHTS = RNG.uniform(0, 2, (3, 8)).astype(np.float32)


def _run(names):
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
        return jitted.forward(model, params, state, {**x, "x": ones}, jax.random.key(0))[0]["loss"]

    value, vjp = jax.vjp(f, feed)
    return float(value), {k: np.asarray(v) for k, v in vjp(jnp.float32(2.0))[0].items()}


def _fork(weighted: bool):
    d = (PRED.astype(np.float64) - TARGET) * (WEIGHTS if weighted else 1.0)
    f = np.where(np.abs(d) < 1, 0.5 * d * d, np.abs(d) - 0.5)
    df = np.where(np.abs(d) < 1, d, np.sign(d))
    return f.sum() / 3, 2.0 * df / 3  # top diff 2, N = 3, no weight factor


@pytest.mark.parametrize("weighted", [False, True])
def test_ssd_smooth_l1_value_and_fork_backward(weighted):
    names = ["pred", "target", "w"] if weighted else ["pred", "target"]
    value, grads = _run(names)
    loss, diff = _fork(weighted)
    np.testing.assert_allclose(value, loss, rtol=1e-6)
    np.testing.assert_allclose(grads["pred"], diff, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads["target"], -diff, rtol=1e-5, atol=1e-7)
    if weighted:
        assert not np.any(grads["w"])


def test_rcnn_form_without_its_module_fails_naming_the_layer():
    text = net('layer { name: "l1" type: "SmoothL1Loss" bottom: "pred" bottom: "target" '
               'top: "loss" smooth_l1_loss_param { sigma: 3 } }',
               {"pred": PRED.shape, "target": PRED.shape})  # fmt: skip
    try:
        import caffe2jax.lowering.smooth_l1_rcnn  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(NetError, match="'l1'.*rcnn"):
            compile_net(text)
    else:  # the rcnn form's own tests cover it once its module exists
        assert compile_net(text).net.layers[-1].form == "rcnn"
