"""Weights packed once for forward-only programs (lowering/engines/packing.py, Model.packed,
pycaffe's Net.forward): the packed forward is the unpacked one bit for bit, under jax.jit, in
both layouts and for grouped/strided/dilated convolutions, and a weight is never served stale —
a new array, a numpy array a caller may write, and a pycaffe script writing
``net.params[...].data`` (held or not) all reach the next forward.

CPU-only, Linux x86-64 (the onednn-cpu-gomp wheel), as test_onednn.py."""

from __future__ import annotations

import dataclasses
import platform

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import caffe2jax as caffe
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.engines import packing
from caffe2jax.lowering.engines.policy import EnginePolicy
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted

if jax.default_backend() != "cpu":
    pytest.skip("the oneDNN path is CPU-only", allow_module_level=True)
if (platform.system(), platform.machine()) != ("Linux", "x86_64"):
    pytest.skip("onednn-cpu-gomp ships for Linux x86-64 only", allow_module_level=True)

NET = """
input: "x" input_shape { dim: 2 dim: 4 dim: 11 dim: 11 }
layer { name: "c1" type: "Convolution" bottom: "x" top: "y"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 1 }
                            bias_filler { type: "gaussian" std: 1 } } }
layer { name: "r1" type: "ReLU" bottom: "y" top: "y" }
layer { name: "c2" type: "Convolution" bottom: "y" top: "z"
        convolution_param { num_output: 6 kernel_size: 3 stride: 2 pad: 2 dilation: 2 group: 2
                            weight_filler { type: "gaussian" std: 1 } bias_term: false } }
"""
ALL_DNN = EnginePolicy(conv="onednn-all")


def _model(channels_last: bool, policy=ALL_DNN):
    model = compile_net(NET, policy=dataclasses.replace(policy, channels_last=channels_last))
    assert model.graph.engines == {"c1": "onednn", "c2": "onednn"} or policy is not ALL_DNN
    return model


@pytest.mark.parametrize("channels_last", [True, False])
def test_packed_forward_is_the_unpacked_one_under_jit(channels_last):
    model = _model(channels_last)
    params, state = model.init(0)
    x = np.random.default_rng(0).standard_normal((2, 4, 11, 11)).astype(np.float32)
    packed = model.packed(params)
    assert all(isinstance(packed[n][0], packing.PackedWeights) for n in ("c1", "c2"))
    assert packed["c1"][1] is params["c1"][1]  # the bias stays as it was
    raw = jitted.forward(model, params, state, {"x": x})[0]
    got = jax.jit(model.apply)(packed, state, {"x": x})[0]
    for blob in ("y", "z"):
        np.testing.assert_array_equal(np.asarray(got[blob]), np.asarray(raw[blob]))
    lax_model = _model(channels_last, EnginePolicy(conv="xla"))
    ref = jitted.forward(lax_model, params, state, {"x": x})[0]["z"]
    np.testing.assert_allclose(got["z"], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    program = str(jax.jit(model.apply).lower(packed, state, {"x": x}).as_text())
    assert program.count("caffe2jax_onednn_fwd_packed") == 2


def test_packed_forward_with_leading_batch_axes():
    """A Convolution with ``axis: 2``: the axes before the channels fold into oneDNN's N, as
    the lowering folds them, so the packed weights fit the primitive it runs."""
    text = NET.replace("dim: 2 dim: 4", "dim: 2 dim: 3 dim: 4").replace(
        "num_output: 8 kernel_size: 3 pad: 1", "num_output: 8 kernel_size: 3 pad: 1 axis: 2"
    )
    text = text[: text.index('layer { name: "c2"')]
    model = compile_net(text, policy=ALL_DNN)
    assert model.graph.engines == {"c1": "onednn"}
    params, state = model.init(0)
    x = np.random.default_rng(2).standard_normal((2, 3, 4, 11, 11)).astype(np.float32)
    packed = model.packed(params)
    assert isinstance(packed["c1"][0], packing.PackedWeights)
    raw = jitted.forward(model, params, state, {"x": x})[0]["y"]
    got = jax.jit(model.apply)(packed, state, {"x": x})[0]["y"]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(raw))


def test_a_convolution_with_the_weight_diff_as_patches_packs_as_onednn():
    """A ``onednn-dwpatches`` convolution (a small image; its weight diff as patches in a
    train step) runs oneDNN's forward: a forward-only program packs its weights all the same,
    and the packed forward is the unpacked one bit for bit."""
    text = NET[: NET.index('layer { name: "r1"')].replace("dim: 11 dim: 11", "dim: 5 dim: 6")
    policy = EnginePolicy(onednn_min_macs=1, dw_patches_min_depth=1)
    model = compile_net(text, policy=policy)
    assert model.graph.engines == {"c1": "onednn-dwpatches"}
    params, state = model.init(0)
    x = np.random.default_rng(3).standard_normal((2, 4, 5, 6)).astype(np.float32)
    packed = model.packed(params)
    assert isinstance(packed["c1"][0], packing.PackedWeights)
    raw = jitted.forward(model, params, state, {"x": x})[0]["y"]
    got = jax.jit(model.apply)(packed, state, {"x": x})[0]["y"]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(raw))


