"""Graph assembly and planning (lowering/graph.py, planning.py, sharing.py): shape inference
without host memory, shared params, Caffe's need-backward analysis as stop_gradient, the engine
plan (each layer's form, decided from static facts), and run plans (which layers run in which
layout, with the transposes at chain edges) for whole runs, ranges and taps."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.engines.policy import EnginePolicy
from caffe2jax.lowering.registry import Context

jax.config.update("jax_default_matmul_precision", "highest")

HUGE_POOL = """
layer { name: "in" type: "Input" top: "data"
        input_param { shape { dim: 1 dim: 1 dim: 500000000 dim: 4 } } }
layer { name: "pool" type: "Pooling" bottom: "data" top: "p"
        pooling_param { pool: AVE kernel_size: 3 pad: 1 stride: 1 } }
"""

# grey image → conv (1 channel) → pool → conv → LRN (split to two readers) → pool, 1×1 conv
# → sigmoid: every form the CPU plan knows
FORMS_NET = """
input: "data" input_shape { dim: 2 dim: 1 dim: 28 dim: 28 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "c1"
        convolution_param { num_output: 8 kernel_size: 5 } }
layer { name: "pool1" type: "Pooling" bottom: "c1" top: "p1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "p1" top: "c2"
        convolution_param { num_output: 16 kernel_size: 3 pad: 1 } }
layer { name: "norm" type: "LRN" bottom: "c2" top: "n" lrn_param { local_size: 3 } }
layer { name: "pool2" type: "Pooling" bottom: "n" top: "p2"
        pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "proj" type: "Convolution" bottom: "p2" top: "c3"
        convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "side" type: "Convolution" bottom: "n" top: "c4"
        convolution_param { num_output: 4 kernel_size: 1 stride: 2 } }
layer { name: "sig" type: "Sigmoid" bottom: "c3" top: "s" }
"""


def test_padded_ave_pooling_shapes_need_no_host_memory():
    """Shape inference (and the engine plan) never builds host arrays proportional to a blob: a
    net declaring a half-billion-row padded AVE pooling (2e9 values, just under Caffe's INT_MAX
    count) compiles within a small address space."""
    script = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        import caffe2jax
        from caffe2jax.frontend.errors import NetError
        from caffe2jax.runtime.host.memory import check_net_fits
        model = caffe2jax.compile({HUGE_POOL!r})
        print(model.net.shapes[model.net.blob_names["p"]])
        try:
            check_net_fits(model.net, available=1 << 30)
        except NetError as err:
            print(err)
    """)  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={"JAX_PLATFORMS": "cpu", "PATH": ""})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    shape, message = proc.stdout.strip().splitlines()
    assert shape == "(1, 1, 500000000, 4)"
    assert "its blobs need 14.9 GiB, more than the 1 GiB available" in message
    assert "(largest: 'data' [1, 1, 500000000, 4])" in message


@pytest.mark.parametrize(
    "fields,expected",
    [
        ({"backend": "cpu", "conv": "xla"},
         {"conv1": "patches", "pool1": "phases", "conv2": "xla", "pool2": "phases-rw",
          "proj": "pointwise", "side": "pointwise"}),
        ({"backend": "cpu", "conv": "xla", "channels_last": False},
         {"conv1": "xla", "pool1": "phases", "conv2": "xla", "pool2": "phases-rw",
          "proj": "xla", "side": "xla"}),
        ({"backend": "cpu", "conv": "xla", "pool": "xla", "pointwise": False, "patches": False},
         {"conv1": "xla", "pool1": "xla", "conv2": "xla", "pool2": "xla", "proj": "xla",
          "side": "xla"}),
        ({"backend": "gpu"},
         {"conv1": "xla", "pool1": "phases-rw", "conv2": "xla", "pool2": "xla", "proj": "xla",
          "side": "xla"}),
    ],
)  # fmt: skip
def test_the_engine_plan_names_each_layers_form(fields, expected):
    """One lookup answers where a layer runs. The pooling behind LRN reads it once (LRN's
    output is split to two readers: the producer is seen through the split)."""
    model = caffe2jax.compile(FORMS_NET, policy=EnginePolicy(**fields))
    assert model.graph.engines == expected


