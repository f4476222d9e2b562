"""lowering/forks/user.py: caffe2jax.register_layer, a fork's layer brought by its user."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.forks import user as user_layers
from caffe2jax.lowering.registry import lowering_of, registered_types

jax.config.update("jax_default_matmul_precision", "highest")

PROTO = """syntax = "proto2";
package caffe;
message FillerParameter {
  optional string type = 1 [default = 'constant'];
  optional float value = 2 [default = 0];
}
message ChannelScaleParameter {
  optional FillerParameter scale_filler = 1;
  optional float shift = 2 [default = 0];
}
message LayerParameter {
  optional string name = 1;
  optional string type = 2;
  repeated string bottom = 3;
  repeated string top = 4;
  optional ChannelScaleParameter channel_scale_param = 5000;
}
"""

NET = """name: "n"
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 4 dim: 5 } } }
layer { name: "cs" type: "ChannelScale" bottom: "x" top: "y"
  channel_scale_param { scale_filler { type: "constant" value: 2 } shift: 0.25 } }
"""
LOSS = """layer { name: "t" type: "Input" top: "t"
  input_param { shape { dim: 2 dim: 3 dim: 4 dim: 5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }
"""


def channel_scale(bottoms, params, layer_param, ctx):
    """y = x * scale[c] + bias[c] + shift (a fork layer made up for the test)."""
    (x,) = bottoms
    scale, bias = params
    shift = layer_param.channel_scale_param.shift
    return [x * scale[None, :, None, None] + bias[None, :, None, None] + shift]


def shapes(layer_param, bottom_shapes):
    c = bottom_shapes[0][1]
    p = layer_param.channel_scale_param
    return [((c,), p.scale_filler), ((c,), {"type": "constant", "value": 0.5})]


@pytest.fixture
def fork(tmp_path):
    path = tmp_path / "caffe.proto"
    path.write_text(PROTO)
    yield str(path)
    user_layers.unregister_layer("ChannelScale")


def _loop(x, scale, bias, shift):
    """The forward as a loop over (n, c, h, w), as a fork's Forward_cpu would write it."""
    out = np.empty_like(x)
    for n, c, h, w in np.ndindex(*x.shape):
        out[n, c, h, w] = x[n, c, h, w] * scale[c] + bias[c] + shift
    return out


def test_forward_jitted_and_fillers(fork):
    caffe2jax.register_layer("ChannelScale", channel_scale, param_shapes=shapes)
    model = caffe2jax.compile(NET, dialect=fork)
    params, state = model.init(jax.random.key(0))
    np.testing.assert_array_equal(params["cs"][0], [2, 2, 2])
    np.testing.assert_array_equal(params["cs"][1], [0.5, 0.5, 0.5])
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 5)).astype(np.float32)
    p = {"cs": [jnp.asarray([1.0, -2.0, 3.0]), jnp.asarray([0.1, 0.2, 0.3])]}
    blobs, _ = jax.jit(lambda p, x: model.apply(p, state, {"x": x}))(p, x)
    want = _loop(x, [1.0, -2.0, 3.0], [0.1, 0.2, 0.3], 0.25)
    np.testing.assert_allclose(blobs["y"], want, rtol=1e-6, atol=1e-6)


