"""Winograd's F(2×2, 3×3) for forward-only programs (lowering/engines/winograd.py, policy
field ``winograd``, packed by Model.packed): under jax.jit the top is the direct
convolution's within float rounding, only the convolutions the size rule names take it, and
the policy switch leaves the forward bit for bit the oneDNN one.

Tolerance: 1e-5 of the top's largest magnitude. Winograd's transforms add and subtract the
inputs and the partial products (coefficients 0, ±1, ±½) where the direct convolution only
accumulates products, so the two round differently: ~1e-6 measured at GoogLeNet's shapes
(benchmarks/inception_forms.py), with C up to 64 here.

CPU-only, Linux x86-64 (the onednn-cpu-gomp wheel), as test_packing.py."""

from __future__ import annotations

import platform

import jax
import numpy as np
import pytest

from caffe2jax.lowering.engines import conv_forms, onednn, packing, winograd
from caffe2jax.lowering.engines.policy import EnginePolicy
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted

if jax.default_backend() != "cpu":
    pytest.skip("the oneDNN path is CPU-only", allow_module_level=True)
if (platform.system(), platform.machine()) != ("Linux", "x86_64"):
    pytest.skip("onednn-cpu-gomp ships for Linux x86-64 only", allow_module_level=True)

NET = """
input: "x" input_shape { dim: 2 dim: 16 dim: 14 dim: 13 }
layer { name: "c1" type: "Convolution" bottom: "x" top: "y"
        convolution_param { num_output: 24 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 1 }
                            bias_filler { type: "gaussian" std: 1 } } }
layer { name: "r1" type: "ReLU" bottom: "y" top: "y" }
layer { name: "c2" type: "Convolution" bottom: "y" top: "z"
        convolution_param { num_output: 8 kernel_size: 3 stride: 2 pad: 1
                            weight_filler { type: "gaussian" std: 1 } bias_term: false } }
"""


def _close(got, ref) -> None:
    ref = np.asarray(ref)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("shape", [(1, 14, 14, 64), (2, 9, 12, 5)])
def test_winograd_is_the_convolution_under_jit(shape):
    """Even and odd sides (odd ones padded to whole 2×2 blocks, then cropped)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((7, shape[3], 3, 3)).astype(np.float32)
    got = jax.jit(winograd.convolve)(x, winograd.pack(w))
    ref = jax.jit(lambda x, w: conv_forms.general(x, w, (1, 1), (1, 1), (1, 1), 1, True))(x, w)
    assert got.shape == ref.shape
    _close(got, ref)


def test_the_size_rule():
    def key(side, kernel=3, stride=1, pad=1, group=1, last=True):
        return onednn.Geometry((1, 8, side, side), (8, 8 // group, kernel, kernel),
                               (stride, stride), (pad, pad), (1, 1), group, last).key()  # fmt: skip

    assert winograd.eligible(key(14)) and winograd.eligible(key(28))
    assert not winograd.eligible(key(7)) and not winograd.eligible(key(56))
    for other in (key(14, kernel=5, pad=2), key(14, stride=2), key(14, pad=0),
                  key(14, group=2), key(14, last=False)):  # fmt: skip
        assert not winograd.eligible(other)


@pytest.mark.parametrize("on", [True, False])
def test_packed_forward_takes_winograd_where_the_policy_says(on):
    policy = EnginePolicy(conv="onednn-all", winograd=on)
    model = compile_net(NET, policy=policy)
    assert model.graph.engines == {"c1": "onednn", "c2": "onednn"}
    params, state = model.init(0)
    x = np.random.default_rng(1).standard_normal((2, 16, 14, 13)).astype(np.float32)
    packed = model.packed(params)
    assert winograd.is_winograd(packed["c1"][0].key) is on  # 3×3, stride 1, pad 1
    assert not winograd.is_winograd(packed["c2"][0].key)  # stride 2: oneDNN
    got = jax.jit(model.apply)(packed, state, {"x": x})[0]
    raw = jitted.forward(model, params, state, {"x": x})[0]
    for blob in ("y", "z"):
        if on:
            _close(got[blob], raw[blob])
        else:
            np.testing.assert_array_equal(np.asarray(got[blob]), np.asarray(raw[blob]))
    program = jax.jit(model.apply).lower(packed, state, {"x": x}).as_text()
    assert program.count("caffe2jax_onednn_fwd_packed") == (1 if on else 2)


def test_winograd_weights_refuse_another_geometry():
    model = compile_net(NET, policy=EnginePolicy(conv="onednn-all", winograd=True))
    params, _ = model.init(0)
    w = model.packed(params)["c1"][0]
    x = np.zeros((2, 12, 12, 16), np.float32)  # not the 14 × 13 bottom it was packed for
    g = onednn.geometry(x, w, (1, 1), (1, 1), (1, 1), 1, True)
    with pytest.raises(ValueError, match="packed for the convolution"):
        packing.convolve(g, x, w)
