"""The convolution forms (lowering/engines/conv_forms.py): a 1×1 convolution as one matrix
product, a few-channel convolution as im2col patches, and the plain lax.conv in either layout.
Each equals the plain form to float rounding, as a net (top and every gradient, with the
engine policy turning the form on and off) and as arrays; oneDNN's form is tested in
test_onednn.py."""

from __future__ import annotations

import platform

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.lowering.engines import conv_forms, onednn
from caffe2jax.lowering.engines.policy import EnginePolicy
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.layers.test_vision import conv_ref

jax.config.update("jax_default_matmul_precision", "highest")

RNG = np.random.default_rng(20240607)
ON_CPU = jax.default_backend() == "cpu"


def _conv_form_vs_lax_conv(form, on_off, x, conv_param, tol):
    """A conv+ReLU net under each policy of ``on_off``: the 'on' one plans ``form`` and uses
    no lax.conv (on CPU), and its top and every gradient equal the 'off' one's to ``tol`` of
    each array's largest magnitude. Returns the top's shape."""
    dims = " ".join(f"dim: {n}" for n in x.shape)
    text = f"""
input: "x" input_shape {{ {dims} }}
layer {{ name: "c" type: "Convolution" bottom: "x" top: "y"
        convolution_param {{ {conv_param} weight_filler {{ type: "gaussian" std: 1 }}
                             bias_filler {{ type: "gaussian" std: 1 }} }} }}
layer {{ name: "r" type: "ReLU" bottom: "y" top: "y" }}
"""
    on_cpu = jax.default_backend() == "cpu"
    results = []
    for policy in on_off:
        model = compile_net(text, policy=policy)
        on = policy is on_off[0]
        assert (model.graph.engines["c"] == form) == (on and on_cpu), form
        params, state = model.init(0)

        def f(params, x, model=model, state=state):
            return jitted.forward(model, params, state, {"x": x})[0]["y"]

        jaxpr = str(jax.make_jaxpr(f)(params, x))
        uses_conv = "conv_general_dilated" in jaxpr
        assert uses_conv == (not on or not on_cpu), form
        y, vjp = jax.vjp(f, params, x)
        dy = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
        results.append((y, *vjp(dy)))
    for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())
    return results[0][0].shape