def test_packed_only_when_the_array_is_the_same_object():
    model = _model(True)
    params, _ = model.init(0)
    params = jax.tree.map(jnp.asarray, params)
    first = model.packed(params)
    assert model.packed(params)["c1"][0] is first["c1"][0]  # the same arrays: packed once
    changed = dict(params, c1=[params["c1"][0] * 2, params["c1"][1]])
    again = model.packed(changed)
    assert again["c1"][0] is not first["c1"][0]
    np.testing.assert_array_equal(np.asarray(again["c1"][0].data),
                                  2 * np.asarray(first["c1"][0].data))  # fmt: skip
    assert again["c2"][0] is first["c2"][0]
    host = dict(params, c1=[np.asarray(params["c1"][0]).copy(), params["c1"][1]])
    before = model.packed(host)["c1"][0]
    host["c1"][0][...] = 0  # written in place: a numpy array is packed on every call
    assert not np.asarray(model.packed(host)["c1"][0].data).any()
    assert np.asarray(before.data).any()


def test_a_packed_forward_exports_and_loads():
    """The start-up cache keeps pycaffe's forward as a jax.export serialization (allowing
    the oneDNN custom calls, runtime/host/startup_cache.py): a packed tree's structure
    serializes, and the loaded program gives the same top."""
    from caffe2jax.runtime.host import startup_cache  # noqa: F401 - NetState's serialization

    model = _model(True)
    params, state = model.init(0)
    packed = model.packed(params)
    x = np.random.default_rng(3).standard_normal((2, 4, 11, 11)).astype(np.float32)
    fn = jax.jit(lambda p, s, v: model.apply(p, s, {"x": v})[0]["z"])
    checks = [jax.export.DisabledSafetyCheck.custom_call("caffe2jax_onednn_fwd_packed")]
    data = jax.export.export(fn, disabled_checks=checks)(packed, state, x).serialize()
    loaded = jax.export.deserialize(bytearray(data))
    np.testing.assert_array_equal(np.asarray(loaded.call(packed, state, x)),
                                  np.asarray(fn(packed, state, x)))  # fmt: skip


def test_the_policy_turns_packing_off():
    off = dataclasses.replace(ALL_DNN, packed_weights=False)
    params, _ = _model(True, off).init(0)
    assert _model(True, off).packed(params) is params


def test_packed_weights_refuse_another_geometry():
    params, _ = _model(True).init(0)
    packed = _model(True).packed(params)
    other = compile_net(NET.replace("dim: 11 dim: 11", "dim: 13 dim: 13"), policy=ALL_DNN)
    _, state = other.init(0)
    x = np.zeros((2, 4, 13, 13), np.float32)
    with pytest.raises(NetError, match="layer 'c1'.*were packed for the convolution"):
        jax.jit(other.apply)(packed, state, {"x": x})


def test_pycaffe_forward_sees_weights_a_script_writes(tmp_path, monkeypatch):
    """Net.forward packs the weights; writing net.params[...].data (through a held array
    or not) changes the next forward's result to the new weights' (the lax convolution's
    result on them, 1e-5)."""
    monkeypatch.setenv("CAFFE2JAX_CPU_CONV", "onednn-all")
    calls, pack = [], packing.Packer.__call__
    monkeypatch.setattr(
        packing.Packer,
        "__call__",
        lambda self, params: calls.append(pack(self, params)) or calls[-1],
    )
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    net = caffe.Net(str(path), caffe.TEST, seed=0)
    rng = np.random.default_rng(1)
    net.blobs["x"].data[...] = rng.standard_normal((2, 4, 11, 11)).astype(np.float32)
    reference = _model(True, EnginePolicy(conv="xla"))

    def expected():
        params = {n: [b.data.copy() for b in net.params[n]] for n in ("c1", "c2")}
        return np.asarray(reference.apply(params, {}, {"x": net.blobs["x"].data})[0]["z"])

    def check():
        z = net.forward()["z"].copy()
        np.testing.assert_allclose(z, expected(), rtol=1e-5, atol=1e-5 * np.abs(z).max())
        return z

    first = check()
    # the forwards ran packed (c1 with its ReLU fused: lowering/engines/folding.py)
    assert calls and all(isinstance(getattr(t[n][0], "weights", t[n][0]), packing.PackedWeights)
                         for t in calls for n in ("c1", "c2"))  # fmt: skip
    net.params["c2"][0].data[...] = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    second = check()
    assert not np.allclose(first, second)
    held = net.params["c1"][0].data
    held *= -1  # a script's own handle, written in place after a forward
    third = check()
    assert not np.allclose(second, third)
    held[...] = 0
    check()
