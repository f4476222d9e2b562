"""lowering/engines/blocked_grads.py: the ``onednn-blocked`` form (oneDNN's weight diff on its
blocked activations) against the plain ``onednn`` form and XLA's convolution, jitted inside
value_and_grad; the policy's choice of it; and a SegNet-style train net's loss and gradients
with the form on and off."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import caffe2jax
from caffe2jax.lowering.engines import conv_forms, onednn
from caffe2jax.lowering.engines.policy import ConvShape, EnginePolicy

pytestmark = pytest.mark.skipif(onednn.available() is not None, reason="libdnnl not loaded")


def _grads(form: str, x, w, stride, pad, dilation):
    def loss(x, w):
        y = conv_forms.convolve(form, x, w, stride, pad, dilation, 1, True)
        return jnp.sum(jnp.sin(y))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)


@pytest.mark.parametrize(
    "x,w,stride,pad,dilation",
    [
        ((2, 18, 24, 16), (8, 16, 7, 7), (1, 1), (3, 3), (1, 1)),  # SegNet's 7×7
        ((1, 15, 13, 3), (6, 3, 5, 3), (2, 1), (2, 0), (2, 1)),  # strided, dilated, 3 channels
    ],
)  # fmt: skip
def test_blocked_weight_diff_equals_plain_onednn_and_xla(x, w, stride, pad, dilation):
    """Loss, bottom diff and weight diff: equal to the plain oneDNN form within 1e-6 of each
    array's largest value (measured: bit-identical, the same primitive's sums); the diffs
    equal to XLA's convolution's within 1e-5 (float32 sums over up to 784 products in another
    order; the loss, a sum of signed terms far larger than their total, is left out there)."""
    rng = np.random.default_rng(sum(x))
    xs = jnp.asarray(rng.standard_normal(x), jnp.float32)
    ws = jnp.asarray(rng.standard_normal(w) * 0.1, jnp.float32)
    got = jax.tree.leaves(_grads("onednn-blocked", xs, ws, stride, pad, dilation))
    for form, tol, first in (("onednn", 1e-6, 0), ("xla", 1e-5, 1)):
        want = jax.tree.leaves(_grads(form, xs, ws, stride, pad, dilation))
        for a, b in zip(got[first:], want[first:]):
            scale = float(jnp.max(jnp.abs(b)))
            assert float(jnp.max(jnp.abs(a - b))) <= tol * scale, form

    def total(x, w):
        return jnp.sum(conv_forms.convolve("onednn-blocked", x, w, stride, pad, dilation, 1, True))

    text = jax.jit(jax.grad(total, (0, 1))).lower(xs, ws).as_text()
    assert "caffe2jax_onednn_bwd_weights_blocked" in text
    assert 'caffe2jax_onednn_bwd_weights"' not in text


def _conv(w, channels_last=True, group=1) -> ConvShape:
    return ConvShape((4, w[1] * group, 72, 96), w, (3, 3), group, 10**9, np.float32,
                     channels_last)  # fmt: skip


@pytest.mark.parametrize(
    "fields,c,form",
    [
        ({}, _conv((64, 64, 7, 7)), "onednn-blocked"),
        ({}, _conv((64, 64, 5, 5)), "onednn-blocked"),
        ({"onednn_blocked_weight_grads": False}, _conv((64, 64, 7, 7)), "onednn"),
        ({}, _conv((64, 64, 3, 3)), "onednn"),  # 3×3s measured mixed
        ({}, ConvShape((64, 20, 12, 12), (50, 20, 5, 5), (0, 0), 1, 10**9, np.float32, True),
         "onednn"),  # LeNet's conv2: 144 pixels a plane, measured slower blocked
        ({}, ConvShape((100, 32, 16, 16), (32, 32, 5, 5), (2, 2), 1, 10**9, np.float32, True),
         "onednn-blocked"),  # CIFAR-10 quick's conv2
        ({}, _conv((64, 64, 7, 7), channels_last=False), "onednn"),
        ({}, _conv((64, 8, 7, 7), group=8), "onednn"),
        ({"conv": "xla"}, _conv((64, 64, 7, 7)), "xla"),
    ],
)  # fmt: skip
def test_policy_chooses_blocked_weight_grads(fields, c, form):
    assert EnginePolicy(**{"backend": "cpu", **fields}).conv_form(c) == form


CONV = ('layer {{ name: "{n}" type: "Convolution" bottom: "{b}" top: "{n}" convolution_param '
        '{{ num_output: {o} kernel_size: {k} pad: {p} weight_filler {{ type: "msra" }} '
        'bias_filler {{ type: "constant" value: 0.1 }} }} }}\n')  # fmt: skip
BN = ('layer {{ name: "{n}_bn" type: "BN" bottom: "{n}" top: "{n}" bn_param {{ scale_filler '
      '{{ type: "constant" value: 1 }} shift_filler {{ type: "constant" value: 0.001 }} }} }}\n'
      'layer {{ name: "{n}_relu" type: "ReLU" bottom: "{n}" top: "{n}" }}\n')  # fmt: skip
SEGNET_STYLE = (
    'layer { name: "input" type: "Input" top: "data" top: "label" input_param { '
    "shape { dim: 2 dim: 3 dim: 18 dim: 24 } shape { dim: 2 dim: 1 dim: 18 dim: 24 } } }\n"
    + CONV.format(n="conv1", b="data", o=8, k=7, p=3) + BN.format(n="conv1")
    + 'layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" top: "mask1" '
    "pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n"
    + 'layer { name: "up1" type: "Upsample" bottom: "pool1" bottom: "mask1" top: "up1" '
    "upsample_param { scale: 2 } }\n"
    + CONV.format(n="cls", b="up1", o=4, k=1, p=0)
    + 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "cls" bottom: "label" top: "loss" '
    "loss_param { ignore_label: 3 weight_by_label_freqs: true class_weighting: 0.5 "
    "class_weighting: 2 class_weighting: 1 class_weighting: 4 } }\n"
)  # fmt: skip


def test_segnet_style_train_net_same_with_blocked_weight_grads():
    """SegNet's layers (a 7×7 convolution, its BN, max pooling with mask, Upsample, the weighted
    loss): loss and every gradient with the blocked form equal to the plain oneDNN form's,
    jitted inside value_and_grad, within 1e-6 of each array's largest value."""
    rng = np.random.default_rng(5)
    inputs = {"data": jnp.asarray(rng.uniform(0, 255, (2, 3, 18, 24)), jnp.float32),
              "label": jnp.asarray(rng.integers(0, 4, (2, 1, 18, 24)), jnp.float32)}  # fmt: skip
    results, key = {}, jax.random.key(0)
    for on in (True, False):
        policy = EnginePolicy(onednn_min_macs=1, onednn_blocked_weight_grads=on)
        model = caffe2jax.compile(SEGNET_STYLE, "TRAIN", policy=policy)
        assert model.graph.engines["conv1"] == ("onednn-blocked" if on else "onednn")
        params, state = model.init(0)
        loss = jax.jit(jax.value_and_grad(lambda p, m=model, s=state: m.loss(p, s, inputs, key)[0]))
        results[on] = loss(params)
    for a, b in zip(jax.tree.leaves(results[True]), jax.tree.leaves(results[False])):
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-6 * float(jnp.max(jnp.abs(b)))
    assert np.isfinite(float(results[True][0]))
