"""BatchNorm and Scale folded into the Convolution before them for forward-only programs
(lowering/engines/folding.py, ``Model.packed(params, state)``, pycaffe's whole-net
``Net.forward``): the folded forward, under jax.jit, equals the unfolded one within 1e-5 of the
top's largest value (float32 rounding: the fold is computed in float64 and rounded once, where
the unfolded net rounds after the convolution, the BatchNorm and the Scale), in both layouts,
on oneDNN (packed) and XLA's convolutions, with and without the convolution's and the Scale's
biases; chains a user could tell apart are left alone; nothing is served stale."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import caffe2jax as caffe
from caffe2jax.lowering.engines import folding, fused, packing
from caffe2jax.lowering.engines.policy import EnginePolicy
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted

CHAIN = """
layer { name: "c1" type: "Convolution" bottom: "x" top: "y"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 CONV_BIAS
                            weight_filler { type: "gaussian" std: 1 }
                            bias_filler { type: "gaussian" std: 1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "y" top: "y" BNPARAM }
layer { name: "sc" type: "Scale" bottom: "y" top: "y"
        scale_param { SCALE_TERM filler { type: "gaussian" std: 1 }
                      bias_filler { type: "gaussian" std: 1 } } }
layer { name: "r1" type: "ReLU" bottom: "y" top: "y" }
layer { name: "c2" type: "Convolution" bottom: "y" top: "z"
        convolution_param { num_output: 6 kernel_size: 1 weight_filler { type: "xavier" } } }
"""
NET = 'input: "x" input_shape { dim: 2 dim: 4 dim: 9 dim: 9 }' + CHAIN


def _text(bias=True, scale_bias=True, bn=""):
    return (NET.replace("CONV_BIAS", "" if bias else "bias_term: false")
            .replace("SCALE_TERM", "bias_term: true" if scale_bias else "")
            .replace("BNPARAM", bn))  # fmt: skip


def _statistics(model, state, seed=1):
    """BatchNorm blobs of a trained net: mean sums, positive variance sums, a factor ≠ 1."""
    rng = np.random.default_rng(seed)
    c = state["bn"][0].shape
    factor = np.float32(3.0)
    state["bn"] = [jnp.asarray(rng.standard_normal(c).astype(np.float32) * factor),
                   jnp.asarray(rng.uniform(0.2, 2, c).astype(np.float32) * factor),
                   jnp.asarray(np.full(1, factor, np.float32))]  # fmt: skip
    return state


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize(
    "policy",
    [
        EnginePolicy(fold_batchnorm=True, conv="onednn-all"),
        EnginePolicy(fold_batchnorm=True, conv="onednn-all", onednn_post_ops=True),
        EnginePolicy(
            fold_batchnorm=True, conv="onednn-all", channels_last=False, onednn_post_ops=True
        ),
        EnginePolicy(fold_batchnorm=True, conv="xla"),
    ],  # fmt: skip
    ids=["onednn-nhwc", "post-ops-nhwc", "post-ops-nchw", "xla"],
)
@pytest.mark.parametrize("bias,scale_bias", [(True, True), (False, False)])
def test_folded_forward_is_the_unfolded_one_under_jit(policy, bias, scale_bias):
    model = compile_net(_text(bias, scale_bias), policy=policy)
    params, state = model.init(0)
    params = jax.tree.map(jnp.asarray, params)
    state = _statistics(model, state)
    x = np.random.default_rng(0).standard_normal((2, 4, 9, 9)).astype(np.float32)
    folded = model.packed(params, state)
    assert all(folding.skipped(folded[n]) for n in ("bn", "sc", "r1"))
    conv = folded["c1"][0]
    assert isinstance(conv, folding.Folded) and conv.relu == 0.0 and conv.bias is not None
    assert len(folded["c1"]) == 1 + bias and (not bias or folding.skipped(folded["c1"][1]))
    dnn = policy.conv == "onednn-all"
    assert isinstance(conv.weights, packing.PackedWeights) == dnn
    assert not dnn or fused.is_fused(conv.weights.key) == policy.onednn_post_ops
    raw = jitted.forward(model, params, state, {"x": x})[0]
    got = jax.jit(model.apply)(folded, state, {"x": x})[0]
    for blob in ("y", "z"):
        _close(np.asarray(got[blob]), np.asarray(raw[blob]))
    assert model.packed(params, state)["c1"][0].weights is conv.weights  # folded, packed once


@pytest.mark.parametrize("slope", [0.0, 0.25])
@pytest.mark.parametrize("channels_last", [True, False])
def test_convolution_and_relu_fused_under_jit(slope, channels_last):
    """Convolution → ReLU (GoogLeNet's): the bias and the ReLU (leaky too) inside the oneDNN
    primitive, equal to the unfused forward within 1e-5 of the top's largest value."""
    text = _text().replace("BNPARAM", "")
    head, _, tail = text.partition('layer { name: "bn"')
    text = head + tail[tail.index('layer { name: "r1"') :]
    text = text.replace('top: "y" }', f'top: "y" relu_param {{ negative_slope: {slope} }} }}')
    policy = EnginePolicy(
        fold_batchnorm=True, conv="onednn-all", channels_last=channels_last, onednn_post_ops=True
    )
    model = compile_net(text, policy=policy)
    params, state = model.init(0)
    assert folding.chains(model.net, model.graph.shared) == [("c1", None, None, "r1")]
    folded = model.packed(params, state)
    assert folded["c1"][0].relu == slope and fused.is_fused(folded["c1"][0].weights.key)
    x = np.random.default_rng(0).standard_normal((2, 4, 9, 9)).astype(np.float32)
    raw = jitted.forward(model, params, state, {"x": x})[0]
    got = jax.jit(model.apply)(folded, state, {"x": x})[0]
    for blob in ("y", "z"):
        _close(np.asarray(got[blob]), np.asarray(raw[blob]))
    assert (np.asarray(got["y"]) < 0).any() == (slope > 0)


def test_folded_program_runs_no_batchnorm():
    """The folded program has no square root (BatchNorm's): c1, its BatchNorm, Scale, bias
    and ReLU are one oneDNN call."""
    model = compile_net(
        _text(), policy=EnginePolicy(fold_batchnorm=True, conv="onednn-all", onednn_post_ops=True)
    )
    params, state = model.init(0)
    folded = model.packed(params, _statistics(model, state))
    x = np.zeros((2, 4, 9, 9), np.float32)
    text = jax.jit(model.apply).lower(folded, state, {"x": x}).as_text()
    assert "sqrt" not in text and "rsqrt" not in text
    assert text.count("caffe2jax_onednn_fused") == 1  # c1 with its bias and ReLU
    assert text.count("caffe2jax_onednn_fwd_packed") == 1  # c2, alone
    unfolded = jax.jit(model.apply).lower(model.packed(params), state, {"x": x}).as_text()
    assert "sqrt" in unfolded  # the check above can see a BatchNorm


def _bn_not_in_place(text: str) -> str:
    """The BatchNorm writes a blob of its own, which the rest of the net reads."""
    head, line, tail = text.partition('bottom: "y" top: "y" BNPARAM')
    return head + 'bottom: "y" top: "yb"' + tail.replace('"y"', '"yb"')


@pytest.mark.parametrize(
    "change",
    [
        _bn_not_in_place,
        lambda t: t.replace("BNPARAM", "batch_norm_param { use_global_stats: false }"),
        lambda t: t.replace(
            'layer { name: "bn"',
            'layer { name: "peek" type: "Power" bottom: "y" top: "p" }\nlayer { name: "bn"',
        ),
        lambda t: t.replace("SCALE_TERM", "axis: 0 num_axes: 2"),
    ],
    ids=["bn-not-in-place", "batch-statistics", "conv-top-read-elsewhere", "scale-on-axes-0-1"],
)
def test_chains_a_user_could_tell_apart_stay(change):
    text = change(NET).replace("BNPARAM", "").replace("SCALE_TERM", "bias_term: true")
    model = compile_net(text.replace("CONV_BIAS", ""))
    assert folding.chains(model.net, model.graph.shared) == []


def test_the_policy_turns_folding_off():
    off = EnginePolicy(conv="xla", fold_batchnorm=False)
    model = compile_net(_text(), policy=off)
    params, state = model.init(0)
    assert model.packed(params, state) is params
    on = compile_net(_text(), policy=dataclasses.replace(off, fold_batchnorm=True))
    assert folding.skipped(on.packed(params, state)["bn"])
    assert on.packed(params) is params  # no state given: nothing folds (a partial forward)


def test_folded_again_whenever_an_array_changes():
    model = compile_net(_text(), policy=EnginePolicy(fold_batchnorm=True, conv="xla"))
    params, state = model.init(0)
    params, state = jax.tree.map(jnp.asarray, params), _statistics(model, state)
    first = model.packed(params, state)["c1"]
    state = dict(state, bn=[state["bn"][0] + 1, *state["bn"][1:]])
    moved = model.packed(params, state)["c1"]
    assert moved[0] is not first[0]
    k = np.asarray(params["sc"][0]) / np.sqrt(np.asarray(state["bn"][1]) / 3 + 1e-5)
    np.testing.assert_allclose(
        np.asarray(first[0].bias) - np.asarray(moved[0].bias), k / 3, rtol=1e-5
    )
    host = dict(params, sc=[np.asarray(a).copy() for a in params["sc"]])
    before = model.packed(host, state)["c1"][0].bias
    host["sc"][1][...] += 5  # a numpy array written in place: folded on every call
    np.testing.assert_allclose(model.packed(host, state)["c1"][0].bias, np.asarray(before) + 5,
                               rtol=1e-6)  # fmt: skip


def test_pycaffe_forward_sees_what_a_script_writes(tmp_path, monkeypatch):
    """pycaffe's whole-net Net.forward folds the chain; writing net.params[...].data — the
    convolution's weights, the BatchNorm's statistics, the Scale's blobs, through a held array
    or not — changes the next forward to the unfolded net's result on the new values (1e-5);
    a forward that ends inside the chain does not fold (its top is the convolution's)."""
    monkeypatch.setenv("CAFFE2JAX_CPU_CONV", "onednn-all")
    from_env = EnginePolicy.from_env.__func__  # folding is off by default (policy.py): on here
    folded = classmethod(lambda cls, *a, **k: from_env(cls, *a, **{"fold_batchnorm": True, **k}))
    monkeypatch.setattr(EnginePolicy, "from_env", folded)
    calls, fold = [], folding.Folder.__call__
    monkeypatch.setattr(folding.Folder, "__call__",
                        lambda self, p, s: calls.append(fold(self, p, s)) or calls[-1])  # fmt: skip
    path = tmp_path / "net.prototxt"
    path.write_text(_text())
    net = caffe.Net(str(path), caffe.TEST, seed=0)
    rng = np.random.default_rng(1)
    net.blobs["x"].data[...] = rng.standard_normal((2, 4, 9, 9)).astype(np.float32)
    net.params["bn"][1].data[...] = rng.uniform(0.5, 2, 8).astype(np.float32)
    net.params["bn"][2].data[...] = 1
    reference = compile_net(_text(), policy=EnginePolicy(conv="xla"))

    def check():
        blobs = {n: [b.data.copy() for b in net.params[n]] for n in ("c1", "sc", "c2")}
        state = {"bn": [b.data.copy() for b in net.params["bn"]]}
        want = reference.apply(blobs, state, {"x": net.blobs["x"].data})[0]["z"]
        z = net.forward()["z"].copy()
        _close(z, np.asarray(want))
        return z

    results = [check()]
    assert calls and folding.skipped(calls[-1]["bn"])  # the forward ran folded
    p = net.params
    writes = [
        lambda: p["c1"][0].data.__imul__(-1),
        lambda: p["bn"][0].data.__iadd__(1),
        lambda: p["bn"][1].data.__imul__(4),
        lambda: p["bn"][2].data.__imul__(2),
        lambda: p["sc"][0].data.__imul__(-2),
        lambda: p["sc"][1].data.__iadd__(3),
    ]
    for write in writes:
        write()
        results.append(check())
        assert not np.allclose(results[-2], results[-1])
    held = net.params["sc"][0].data
    held[...] = 0  # a script's own handle, written in place after a forward
    check()
    calls.clear()
    top = net.forward(end="bn")["y"]  # the BatchNorm's top, the Scale not yet run: unfolded
    assert not calls
    blobs = {n: [b.data for b in net.params[n]] for n in ("c1", "sc", "c2")}
    state = {"bn": [b.data for b in net.params["bn"]]}
    want = reference.apply(blobs, state, {"x": net.blobs["x"].data})[0]["y@bn"]
    _close(top, np.asarray(want))


def test_a_folded_forward_exports_and_loads():
    """The start-up cache keeps pycaffe's forward as a jax.export serialization: a folded
    tree's structure serializes, and the loaded program gives the same top."""
    from caffe2jax.runtime.host import startup_cache  # noqa: F401 - NetState's serialization

    policy = EnginePolicy(fold_batchnorm=True, conv="onednn-all", onednn_post_ops=True)
    model = compile_net(_text(bias=False), policy=policy)
    params, state = model.init(0)
    folded = model.packed(params, _statistics(model, state))
    x = np.random.default_rng(3).standard_normal((2, 4, 9, 9)).astype(np.float32)
    fn = jax.jit(lambda p, s, v: model.apply(p, s, {"x": v})[0]["z"])
    checks = [jax.export.DisabledSafetyCheck.custom_call(f"caffe2jax_onednn_{kind}")
              for kind in ("fwd_packed", "fused")]  # fmt: skip
    data = jax.export.export(fn, disabled_checks=checks)(folded, state, x).serialize()
    loaded = jax.export.deserialize(bytearray(data))
    np.testing.assert_array_equal(np.asarray(loaded.call(folded, state, x)),
                                  np.asarray(fn(folded, state, x)))  # fmt: skip