def _nets(policy=None):
    on = caffe2jax.compile(FORMS_NET, policy=policy or EnginePolicy())
    off = caffe2jax.compile(FORMS_NET, policy=EnginePolicy(channels_last=False, conv="xla",
                                                           pool="xla"))  # fmt: skip
    params, state = off.init(0)
    x = np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32)
    return on, off, params, state, x


def test_a_run_plan_transposes_only_at_chain_edges():
    on, *_ = _nets()
    graph = on.graph
    assert graph.nhwc_layers == {"conv1", "pool1", "conv2", "norm", "pool2", "proj", "side"}
    plan = graph._plan_run(0, None, ())
    assert plan is graph._plan_run(0, None, ())  # planned once per range
    moves = {s.layer.name: s.transposes for s in plan.steps if s.layer is not None}
    assert moves["conv1"] == ("nhwc",)  # the chain starts
    assert all(moves[n] == (None,) for n in ("pool1", "conv2", "norm", "pool2", "proj", "side"))
    assert moves["sig"] == ("nchw",)  # the chain ends
    splits = [s for s in plan.steps if s.layer is None]
    assert len(splits) == 1 and splits[0].nhwc_tops == frozenset(splits[0].tops)
    assert set(plan.held) == {"c1", "p1", "c2", "n", "p2", "c3", "c4", *splits[0].tops}
    names = on.net.blob_names
    fns = {s.layer.name: s.fn for s in plan.steps if s.layer is not None}
    assert fns["conv1"] is graph.lowerings["conv1"].nhwc_fn
    assert fns["sig"] is graph.lowerings["sig"].fn
    assert names["s"] not in plan.held


def test_every_form_gives_the_plain_forms_blobs_and_gradients():
    on, off, params, state, x = _nets()
    grad = jax.value_and_grad(
        lambda m, p: jnp.sum(m.apply(p, state, {"data": x})[0]["s"]), argnums=1
    )
    (y_on, g_on), (y_off, g_off) = grad(on, params), grad(off, params)
    np.testing.assert_allclose(y_on, y_off, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_on), jax.tree.leaves(g_off)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max())
    blobs = on.apply(params, state, {"data": x})[0]
    for name, value in off.apply(params, state, {"data": x})[0].items():
        assert blobs[name].shape == value.shape, name  # every blob back in Caffe's layout


@pytest.mark.parametrize("start_at", ["pool1", "norm", "pool2", "sig"])
def test_a_range_starting_inside_a_channels_last_chain_reads_caffe_layout(start_at):
    """Net::ForwardFromTo from a layer in the middle of a chain: the blobs handed in are in
    Caffe's layout (as pycaffe holds them), so the plan transposes them in."""
    on, off, params, state, x = _nets()
    full, _ = off.graph.run(params, state, off.graph._feed({"data": x}))
    graph = on.graph
    k = next(i for i, c in enumerate(graph.caffe_layers) if c.name == start_at)
    part, _ = graph.run(params, state, full, start=k)
    for name, value in part.items():
        np.testing.assert_allclose(value, full[name], rtol=1e-4, atol=1e-4, err_msg=name)
        assert value.shape == full[name].shape


def test_taps_on_channels_last_blobs_give_caffe_layout_diffs():
    """A tap on a blob the plan holds channels-last is transposed to match: its gradient is
    the blob's diff in Caffe's layout, as with the pass off."""
    on, off, params, state, x = _nets()
    diffs = {}
    for model in (on, off):
        env = model.graph._feed({"data": x})
        blobs, _ = model.graph.run(params, state, env)
        taps = {b: jnp.zeros_like(blobs[b]) for b in ("c1", "n", "c3")}

        def objective(taps, model=model, env=env):
            out, _ = model.graph.run(params, state, env, taps=taps)
            return jnp.sum(out["s"] ** 2)

        diffs[model is on] = jax.grad(objective)(taps)
    for name in diffs[True]:
        np.testing.assert_allclose(diffs[True][name], diffs[False][name], rtol=1e-4,
                                   atol=1e-6, err_msg=name)  # fmt: skip


SHARED = """
input: "x" input_shape {{ dim: 2 dim: 3 }}
layer {{ name: "a" type: "InnerProduct" bottom: "x" top: "ya"
        param {{ name: "w" }} param {{ name: "b" }} inner_product_param {{ num_output: 4 }} }}
layer {{ name: "b" type: "InnerProduct" bottom: "x" top: "yb"
        param {{ name: "w" }} param {{ name: "b" }} inner_product_param {{ num_output: {n} }} }}
"""


