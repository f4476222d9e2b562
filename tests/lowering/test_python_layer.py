"""Python layers: user-registered JAX forward, optional params and hand-written backward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.lowering.python_layer import (
    register_python_layer,
    registered_python_layers,
    unregister_python_layer,
)
from caffe2jax.lowering.registry import ParamDecl
from tests import jitted

MODULE = "caffe2jax_test_layers"


def net_text(layer, param_str="", shape=(2, 3, 4), phase_line="", tops=("y",)):
    dims = " ".join(f"dim: {d}" for d in shape)
    top_lines = " ".join(f'top: "{t}"' for t in tops)
    return f"""
    force_backward: true
    layer {{ name: "input" type: "Input" top: "x" input_param {{ shape {{ {dims} }} }} }}
    layer {{
      name: "py" type: "Python" bottom: "x" {top_lines} {phase_line}
      python_param {{ module: "{MODULE}" layer: "{layer}" param_str: "{param_str}" }}
    }}
    """


@pytest.fixture
def registry():
    """Registrations made by a test are removed afterwards."""
    made = []

    def reg(layer, **kwargs):
        made.append(layer)
        return register_python_layer(MODULE, layer, **kwargs)

    yield reg
    for layer in made:
        unregister_python_layer(MODULE, layer)


def x_value(shape=(2, 3, 4)):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def run_vjp(model, params, x, dy, rng=None):
    state = {}

    def forward(params, x):
        return jitted.forward(model, params, state, {"x": x}, rng)[0]["y"]

    y, vjp = jax.vjp(forward, params, jnp.asarray(x))
    dparams, dx = vjp(jnp.asarray(dy))
    return y, dparams, dx


def test_forward_and_autodiff_gradient(registry):
    @registry("Square")
    def square(bottoms, params, param_str, ctx):
        return [bottoms[0] ** 2]

    model = compile_net(net_text("Square"))
    assert model.net.shapes[model.net.blob_names["y"]] == (2, 3, 4)
    params, _ = model.init(0)
    x, dy = x_value(), x_value()[::-1].copy()
    y, _, dx = run_vjp(model, params, x, dy)
    np.testing.assert_allclose(y, x**2, rtol=1e-6)
    np.testing.assert_allclose(dx, 2 * x * dy, rtol=1e-6)
    assert f"{MODULE}.Square" in registered_python_layers()


def test_param_str_reaches_forward(registry):
    @registry("Scale")
    def scale(bottoms, params, param_str, ctx):
        return [bottoms[0] * float(param_str)]

    model = compile_net(net_text("Scale", param_str="2.5"))
    params, state = model.init(0)
    x = x_value()
    np.testing.assert_allclose(
        jitted.forward(model, params, state, {"x": x})[0]["y"], 2.5 * x, rtol=1e-6
    )


def test_hand_written_backward_is_what_gradients_use(registry):
    """The backward need not be the derivative (as in Caffe); its diffs are what JAX returns."""
    seen = {}

    def backward(bottoms, params, tops, top_diffs, param_str):
        seen.update(bottoms=bottoms, tops=tops, top_diffs=top_diffs, param_str=param_str)
        return [3.0 * top_diffs[0]], []

    @registry("Straight", backward=backward)
    def straight(bottoms, params, param_str, ctx):
        return [jnp.round(bottoms[0])]  # zero derivative almost everywhere

    model = compile_net(net_text("Straight", param_str="cfg"))
    params, _ = model.init(0)
    x, dy = x_value(), x_value()[::-1].copy()
    y, _, dx = jax.jit(run_vjp, static_argnums=0)(model, params, x, dy, jax.random.key(0))
    np.testing.assert_allclose(dx, 3.0 * dy, rtol=1e-6)
    np.testing.assert_array_equal(y, np.round(x))
    assert seen["param_str"] == "cfg"
    assert [b.shape for b in seen["bottoms"]] == [(2, 3, 4)]
    assert [t.shape for t in seen["tops"]] == [(2, 3, 4)]
    assert [d.shape for d in seen["top_diffs"]] == [(2, 3, 4)]


def channel_scale_shapes(bottom_shapes, param_str):
    filler = caffe_pb2.FillerParameter(type="constant", value=float(param_str))
    return [ParamDecl((bottom_shapes[0][1],), filler)]


def channel_scale(bottoms, params, param_str, ctx):
    return [bottoms[0] * params[0][None, :, None]]


def test_params_declared_filled_and_differentiated(registry):
    registry("ChannelScale", param_shapes=channel_scale_shapes)(channel_scale)
    model = compile_net(net_text("ChannelScale", param_str="0.5"))
    assert [d.shape for d in model.graph.decls["py"]] == [(3,)]
    params, _ = model.init(0)
    np.testing.assert_array_equal(params["py"][0], np.full(3, 0.5, np.float32))
    params["py"][0] = jnp.array([1.0, 2.0, 3.0])
    x, dy = x_value(), x_value()[::-1].copy()
    y, dparams, dx = run_vjp(model, params, x, dy)
    w = np.array([1.0, 2.0, 3.0], np.float32)[None, :, None]
    np.testing.assert_allclose(y, x * w, rtol=1e-6)
    np.testing.assert_allclose(dx, dy * w, rtol=1e-6)
    np.testing.assert_allclose(dparams["py"][0], (x * dy).sum(axis=(0, 2)), rtol=1e-5)


def test_params_with_hand_written_backward(registry):
    """Param diffs come from the backward too; None means no diff (zeros)."""

    def backward(bottoms, params, tops, top_diffs, param_str):
        return [None], [jnp.full_like(params[0], 7.0)]

    registry("ChannelScaleBw", param_shapes=channel_scale_shapes, backward=backward)(channel_scale)
    model = compile_net(net_text("ChannelScaleBw", param_str="1"))
    params, _ = model.init(0)
    _, dparams, dx = run_vjp(model, params, x_value(), x_value())
    np.testing.assert_array_equal(dparams["py"][0], np.full(3, 7.0, np.float32))
    np.testing.assert_array_equal(dx, np.zeros((2, 3, 4), np.float32))


def test_plain_shapes_declare_zero_filled_blobs(registry):
    registry("Plain", param_shapes=lambda shapes, s: [(4,)])(
        lambda bottoms, params, s, ctx: [bottoms[0] + params[0]]
    )
    model = compile_net(net_text("Plain"))
    params, _ = model.init(0)
    np.testing.assert_array_equal(params["py"][0], np.zeros(4, np.float32))


def test_context_gives_phase_and_key(registry):
    @registry("Noise")
    def noise(bottoms, params, param_str, ctx):
        if not ctx.train:
            return [bottoms[0]]
        return [bottoms[0] + jax.random.normal(ctx.key(), bottoms[0].shape, ctx.dtype)]

    x = x_value()
    test_model = compile_net(net_text("Noise"), phase="TEST")
    np.testing.assert_array_equal(jitted.forward(test_model, {}, {}, {"x": x})[0]["y"], x)
    train_model = compile_net(net_text("Noise"), phase="TRAIN")
    y = jitted.forward(train_model, {}, {}, {"x": x}, jax.random.key(1))[0]["y"]
    assert not np.allclose(y, x)


def test_several_tops(registry):
    @registry("PlusMinus")
    def plus_minus(bottoms, params, param_str, ctx):
        return [bottoms[0] + 1, bottoms[0] - 1]

    model = compile_net(net_text("PlusMinus", tops=("a", "b")))
    x = x_value()
    blobs, _ = jitted.forward(model, {}, {}, {"x": x})
    np.testing.assert_allclose(blobs["a"], x + 1)
    np.testing.assert_allclose(blobs["b"], x - 1)


def test_missing_registration_fails_at_compile_naming_how_to_register():
    with pytest.raises(NetError) as err:
        compile_net(net_text("NeverRegistered"))
    text = str(err.value)
    assert "\n" not in text
    assert "layer 'py' (type Python)" in text
    assert f"'{MODULE}.NeverRegistered'" in text
    assert f"register_python_layer('{MODULE}', 'NeverRegistered')" in text


def test_python_param_needs_module_and_layer():
    text = net_text("X").replace(f'module: "{MODULE}"', "")
    with pytest.raises(NetError, match="needs both 'module' and 'layer'"):
        compile_net(text)


def test_forward_must_return_a_list(registry):
    registry("Bare")(lambda bottoms, params, s, ctx: bottoms[0])
    with pytest.raises(NetError, match="must return a list of tops"):
        compile_net(net_text("Bare"))


def test_backward_with_wrong_shape_is_named(registry):
    def backward(bottoms, params, tops, top_diffs, param_str):
        return [jnp.zeros((5,))], []

    registry("BadBackward", backward=backward)(lambda bottoms, params, s, ctx: [bottoms[0] * 2])
    model = compile_net(net_text("BadBackward"))
    with pytest.raises(NetError, match=r"backward's bottom diff 0 has shape \[5\]"):
        run_vjp(model, {}, x_value(), x_value())