@pytest.mark.parametrize("stride", [1, 2])
def test_pointwise_convolution_as_a_matrix_product_equals_the_convolution(stride):
    """On CPU a channels-last 1×1 convolution is one matrix product over channels (policy
    ``pointwise``): the same top and gradients as lax.conv, to float rounding (the two sum the
    channels in different orders)."""
    x = RNG.standard_normal((2, 6, 7, 5)).astype(np.float32)
    param = f"num_output: 4 kernel_size: 1 stride: {stride}"
    policies = EnginePolicy(conv="xla", pointwise=True), EnginePolicy(conv="xla", pointwise=False)
    shape = _conv_form_vs_lax_conv("pointwise", policies, x, param, 1e-6)
    assert shape == (2, 4, -(-7 // stride), -(-5 // stride))


@pytest.mark.parametrize("stride", [1, 2])
def test_pointwise_with_onednn_gradients_equals_the_convolution(stride):
    """A 1×1 convolution under oneDNN's size rule (``pointwise-dnn``): the matrix product
    forward, oneDNN's backward-data and backward-weights; the top, the bottom diff and the
    weight and bias diffs equal lax.conv's under jit, to float rounding (strided too: the
    bottom diff is 0 at the pixels the stride skips)."""
    if (platform.system(), platform.machine()) != ("Linux", "x86_64") or not ON_CPU:
        pytest.skip("oneDNN (onednn-cpu-gomp) is the CPU's on Linux x86-64 only")
    assert onednn.available() is None, onednn.available()  # a dependency there: must load
    x = RNG.standard_normal((2, 6, 7, 5)).astype(np.float32)
    param = f"num_output: 4 kernel_size: 1 stride: {stride}"
    on = EnginePolicy(onednn_min_macs=1)
    shape = _conv_form_vs_lax_conv("pointwise-dnn", (on, EnginePolicy(conv="xla", pointwise=False)),
                                   x, param, 1e-5)  # fmt: skip
    assert shape == (2, 4, -(-7 // stride), -(-5 // stride))


@pytest.mark.parametrize("k,s,p,d", [(3, 2, 1, 1), (3, 1, 2, 2)])
def test_onednn_with_the_weight_diff_as_patches_equals_the_convolution(k, s, p, d):
    """A oneDNN convolution on a small image (``onednn-dwpatches``): oneDNN's forward and
    backward-data, the weight diff as one matrix product of im2col patches and the top diff;
    the top, the bottom diff and the weight and bias diffs equal lax.conv's under jit, to
    float rounding (padded, strided, dilated)."""
    if (platform.system(), platform.machine()) != ("Linux", "x86_64") or not ON_CPU:
        pytest.skip("oneDNN (onednn-cpu-gomp) is the CPU's on Linux x86-64 only")
    assert onednn.available() is None, onednn.available()  # a dependency there: must load
    x = RNG.standard_normal((2, 6, 4, 6)).astype(np.float32)
    param = f"num_output: 4 kernel_size: {k} stride: {s} pad: {p} dilation: {d}"
    on = EnginePolicy(onednn_min_macs=1, dw_patches_min_depth=1)
    off = EnginePolicy(conv="xla", patches=False)
    _conv_form_vs_lax_conv("onednn-dwpatches", (on, off), x, param, 1e-5)


@pytest.mark.parametrize("c,k,s,p,d", [(1, 5, 1, 0, 1), (3, 5, 1, 2, 1), (3, 3, 2, 1, 1),
                                       (3, 3, 1, 2, 2), (4, 2, 3, 1, 1)])  # fmt: skip
def test_few_channel_convolution_as_patches_equals_the_convolution(c, k, s, p, d):
    """On CPU a convolution of ≤ 4 input channels that oneDNN does not take is im2col + one
    matrix product (policy ``patches``, ``few_channels``): the same top and gradients as
    lax.conv, to float rounding, padded, strided and dilated."""
    x = RNG.standard_normal((2, c, 9, 8)).astype(np.float32)
    param = f"num_output: 5 kernel_size: {k} stride: {s} pad: {p} dilation: {d}"
    policies = EnginePolicy(), EnginePolicy(few_channels=0)
    _conv_form_vs_lax_conv("patches", policies, x, param, 1e-5)
    policies = EnginePolicy(), EnginePolicy(patches=False)
    _conv_form_vs_lax_conv("patches", policies, x, param, 1e-5)


def test_patches_stay_within_their_limits():
    """The policy's limits: more than ``few_channels`` input channels, more than
    ``patches_max_macs`` multiply-adds, a 1×1 kernel or groups keep lax.conv (on the CPU)."""
    text = """
input: "x" input_shape {{ dim: 2 dim: {c} dim: 9 dim: 8 }}
layer {{ name: "c" type: "Convolution" bottom: "x" top: "y"
        convolution_param {{ num_output: 4 kernel_size: 3 group: {g} }} }}
"""

    def form(c=3, g=1, **fields):
        policy = EnginePolicy(**{"conv": "xla", "backend": "cpu", **fields})
        return compile_net(text.format(c=c, g=g), policy=policy).graph.engines["c"]

    assert form() == "patches"
    assert form(c=5) == "xla"
    assert form(c=5, few_channels=5) == "patches"
    assert form(patches_max_macs=9071) == "xla"  # N·O·H'·W'·C·k² = 2·4·7·6·3·9 = 9072
    assert form(patches_max_macs=9072) == "patches"
    assert form(c=4, g=2) == "xla"
    assert form(conv="onednn-all") != "patches"  # oneDNN takes every convolution


@pytest.mark.parametrize("form", ["xla", "pointwise", "patches"])
def test_each_form_is_caffes_convolution(form):
    """The forms as arrays: channels-last in, channels-last out, Caffe's weights, against
    Caffe's convolution in numpy (float64)."""
    kernel, pad, dil = (1, (0, 0), (1, 1)) if form == "pointwise" else (3, (1, 2), (2, 1))
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = RNG.standard_normal((5, 3, kernel, kernel)).astype(np.float32)
    y = conv_forms.convolve(form, jnp.asarray(x.transpose(0, 2, 3, 1)), jnp.asarray(w), (2, 1),
                            pad, dil, 1, channels_last=True)  # fmt: skip
    ref = conv_ref(x, w, np.zeros(5), (2, 1), pad, dil, 1)
    np.testing.assert_allclose(np.asarray(y).transpose(0, 3, 1, 2), ref, rtol=1e-5, atol=1e-4)


def test_general_takes_its_layout_as_a_parameter():
    """One body, two layouts: the NCHW and NHWC results are the same array transposed."""
    x = RNG.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = RNG.standard_normal((6, 2, 3, 3)).astype(np.float32)
    args = (2, 1), (1, 1), (1, 2), 2
    nchw = conv_forms.general(x, w, *args, channels_last=False)
    nhwc = conv_forms.general(x.transpose(0, 2, 3, 1), w, *args, channels_last=True)
    np.testing.assert_allclose(np.asarray(nhwc).transpose(0, 3, 1, 2), nchw, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unknown convolution form 'fft'"):
        conv_forms.convolve("fft", x, w, *args, channels_last=False)