def test_shared_params_have_one_owner():
    """Caffe's AppendParam: the first layer naming a param owns it, later ones read it; a
    sharer of another shape is refused naming both."""
    model = caffe2jax.compile(SHARED.format(n=4))
    graph = model.graph
    assert graph.shared == {("b", 0): ("a", 0), ("b", 1): ("a", 1)}
    params, state = model.init(0)
    assert "b" not in params and len(params["a"]) == 2
    layer = graph.net.layer("b")
    for own, shared in zip(params["a"], graph.layer_blobs(layer, params, state)):
        np.testing.assert_array_equal(own, shared)
    blobs, _ = model.apply(params, state, {"x": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(blobs["ya"], blobs["yb"])
    with pytest.raises(NetError, match=r"layer 'b'.*cannot share param 'w' owned by layer 'a'"):
        caffe2jax.compile(SHARED.format(n=5))


def test_need_backward_is_stop_gradient_where_caffe_computes_no_diff():
    """Params with lr_mult 0 and inputs without force_backward get no diff, as in Caffe."""
    text = """
input: "x" input_shape { dim: 2 dim: 3 }
input: "t" input_shape { dim: 2 dim: 2 }
layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "h"
        param { lr_mult: 0 } param { lr_mult: 0 }
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" } } }
layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "y"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "l" }
"""
    model = caffe2jax.compile(text, "TRAIN")
    backward = model.net.backward
    assert tuple(backward["ip1"].params) == (False, False)
    assert all(backward["ip2"].params)
    params, state = model.init(0)
    inputs = {"x": np.ones((2, 3), np.float32), "t": np.zeros((2, 2), np.float32)}
    grads, inputs_grad = jax.grad(lambda p, i: model.loss(p, state, i)[0], argnums=(0, 1))(
        params, inputs)  # fmt: skip
    assert all(not np.any(g) for g in grads["ip1"])
    assert any(np.any(g) for g in grads["ip2"])
    assert not np.any(inputs_grad["x"])


def test_context_carries_the_engine_and_nothing_dead():
    ctx = Context("TEST", None)
    assert ctx.engine is None
    assert not hasattr(ctx, "state") and not hasattr(ctx, "bottom_types")


SUM = (
    'layer { name: "in" type: "Input" top: "a" top: "b" input_param { shape { dim: 2 dim: 3 } '
    "shape { dim: 2 dim: 3 } } }\nlayer {\n  name: 'sum'\n  type: 'Eltwise'\n"
    "  bottom: 'a' bottom: 'b' top: 'y'\n}\n"
)


def test_a_shape_error_inside_a_layer_is_a_net_error_naming_file_line_layer_and_shapes(
    tmp_path, monkeypatch
):
    """A jax broadcast error inside a built-in layer — in shape inference, or in a run of a net
    whose shapes were inferred (a channels-last form, an engine) — fails as a NetError with
    file:line, the layer, its type, its bottoms' shapes and jax's complaint."""
    from caffe2jax.lowering.registry import lowering_of

    eltwise = lowering_of("Eltwise")
    plain, calls = eltwise.fn, []

    def misfit(layer, params, bottoms, ctx):
        calls.append(1)
        if len(calls) == 1:  # shape inference fits
            return plain(layer, params, bottoms, ctx)
        return [bottoms[0] + bottoms[1][:, :2]]

    monkeypatch.setattr(eltwise, "fn", misfit)
    path = tmp_path / "net.prototxt"
    path.write_text(SUM)
    model = caffe2jax.compile(str(path))
    where = rf"^{path}:3: layer 'sum' \(type Eltwise\): "
    shapes = r"cannot apply to bottom\(s\) 'a' \[2, 3\], 'b' \[2, 3\]: .*broadcast"
    x = np.ones((2, 3), np.float32)
    with pytest.raises(NetError, match=where + shapes):
        jax.jit(lambda a, b: model.apply({}, {}, {"a": a, "b": b})[0]["y"])(x, x)
    calls.clear()
    calls.append(1)  # now shape inference itself meets the misfit
    with pytest.raises(NetError, match=where + shapes):
        caffe2jax.compile(str(path))
