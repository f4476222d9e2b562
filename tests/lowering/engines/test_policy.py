"""The engine policy (lowering/engines/policy.py): one frozen record, read from the user's
environment switches once per compiled net (a typo refused by name), and the choices it makes
for convolutions and poolings from static facts when a net is planned."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import caffe2jax
from caffe2jax.lowering.engines import onednn, policy
from caffe2jax.lowering.engines.policy import ConvShape, EnginePolicy, PolicyError

POOL_NET = """
input: "x" input_shape { dim: 1 dim: 2 dim: 7 dim: 7 }
layer { name: "pool" type: "Pooling" bottom: "x" top: "y"
        pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
"""


@pytest.fixture
def clean_env(monkeypatch):
    for name in (policy.CONV_ENV, policy.POOL_ENV, policy.CHANNELS_LAST_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_defaults_are_todays_fast_paths(clean_env):
    engines = EnginePolicy.from_env()
    assert engines == EnginePolicy()
    assert (engines.conv, engines.pool, engines.channels_last) == ("auto", "auto", True)
    assert (engines.pointwise, engines.patches) == (True, True)
    assert engines.onednn_min_macs == 16_000_000
    assert (engines.few_channels, engines.patches_max_macs) == (4, 64_000_000)
    assert engines.backend is None


def test_a_policy_is_frozen_hashable_and_compared_by_value():
    engines = EnginePolicy(pool="xla")
    with pytest.raises(dataclasses.FrozenInstanceError):
        engines.pool = "phases"
    assert {engines: 1}[EnginePolicy(pool="xla")] == 1
    assert engines != EnginePolicy() and hash(engines) == hash(EnginePolicy(pool="xla"))
    assert dataclasses.replace(engines, pool="auto") == EnginePolicy()


@pytest.mark.parametrize(
    "env,fields",
    [
        ({"CAFFE2JAX_CPU_CONV": "xla"}, {"conv": "xla"}),
        ({"CAFFE2JAX_CPU_CONV": " ONEDNN-ALL "}, {"conv": "onednn-all"}),
        ({"CAFFE2JAX_CPU_CONV": ""}, {}),
        ({"CAFFE2JAX_POOL": "Phases"}, {"pool": "phases"}),
        ({"CAFFE2JAX_CHANNELS_LAST": "0"}, {"channels_last": False}),
        ({"CAFFE2JAX_CHANNELS_LAST": "no"}, {"channels_last": False}),
        ({"CAFFE2JAX_CHANNELS_LAST": "off"}, {"channels_last": False}),
        ({"CAFFE2JAX_CHANNELS_LAST": "1"}, {}),
        ({"CAFFE2JAX_CHANNELS_LAST": "true"}, {}),
        ({"OTHER": "x"}, {}),
    ],
)
def test_from_env_reads_each_switch(env, fields):
    assert EnginePolicy.from_env(env) == EnginePolicy(**fields)


@pytest.mark.parametrize(
    "env,message",
    [
        ({"CAFFE2JAX_CPU_CONV": "onedn"}, "$CAFFE2JAX_CPU_CONV='onedn': use one of auto, onednn, "
         "onednn-all, xla"),
        ({"CAFFE2JAX_POOL": "fast"}, "$CAFFE2JAX_POOL='fast': use auto, phases or xla"),
        ({"CAFFE2JAX_CHANNELS_LAST": "maybe"}, "$CAFFE2JAX_CHANNELS_LAST='maybe': use 1 or 0"),
    ],
)  # fmt: skip
def test_a_typo_is_refused_in_one_line_naming_the_switch(env, message):
    with pytest.raises(PolicyError) as err:
        EnginePolicy.from_env(env)
    assert str(err.value) == message
    with pytest.raises(PolicyError, match="engine policy pool='fast': use one of auto, phases"):
        EnginePolicy(pool="fast")


def test_fields_override_the_environment():
    env = {"CAFFE2JAX_POOL": "xla", "CAFFE2JAX_CPU_CONV": "xla"}
    assert EnginePolicy.from_env(env, pool="phases") == EnginePolicy(conv="xla", pool="phases")


def test_the_switches_are_read_once_when_a_net_is_compiled(clean_env):
    """Changing a switch later changes nothing in a net already compiled (nor in its reshaped
    copies); the next compile reads it."""
    clean_env.setenv(policy.POOL_ENV, "xla")
    model = caffe2jax.compile(POOL_NET)
    assert model.policy.pool == "xla" and model.graph.engines["pool"] == "xla"
    clean_env.setenv(policy.POOL_ENV, "phases")
    params, state = model.init(0)
    jaxpr = str(jax.make_jaxpr(lambda x: model.apply(params, state, {"x": x})[0]["y"])(
        np.zeros((1, 2, 7, 7), np.float32)))  # fmt: skip
    assert "custom_vjp" not in jaxpr  # still XLA's reduce_window and its autodiff
    assert model.reshape({"x": (2, 2, 7, 7)}).policy.pool == "xla"
    assert caffe2jax.compile(POOL_NET).graph.engines["pool"] == "phases"
    given = EnginePolicy(pool="xla")
    assert caffe2jax.compile(POOL_NET, policy=given).policy is given  # passed, not read


def conv(x=(8, 16, 32, 32), w=(32, 16, 3, 3), pad=(1, 1), group=1, macs=None, dtype=np.float32,
         channels_last=True) -> ConvShape:  # fmt: skip
    """A convolution as the policy sees it (MACs from the shapes unless given)."""
    if macs is None:
        macs = x[0] * w[0] * int(np.prod(x[2:])) * int(np.prod(w[1:]))
    return ConvShape(x, w, pad, group, macs, dtype, channels_last)


@pytest.mark.parametrize(
    "fields,c,form",
    [
        ({}, conv(w=(32, 16, 1, 1), pad=(0, 0)), "pointwise"),
        # a 1×1 under oneDNN's size rule: the matrix product forward, oneDNN's gradients
        ({}, conv(w=(32, 16, 1, 1), pad=(0, 0), macs=16_000_000), "pointwise-dnn"),
        ({"conv": "xla"}, conv(w=(32, 16, 1, 1), pad=(0, 0), macs=16_000_000), "pointwise"),
        ({"pointwise_onednn_grads": False}, conv(w=(32, 16, 1, 1), pad=(0, 0), macs=16_000_000),
         "pointwise"),
        ({"pointwise": False}, conv(w=(32, 16, 1, 1), pad=(0, 0), macs=1), "xla"),
        ({}, conv(w=(32, 16, 1, 1), pad=(1, 1), macs=1), "xla"),  # padded: not a matmul
        ({}, conv(w=(32, 16, 1, 1), pad=(0, 0), channels_last=False, macs=1), "xla"),
        ({}, conv(w=(32, 8, 1, 1), pad=(0, 0), group=2, macs=1), "onednn"),  # grouped: no matmul
        ({"conv": "onednn-all"}, conv(w=(32, 16, 1, 1), pad=(0, 0)), "onednn"),
        ({}, conv(), "onednn"),  # 8·32·32·32·144 multiply-adds ≥ 16M
        ({}, conv(macs=16_000_000 - 1), "xla"),
        # a small image, deep patches (CRNN's conv5): oneDNN, the weight diff as patches
        ({}, conv(x=(32, 512, 4, 16), w=(512, 512, 3, 3), pad=(0, 0), macs=32 * 28 * 512 * 4608),
         "onednn-dwpatches"),
        ({"dw_patches_max_pixels": 0}, conv(x=(32, 512, 4, 16), w=(512, 512, 3, 3),
                                           pad=(0, 0), macs=32 * 28 * 512 * 4608), "onednn"),
        ({"conv": "onednn-all"}, conv(x=(32, 512, 4, 16), w=(512, 512, 3, 3), pad=(0, 0),
                                      macs=32 * 28 * 512 * 4608), "onednn"),
        ({}, conv(x=(32, 512, 4, 16), w=(512, 512, 3, 3), macs=32 * 64 * 512 * 4608),
         "onednn"),  # 64 pixels: oneDNN's own backward-weights
        ({}, conv(x=(32, 512, 4, 16), w=(512, 512, 3, 3), pad=(0, 0), channels_last=False,
                  macs=32 * 28 * 512 * 4608), "onednn"),
        ({}, conv(x=(32, 64, 4, 16), w=(512, 64, 3, 3), pad=(0, 0), macs=32 * 28 * 512 * 576),
         "onednn"),  # patches 576 deep
        # depthwise: oneDNN at any size (XLA:CPU's grouped convolution is slow)
        ({}, conv(w=(16, 1, 3, 3), group=16, macs=1_000), "onednn"),
        ({"conv": "xla"}, conv(w=(16, 1, 3, 3), group=16), "xla"),
        # grouped, a few channels a group (DPN-92's first stage, ResNeXt's): oneDNN at any size
        ({}, conv(x=(1, 96, 56, 56), w=(96, 3, 3, 3), group=32), "onednn"),  # 8.1M MACs
        ({}, conv(x=(1, 8, 4, 4), w=(8, 4, 3, 3), group=2), "onednn"),
        ({"conv": "xla"}, conv(x=(1, 96, 56, 56), w=(96, 3, 3, 3), group=32), "xla"),
        ({"backend": "gpu"}, conv(x=(1, 96, 56, 56), w=(96, 3, 3, 3), group=32), "xla"),
        ({}, conv(x=(1, 96, 8, 56, 56), w=(96, 3, 3, 3, 3), group=32, channels_last=False),
         "xla"),  # 3-D
        ({}, conv(x=(1, 96, 56, 56), w=(96, 3, 3, 3), group=32, dtype=np.float64), "xla"),
        ({}, conv(x=(8, 1, 32, 32), w=(16, 1, 3, 3), macs=1_000, channels_last=False), "xla"),
        ({"onednn_min_macs": 1_000}, conv(macs=1_000), "onednn"),
        ({"conv": "xla"}, conv(), "xla"),
        ({}, conv(dtype=np.float64), "xla"),
        ({}, conv(dtype=jax.numpy.bfloat16), "xla"),
        ({}, conv(x=(1, 3, 32, 32), w=(8, 3, 5, 5), macs=1_000_000), "patches"),
        ({}, conv(x=(1, 3, 32, 32), w=(8, 3, 5, 5), macs=65_000_000), "onednn-blocked"),  # 25 taps
        ({"conv": "xla"}, conv(x=(1, 3, 32, 32), w=(8, 3, 5, 5), macs=65_000_000), "xla"),
        ({"patches": False}, conv(x=(1, 3, 32, 32), w=(8, 3, 5, 5), macs=1_000_000), "xla"),
        ({}, conv(x=(1, 3, 32, 32), w=(8, 3, 5, 5), macs=1_000, channels_last=False), "xla"),
        ({"backend": "gpu"}, conv(), "xla"),
        ({"backend": "gpu"}, conv(w=(32, 16, 1, 1), pad=(0, 0)), "xla"),
        ({"backend": "gpu"}, conv(x=(1, 3, 32, 32), w=(8, 3, 5, 5), macs=1_000), "xla"),
        ({}, conv(x=(1, 16, 8, 8, 8), w=(32, 16, 3, 3, 3), channels_last=False), "xla"),  # 3-D
    ],
)  # fmt: skip
def test_conv_form(fields, c, form):
    """The rules vision.py's convolutions ran at trace time, now made when a net is planned:
    the 1×1 matrix product, then oneDNN's size rule, then im2col patches, else lax.conv.
    (Where libdnnl does not load, oneDNN's convolutions are lax.conv's: none of these cases
    falls back to another form.)"""
    if onednn.available() is not None:
        fallback = {"onednn": "xla", "onednn-blocked": "xla", "onednn-dwpatches": "xla"}
        form = {**fallback, "pointwise-dnn": "pointwise"}.get(form, form)
    assert EnginePolicy(**{"backend": "cpu", **fields}).conv_form(c) == form


def test_auto_leaves_onednn_off_in_a_multi_device_process(monkeypatch):
    monkeypatch.setattr(onednn, "available", lambda: None)
    monkeypatch.setattr(jax, "device_count", lambda *a: 2)
    assert EnginePolicy(backend="cpu").conv_form(conv()) == "xla"
    assert EnginePolicy(backend="cpu", conv="onednn").conv_form(conv()) == "onednn"


@pytest.mark.parametrize(
    "setting,backend,op,kernel,stride,expensive,form",
    [
        ("auto", "cpu", "max", (3, 3), (2, 2), False, "phases"),
        ("auto", "cpu", "ave", (3, 3), (2, 2), False, "phases"),
        ("auto", "cpu", "max", (3, 3), (2, 2), True, "phases-rw"),
        ("auto", "cpu", "ave", (3, 3), (2, 2), True, "phases-rw"),
        ("phases", "gpu", "max", (3, 3), (2, 2), False, "phases"),
        ("phases", "gpu", "ave", (3, 3), (2, 2), True, "phases-rw"),
        ("auto", "gpu", "max", (2, 2), (2, 2), False, "phases-rw"),  # per-offset selects
        ("auto", "gpu", "max", (3, 3), (2, 2), False, "xla"),
        ("auto", "gpu", "ave", (2, 2), (2, 2), False, "xla"),
        ("xla", "cpu", "max", (2, 2), (2, 2), True, "xla"),
        ("xla", "cpu", "ave", (3, 3), (2, 2), False, "xla"),
    ],
)
def test_pool_form(setting, backend, op, kernel, stride, expensive, form):
    engines = EnginePolicy(pool=setting, backend=backend)
    assert engines.pool_form(op, kernel, stride, expensive) == form


def test_the_backend_defaults_to_jaxs():
    assert EnginePolicy().on_cpu() == (jax.default_backend() == "cpu")
    assert EnginePolicy(backend="gpu").on_cpu() is False
