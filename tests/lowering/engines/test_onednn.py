"""The oneDNN convolution path (lowering/engines/onednn.py; engine policy ``conv``,
CAFFE2JAX_CPU_CONV) changes no result beyond float rounding.

Every golden per-layer 2-D Convolution case runs with the path on and is checked against real
Caffe (as tests/lowering/test_golden_layers.py does) and against the path off; the golden nets
run on and off from the same weights and inputs, channels-last and NCHW: every blob, the loss
and every param gradient agree to ≤ 1e-5 of each array's largest magnitude. Each test also
checks that the traced program really calls oneDNN.

oneDNN (the ``onednn-cpu-gomp`` wheel) is in the ``dev`` extra on Linux x86-64, so there a
missing library fails these tests; elsewhere (no such wheel) they skip.
"""

from __future__ import annotations

import platform

import jax
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.engines import onednn, policy
from caffe2jax.lowering.engines.policy import ConvShape, EnginePolicy, PolicyError
from caffe2jax.lowering.model import Model
from caffe2jax.runtime.formats.weights import load_weights
from tests import jitted
from tests.golden import GOLDEN, load_npz, require
from tests.lowering.test_golden_layers import rel_err
from tests.lowering.test_layout import GOLDEN_NETS, _data_shape, close, golden_inputs

jax.config.update("jax_default_matmul_precision", "highest")

if jax.default_backend() != "cpu":
    pytest.skip("the oneDNN path is CPU-only", allow_module_level=True)
if (platform.system(), platform.machine()) != ("Linux", "x86_64"):
    pytest.skip("onednn-cpu-gomp ships for Linux x86-64 only", allow_module_level=True)

LAYERS = require(GOLDEN / "layers")
NETS = require(GOLDEN / "nets")
CONV_CASES = sorted(
    p.stem for p in LAYERS.glob("conv*.npz") if load_npz(p)[1]["type"] == "Convolution"
)


def path(on: bool, **fields) -> EnginePolicy:
    """The policy with the path on for every conv, whatever its size, or off."""
    return EnginePolicy(conv="onednn-all" if on else "xla", **fields)


def takes_onednn(engines: EnginePolicy, w_shape, macs: int) -> bool:
    """Whether ``engines`` puts a 2-D float32 NCHW convolution with weights ``w_shape`` and
    ``macs`` forward multiply-adds on oneDNN."""
    conv = ConvShape((1, w_shape[1], 5, 5), w_shape, (0, 0), 1, macs, np.float32, False)
    return engines.conv_form(conv) == "onednn"


def calls_onednn(fn, *args) -> bool:
    return "caffe2jax_onednn_fwd" in str(jax.make_jaxpr(fn)(*args))


def test_library_loads():
    assert onednn.available() is None, onednn.available()


@pytest.mark.parametrize("case", CONV_CASES)
def test_golden_convolution_case(case):
    """Caffe's forward, bottom diff and weight/bias diffs, with oneDNN; and equal to XLA's."""
    arrays, meta = load_npz(LAYERS / f"{case}.npz")
    models = {on: caffe2jax.compile(str(arrays["prototxt"]), phase=meta["phase"], policy=path(on))
              for on in (True, False)}  # fmt: skip
    params, state = models[True].init(0)
    for i in range(len(meta["params"])):
        params["layer"][i] = np.asarray(arrays[f"param__{i}"])
    inputs = {n: arrays[f"in__{n}"] for n in models[True].inputs}
    tops = [t["name"] for t in meta["tops"]]
    cotangents = [np.asarray(arrays[f"topdiff__{t}"], np.float32) for t in tops]

    results = {}
    for on, model in models.items():

        def forward(params, inputs, model=model):
            blobs, _ = jitted.forward(model, params, state, inputs, jax.random.key(0))
            return [blobs[t] for t in tops]

        two_d = len(next(iter(inputs.values())).shape) == 4
        assert calls_onednn(forward, params, inputs) == (on and two_d), case
        assert (model.graph.engines["layer"] == "onednn") == (on and two_d), case
        outs, vjp = jax.vjp(forward, params, inputs)
        results[on] = outs, *vjp(cotangents)
    outs, grad_params, grad_inputs = results[True]
    for top, out in zip(tops, outs):
        assert rel_err(out, arrays[f"out__{top}"]) <= 1e-5, f"forward top '{top}'"
    for name in grad_inputs:
        if f"grad__{name}" in arrays:
            assert rel_err(grad_inputs[name], arrays[f"grad__{name}"]) <= 1e-5, name
    for i in range(len(meta["params"])):
        if f"paramgrad__{i}" in arrays:
            assert rel_err(grad_params["layer"][i], arrays[f"paramgrad__{i}"]) <= 1e-5, i
    for (p, a), b in zip(
        jax.tree_util.tree_leaves_with_path(results[True]), jax.tree.leaves(results[False])
    ):
        close(a, b, f"on vs off {jax.tree_util.keystr(p)}")


