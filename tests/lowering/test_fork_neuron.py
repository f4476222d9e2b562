"""lowering/fork_neuron.py (ReLU6, Mish, ENet's SpatialDropout) and the forks' Dropout forms
(lowering/neuron.py): OpenCV dnn parity for ReLU6 and Mish, the forks' backward rules, and
float64 finite differences."""

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
from tests.lowering.fork_nets import channels_last_agrees, fd_check, max_rel, net, opencv, ours

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


@pytest.mark.parametrize("kind", ['"ReLU6"', '"Mish"'])
def test_matches_opencv(kind):
    x = np.concatenate([X, X * 5], axis=0)  # |x| up to ~100: both softplus thresholds
    text = _one(kind, x.shape)
    assert max_rel(ours(text, {"x": x})["y"], opencv(text, {"x": x}, ["y"])["y"][0]) < 1e-4


def test_relu6_values_and_kinks():
    x = np.array([-2.0, 0.0, 3.0, 6.0, 7.0], np.float32)
    text = _one('"ReLU6" relu6_param { negative_slope: 0.1 }', x.shape)
    np.testing.assert_allclose(ours(text, {"x": x})["y"], [-0.2, 0, 3, 6, 6], rtol=1e-6)
    np.testing.assert_allclose(_grad(text, x), [0.1, 0.1, 1, 0, 0], rtol=1e-6)
    fd_check(_one('"ReLU6"', (7,)), {"x": np.array([-3, -1, 0.5, 2, 5.5, 6.5, 9.0])}, "y")


def test_mish_formula_and_gradient():
    x = np.array([-30.0, -5.0, 0.0, 1.0, 25.0])
    text = _one('"Mish"', x.shape)
    softplus = np.where(x > 20, x, np.where(x < -20, np.exp(x), np.log1p(np.exp(x))))
    np.testing.assert_allclose(ours(text, {"x": x})["y"], x * np.tanh(softplus), rtol=1e-6)
    fd_check(text, {"x": np.array([-25.0, -3.0, -0.3, 2.0, 22.0])}, "y")


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


DROPOUT = '"Dropout" dropout_param { dropout_ratio: 0.25 %s }'


def test_dropout_scale_train_false():
    """Faster R-CNN: no 1/(1 − p) in TRAIN; x·(1 − p) in TEST."""
    text = _one(DROPOUT % "scale_train: false")
    np.testing.assert_allclose(ours(text, {"x": X})["y"], X * 0.75, rtol=1e-6)
    y = ours(text, {"x": X}, phase="TRAIN")["y"]
    assert np.all((y == 0) | (y == X)) and np.any(y == 0)
    kept = ours(_one(DROPOUT % "scale_train: true"), {"x": X}, phase="TRAIN")["y"]
    assert np.all((kept == 0) | np.isclose(kept, X / 0.75))
    np.testing.assert_array_equal(ours(_one(DROPOUT % "scale_train: true"), {"x": X})["y"], X)


def test_dropout_sample_weights_test():
    """SegNet / ENet: sample_weights_test drops (and scales) in TEST too."""
    y = ours(_one(DROPOUT % "sample_weights_test: true"), {"x": X})["y"]
    assert np.all((y == 0) | np.isclose(y, X / 0.75)) and np.any(y == 0)
    y = ours(_one(DROPOUT % "sample_weights_test: false"), {"x": X})["y"]
    np.testing.assert_array_equal(y, X)


@pytest.mark.parametrize("kind", ['"ReLU6"', '"Mish"'])
def test_channels_last(kind):
    channels_last_agrees(f'layer {{ name: "y" type: {kind} bottom: "c" top: "y" }}', X.shape)