def test_gradients_inside_value_and_grad(fork):
    caffe2jax.register_layer("ChannelScale", channel_scale, param_shapes=shapes)
    model = caffe2jax.compile(NET + LOSS, phase="TRAIN", dialect=fork)
    params, state = model.init(jax.random.key(0))
    rng = np.random.default_rng(1)
    x, t = (rng.normal(size=(2, 3, 4, 5)).astype(np.float32) for _ in range(2))

    def loss(p):
        return model.apply(p, state, {"x": x, "t": t})[0]["loss"]

    value, gp = jax.jit(jax.value_and_grad(loss))(params)
    # EuclideanLoss's diff (y - t) / N, then Caffe's backward of y = x * s[c] + b[c] + shift:
    # ds[c] = sum(dy * x), db[c] = sum(dy)
    dy = (_loop(x, [2.0] * 3, [0.5] * 3, 0.25) - t) / 2
    np.testing.assert_allclose(value, (dy**2).sum(), rtol=1e-5)
    np.testing.assert_allclose(gp["cs"][0], (dy * x).sum(axis=(0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(gp["cs"][1], dy.sum(axis=(0, 2, 3)), rtol=1e-5)


def test_backward_replaces_jax_gradient(fork):
    def backward(bottoms, params, layer_param, ctx, tops, top_diffs):
        (dy,) = top_diffs
        return [dy * 10.0], [jnp.full_like(params[0], 7.0), jnp.zeros_like(params[1])]

    caffe2jax.register_layer("ChannelScale", channel_scale, param_shapes=shapes,
                             backward=backward)  # fmt: skip
    model = caffe2jax.compile(NET + LOSS, phase="TRAIN", dialect=fork)
    params, state = model.init(jax.random.key(0))
    inputs = {"x": jnp.ones((2, 3, 4, 5)), "t": jnp.zeros((2, 3, 4, 5))}
    gp = jax.jit(jax.grad(lambda p: model.apply(p, state, inputs)[0]["loss"]))(params)
    np.testing.assert_array_equal(gp["cs"][0], 7.0)
    np.testing.assert_array_equal(gp["cs"][1], 0.0)


def test_weights_save_and_load_through_caffemodel(fork, tmp_path):
    caffe2jax.register_layer("ChannelScale", channel_scale, param_shapes=shapes)
    model = caffe2jax.compile(NET, dialect=fork)
    params, state = model.init(jax.random.key(0))
    params["cs"] = [jnp.asarray([1.5, 2.5, 3.5]), jnp.asarray([-1.0, 0.0, 1.0])]
    path = tmp_path / "w.caffemodel"
    caffe2jax.save_weights(path, model, params, state)
    again = caffe2jax.compile(NET, dialect=fork)
    loaded, _ = caffe2jax.load_weights(path, again)
    np.testing.assert_array_equal(loaded["cs"][0], [1.5, 2.5, 3.5])
    np.testing.assert_array_equal(loaded["cs"][1], [-1.0, 0.0, 1.0])


def test_registered_again_replaces_and_a_built_in_is_replaced_with_a_warning(fork):
    caffe2jax.register_layer("ChannelScale", channel_scale, param_shapes=shapes)
    caffe2jax.register_layer("ChannelScale", lambda b, p, lp, ctx: [b[0]])
    assert "ChannelScale" in registered_types()
    model = caffe2jax.compile(NET, dialect=fork)
    x = np.ones((2, 3, 4, 5), np.float32)
    np.testing.assert_array_equal(model.apply({}, {}, {"x": x})[0]["y"], x)
    built_in = lowering_of("AbsVal")
    with pytest.warns(UserWarning, match="'AbsVal' is built into caffe2jax; your registration"):
        caffe2jax.register_layer("AbsVal", lambda b, p, lp, ctx: [b[0] * 0 + 7])
    try:
        text = NET.replace('"ChannelScale"', '"AbsVal"')
        y = caffe2jax.compile(text, dialect=fork).apply({}, {}, {"x": -x})[0]["y"]
        np.testing.assert_array_equal(y, np.full_like(x, 7))
    finally:
        user_layers.unregister_layer("AbsVal")
    assert lowering_of("AbsVal") is built_in  # restored


def test_unregistered_type_is_one_line(fork, tmp_path):
    prototxt = tmp_path / "net.prototxt"
    prototxt.write_text(NET)
    with pytest.raises(NetError) as err:
        caffe2jax.compile(str(prototxt), dialect=fork)
    message = str(err.value)
    assert message.startswith(f"{prototxt}:3: layer 'cs' has unsupported type 'ChannelScale'")
    assert "caffe2jax.register_layer" in message and "--layers" in message
    assert "\n" not in message
