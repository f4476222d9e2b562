"""lowering/forks/enet.py: ENet's SpatialDropout Python layer as a built-in — the fork's TEST
scaling, whole-channel drops, its backward's last-sample mask, and a user's own module winning."""

from __future__ import annotations

import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import fd_check, net, ours

RNG = np.random.default_rng(0)


X = (RNG.standard_normal((2, 3, 4, 5)) * 6).astype(np.float32)


def _one(type_and_param: str, shape=X.shape) -> str:
    return net(f'layer {{ name: "y" type: {type_and_param} bottom: "x" top: "y" }}', {"x": shape})


def _grad(text: str, x, phase: str = "TEST", rng=None) -> np.ndarray:
    model = compile_net(text, phase=phase)
    p, s = model.init(0)

    def f(x):
        return jnp.sum(jitted.forward(model, p, s, {"x": x}, rng)[0]["y"])

    return np.asarray(jax.grad(f)(jnp.asarray(x, jnp.float32)))


SPATIAL = (
    '"Python" python_param { module: "spatial_dropout" layer: "SpatialDropoutLayer" '
    "param_str: \"{'phase': '%s', 'p': '%s'}\" }"
)


def test_spatial_dropout_scales_at_test():
    """ENet's layer multiplies by 1/(1 − p) whenever its param_str phase is not TRAIN, in
    either net phase."""
    text = _one(SPATIAL % ("TEST", "0.2"))
    for phase in ("TEST", "TRAIN"):
        y = ours(text, {"x": X}, phase=phase)["y"]
        np.testing.assert_allclose(y, X / 0.8, rtol=1e-6)
    fd_check(text, {"x": X}, "y")


def test_spatial_dropout_train_drops_whole_channels():
    x = np.ones((4, 64, 3, 3), np.float32)
    y = ours(_one(SPATIAL % ("TRAIN", "0.5"), x.shape), {"x": x}, phase="TEST")["y"]
    planes = y.reshape(4, 64, 9)
    assert np.all(planes == planes[:, :, :1])  # one decision per (sample, channel)
    assert set(np.unique(planes)) == {0.0, 2.0}
    assert 0.3 < np.mean(planes[:, :, 0] == 0) < 0.7


def test_spatial_dropout_backward_uses_the_last_samples_mask():
    """The fork's backward multiplies every sample's diff by the mask drawn for the last
    sample (self.vec_w), not by the sample's own."""
    x = np.ones((3, 32, 2, 2), np.float32)
    text = _one(SPATIAL % ("TRAIN", "0.5"), x.shape)
    y = ours(text, {"x": x})["y"]
    dx = _grad(text, x, rng=jax.random.key(0))
    for n in range(3):
        np.testing.assert_array_equal(dx[n], y[-1])


def test_spatial_dropout_bad_param_str_is_one_line():
    with pytest.raises(NetError, match=r"layer 'y' .*SpatialDropout's p must be between 0 and 1"):
        compile_net(_one(SPATIAL % ("TEST", "1.5")))


USER_SPATIAL_DROPOUT = """
import caffe2jax as caffe


class SpatialDropoutLayer(caffe.Layer):
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = -1
"""


def test_a_users_own_spatial_dropout_module_wins(tmp_path, monkeypatch):
    """The built-in runs only when no spatial_dropout module is on sys.path (as proposal.py)."""
    (tmp_path / "spatial_dropout.py").write_text(textwrap.dedent(USER_SPATIAL_DROPOUT))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "spatial_dropout", raising=False)
    try:
        y = ours(_one(SPATIAL % ("TEST", "0.3")), {"x": X})["y"]
        np.testing.assert_array_equal(y, -np.ones_like(X))
    finally:
        sys.modules.pop("spatial_dropout", None)