@pytest.mark.parametrize("channels_last", [True, False], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("case", GOLDEN_NETS)
def test_golden_net_same_with_onednn(case, channels_last):
    phase = "TRAIN" if case.endswith("train") else "TEST"
    net = load_net(NETS / f"{case}.prototxt", phase)
    batch = 4
    shapes = None if phase == "TEST" else {"data": (batch, *_data_shape(case)), "label": (batch,)}
    source = Model(net, shapes)
    models = {on: Model(source.net, source.inputs, policy=path(on, channels_last=channels_last))
              for on in (True, False)}  # fmt: skip
    params, state = load_weights(NETS / f"{case}.caffemodel", models[True])
    inputs = golden_inputs(models[True])
    key = jax.random.key(3)
    results = {}
    for on, model in models.items():

        def loss(p, model=model):
            return model.loss(p, state, inputs, key)

        assert calls_onednn(loss, params) == on
        results[on] = jax.value_and_grad(loss, has_aux=True)(params)
    (loss_on, (blobs_on, _)), g_on = results[True]
    (loss_off, (blobs_off, _)), g_off = results[False]
    close(loss_on, loss_off, "loss")
    assert blobs_on.keys() == blobs_off.keys()
    for name in blobs_off:
        close(blobs_on[name], blobs_off[name], name)
    for (p, a), b in zip(jax.tree_util.tree_leaves_with_path(g_on), jax.tree.leaves(g_off)):
        close(a, b, f"grad {jax.tree_util.keystr(p)}")


def test_jitted_train_step_uses_onednn_backward():
    """Under jit the backward is oneDNN's backward-data and backward-weights primitives."""
    x = np.random.default_rng(2).standard_normal((3, 7, 9, 4)).astype(np.float32)
    w = np.random.default_rng(3).standard_normal((6, 2, 3, 3)).astype(np.float32)

    def f(x, w):
        y = onednn.convolution(x, w, (2, 1), (1, 2), (1, 2), 2, channels_last=True)
        return (y * y).sum()

    def g(x, w):
        y = jax.lax.conv_general_dilated(
            x, w, (2, 1), [(1, 1), (2, 2)], rhs_dilation=(1, 2), feature_group_count=2,
            dimension_numbers=("NHWC", "OIHW", "NHWC"),
        )  # fmt: skip
        return (y * y).sum()

    text = jax.jit(jax.grad(f, (0, 1))).lower(x, w).as_text()
    assert "caffe2jax_onednn_bwd_data" in text and "caffe2jax_onednn_bwd_weights" in text
    for a, b in zip(jax.jit(jax.grad(f, (0, 1)))(x, w), jax.grad(g, (0, 1))(x, w)):
        close(a, b, "grad")


def test_depthwise_forward_and_backward_match_xla():
    """Depthwise convolutions (group = channels) take oneDNN under ``auto`` at any size
    (lowering/engines/policy.py): its forward and both gradients equal lax's grouped conv."""
    x = np.random.default_rng(6).standard_normal((2, 9, 11, 8)).astype(np.float32)
    w = np.random.default_rng(7).standard_normal((8, 1, 3, 3)).astype(np.float32)

    def f(x, w):
        return onednn.convolution(x, w, (2, 2), (1, 1), (1, 1), 8, channels_last=True)

    def g(x, w):
        return jax.lax.conv_general_dilated(
            x, w, (2, 2), [(1, 1), (1, 1)], feature_group_count=8,
            dimension_numbers=("NHWC", "OIHW", "NHWC"),
        )  # fmt: skip

    close(jax.jit(f)(x, w), g(x, w), "forward")
    grads = [jax.grad(lambda x, w, h=h: (h(x, w) ** 2).sum(), (0, 1)) for h in (f, g)]
    for a, b in zip(jax.jit(grads[0])(x, w), grads[1](x, w)):
        close(a, b, "grad")


def test_missing_library_falls_back_with_a_warning(monkeypatch):
    monkeypatch.setattr(onednn, "available", lambda: "no libdnnl here")
    monkeypatch.setenv(policy.CONV_ENV, "onednn")
    policy._warn_once.cache_clear()
    with pytest.warns(RuntimeWarning, match="no libdnnl here; convolving with XLA instead"):
        assert not takes_onednn(EnginePolicy.from_env(), (3, 2, 3, 3), 10**9)


def test_a_failed_call_gives_nan_not_a_wrong_number(monkeypatch, capfd):
    """A oneDNN failure inside the compiled program cannot raise through XLA: the result is
    NaN (so the loss is) and stderr says why."""
    x = np.random.default_rng(4).standard_normal((2, 3, 5, 5)).astype(np.float32)
    w = np.random.default_rng(5).standard_normal((4, 3, 3, 3)).astype(np.float32)

    def boom(self, kind, out, ins):
        raise MemoryError("scratch allocation failed")

    f = jax.jit(lambda x, w: onednn.convolution(x, w, (1, 1), (1, 1), (1, 1), 1, False))
    assert np.isfinite(np.asarray(f(x, w))).all()
    monkeypatch.setattr(onednn._Conv, "run", boom)
    y = np.asarray(f(x + 1, w))
    assert y.shape == (2, 4, 5, 5) and np.isnan(y).all()
    assert "oneDNN fwd convolution failed, its result is NaN" in capfd.readouterr().err


def test_size_rule_keeps_small_and_single_channel_convolutions_on_xla(monkeypatch):
    """``onednn`` takes only the convolutions it measured ahead on; ``onednn-all`` takes all."""
    monkeypatch.setenv(policy.CONV_ENV, "onednn")
    engines = EnginePolicy.from_env()
    min_macs = engines.onednn_min_macs
    assert min_macs == 16_000_000
    assert takes_onednn(engines, (3, 2, 3, 3), min_macs)
    assert not takes_onednn(engines, (3, 2, 3, 3), min_macs - 1)
    assert not takes_onednn(engines, (3, 1, 3, 3), 10**9)  # 1 channel/group
    monkeypatch.setenv(policy.CONV_ENV, "onednn-all")
    assert takes_onednn(EnginePolicy.from_env(), (3, 1, 3, 3), 1)
    # the size rule is a field of the policy: a smaller one takes smaller convolutions
    assert takes_onednn(EnginePolicy(conv="onednn", onednn_min_macs=10), (3, 2, 3, 3), 10)


def test_net_under_the_size_rule_routes_by_size(monkeypatch):
    """On CIFAR-10 quick at batch 100 every convolution has ≥ 16M multiply-adds: all go to
    oneDNN; at batch 1 none does."""
    from caffe2jax.lowering.model import compile as compile_net
    from tests.golden import MODELS, require

    monkeypatch.setenv(policy.CONV_ENV, "onednn")  # read when each net is compiled
    quick = require(MODELS / "examples/cifar10/cifar10_quick.prototxt")
    for batch, expected in ((100, 3), (1, 0)):
        model = compile_net(quick, "TEST", input_shapes={"data": (batch, 3, 32, 32)})
        params, state = model.init(0)
        x = np.zeros((batch, 3, 32, 32), np.float32)
        apply = jax.jit(lambda p, v, m=model, s=state: jitted.forward(m, p, s, {"data": v})[0])
        text = apply.lower(params, x).as_text()
        assert text.count("caffe2jax_onednn_fwd") == expected, batch


def test_default_is_the_size_rule_on_one_device_and_silent_without_the_library(monkeypatch):
    """Unset (``auto``): the size rule where libdnnl loads; XLA, without a warning, where it
    does not or where the process sees several devices (a sharded program would gather the
    whole batch for the foreign call); ``xla`` turns it off; a typo is refused by name."""
    import warnings

    w = (3, 2, 3, 3)
    monkeypatch.delenv(policy.CONV_ENV, raising=False)
    engines = EnginePolicy.from_env()
    assert engines.conv == "auto" and engines == EnginePolicy()
    min_macs = engines.onednn_min_macs
    assert takes_onednn(engines, w, min_macs)
    assert not takes_onednn(engines, w, min_macs - 1)
    monkeypatch.setattr(jax, "device_count", lambda *a: 4)
    assert not takes_onednn(engines, w, min_macs)
    monkeypatch.setenv(policy.CONV_ENV, "onednn")  # asked for by name: used on every device count
    assert takes_onednn(EnginePolicy.from_env(), w, min_macs)
    monkeypatch.undo()
    monkeypatch.setenv(policy.CONV_ENV, "xla")
    assert not takes_onednn(EnginePolicy.from_env(), w, 10**9)
    monkeypatch.delenv(policy.CONV_ENV)
    monkeypatch.setattr(onednn, "available", lambda: "no libdnnl here")
    policy._warn_once.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not takes_onednn(EnginePolicy.from_env(), w, 10**9)
    monkeypatch.setenv(policy.CONV_ENV, "onedn")
    with pytest.raises(PolicyError, match="CAFFE2JAX_CPU_CONV='onedn': use one of auto, onednn"):
        EnginePolicy.from_env()


def test_the_installed_package_has_the_library():
    """oneDNN is a dependency on Linux x86-64, so the default path is what users get there."""
    assert onednn.available() is None


def test_forward_mode_autodiff_needs_the_xla_setting(monkeypatch):
    """The oneDNN path is a custom VJP: jax.jvp refuses it by name; with
    CAFFE2JAX_CPU_CONV=xla (README) the same convolution differentiates forward."""
    x = np.random.default_rng(6).standard_normal((2, 3, 6, 6)).astype(np.float32)
    w = np.random.default_rng(7).standard_normal((4, 3, 3, 3)).astype(np.float32)
    text = """
force_backward: true
input: "x" input_shape { dim: 2 dim: 3 dim: 6 dim: 6 }
layer { name: "c" type: "Convolution" bottom: "x" top: "y"
        convolution_param { num_output: 4 kernel_size: 3 } }
"""
    for setting in ("onednn-all", "xla"):
        monkeypatch.setenv(policy.CONV_ENV, setting)  # read when the net is compiled
        model = caffe2jax.compile(text)
        params, state = model.init(0)
        params["c"] = [w, np.zeros(4, np.float32)]

        def f(x, model=model, params=params, state=state):
            return jitted.forward(model, params, state, {"x": x})[0]["y"]

        if setting == "onednn-all":
            with pytest.raises(TypeError, match="custom_vjp"):
                jax.jvp(f, (x,), (x,))
        else:
            y, tangent = jax.jvp(f, (x,), (x,))
            np.testing.assert_allclose(tangent, y, rtol=1e-5, atol=1e-5)  # linear in x, no bias
