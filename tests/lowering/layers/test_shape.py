"""Shape layers (lowering/layers/shape.py) beyond the golden cases: Reshape's inference rules,
Flatten, Tile, Concat and Slice errors, Parameter, the static-shape Filter, BatchReindex, Silence
and Split, and compile-time errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.golden import GOLDEN, load_npz
from tests.lowering.nets import forward, input_grad, one_layer

jax.config.update("jax_default_matmul_precision", "highest")


# -- Reshape, Flatten, Tile ----------------------------------------------------------------


def reshape_model(bottom, dims, axis=None, num_axes=None, top="y"):
    extra = "" if axis is None else f" axis: {axis}"
    extra += "" if num_axes is None else f" num_axes: {num_axes}"
    shape = " ".join(f"dim: {d}" for d in dims)
    body = (
        f'  type: "Reshape"\n  bottom: "x"\n  top: "{top}"\n'
        f"  reshape_param {{ shape {{ {shape} }}{extra} }}"
    )
    return one_layer(body, {"x": bottom})


@pytest.mark.parametrize(
    ("bottom", "dims", "axis", "num_axes", "top"),
    [
        ((2, 3, 4, 5), [0, -1], None, None, (2, 60)),
        ((2, 3, 4, 5), [-1], None, None, (120,)),
        ((2, 3, 4, 5), [0, 0, 0, 0], None, None, (2, 3, 4, 5)),
        ((2, 3, 4, 5), [6, -1, 1], None, None, (6, 20, 1)),
        ((2, 12, 5), [3, -1], 1, 1, (2, 3, 4, 5)),
        ((2, 3, 4), [1, 1], -1, 0, (2, 3, 4, 1, 1)),  # axis -1: after the last axis
        ((2, 3, 4), [1], 0, 0, (1, 2, 3, 4)),  # insert a leading axis
        ((2, 3, 4), [-1], 1, -1, (2, 12)),
        ((2, 3, 4), [0, -1], 1, 2, (2, 3, 4)),  # 0 copies the bottom dim at axis + i
    ],
)
def test_reshape_inference(bottom, dims, axis, num_axes, top):
    model = reshape_model(bottom, dims, axis, num_axes)
    x = np.arange(np.prod(bottom), dtype=np.float32).reshape(bottom)
    y = forward(model, {"x": x})["y"]
    assert y.shape == top
    np.testing.assert_array_equal(np.ravel(y), np.ravel(x))


@pytest.mark.parametrize(
    ("bottom", "dims", "axis", "num_axes", "message"),
    [
        ((2, 3, 4), [-1, -1], None, None, "more than one -1"),
        ((2, 3, 4), [5, -1], None, None, r"'x' \[2, 3, 4\] count 24 is not divisible"),
        ((2, 3, 4), [4, 5], None, None, r"does not hold the 24 items of bottom 'x' \[2, 3, 4\]"),
        ((2, 3), [0, 0, 0], None, None, "no bottom axis to copy"),
        ((2, 3), [6], 3, None, r"axis 3 is out of range for bottom 'x' \[2, 3\]"),
        ((2, 3), [6], 1, 2, "out of range"),
        ((2, 3), [6], None, -2, "num_axes must be >= 0"),
        ((2, 3), [-3, 2], None, None, "below -1"),
    ],
)
def test_reshape_errors(bottom, dims, axis, num_axes, message):
    with pytest.raises(NetError, match=message) as err:
        reshape_model(bottom, dims, axis, num_axes)
    assert "layer 'layer' (type Reshape)" in str(err.value)


@pytest.mark.parametrize("type_", ["Reshape", "Flatten"])
def test_reshape_and_flatten_refuse_in_place(type_):
    param = "reshape_param { shape { dim: -1 } }" if type_ == "Reshape" else ""
    body = f'  type: "{type_}"\n  bottom: "x"\n  top: "x"\n  {param}'
    with pytest.raises(NetError, match="in-place"):
        one_layer(body, {"x": (2, 3)})


def test_reshape_gradient_is_the_reshaped_top_diff():
    """Caffe's ReshapeLayer shares the top's diff with the bottom: dx = reshape(dy).

    (The golden reshape* cases record a zero bottom diff: the generator cleared diffs after
    Caffe had made the two blobs share one buffer, wiping the top diff it had just set.)
    """
    arrays, _ = load_npz(GOLDEN / "layers" / "reshape.npz")
    x, dy = arrays["in__x"], arrays["topdiff__y"]
    model = reshape_model(x.shape, [0, -1, 5])
    np.testing.assert_array_equal(forward(model, {"x": x})["y"], arrays["out__y"])
    np.testing.assert_array_equal(input_grad(model, {"x": x}, "y", dy)["x"], dy.reshape(x.shape))


def test_flatten_end_axis_before_axis_is_refused():
    body = '  type: "Flatten"\n  bottom: "x"\n  top: "y"\n  flatten_param { axis: 2 end_axis: 0 }'
    with pytest.raises(NetError, match="end_axis 0 comes before axis 2"):
        one_layer(body, {"x": (2, 3, 4)})


def test_tile_repeats_the_whole_block_and_refuses_non_positive_tiles():
    body = '  type: "Tile"\n  bottom: "x"\n  top: "y"\n  tile_param { axis: 0 tiles: 2 }'
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    y = forward(one_layer(body, {"x": x.shape}), {"x": x})["y"]
    np.testing.assert_array_equal(y, [[1, 2], [3, 4], [1, 2], [3, 4]])
    with pytest.raises(NetError, match="tiles must be positive"):
        one_layer(body.replace("tiles: 2", "tiles: 0"), {"x": x.shape})


# -- Concat and Slice errors ---------------------------------------------------------------


def test_concat_shape_mismatch_names_blobs_and_shapes():
    body = '  type: "Concat"\n  bottom: "a"\n  bottom: "b"\n  top: "y"'
    with pytest.raises(NetError, match=r"'a' \[2, 3, 4\], 'b' \[2, 3, 5\]") as err:
        one_layer(body, {"a": (2, 3, 4), "b": (2, 3, 5)})
    assert "except at concat axis 1" in str(err.value)
    with pytest.raises(NetError, match=r"same number of axes; got 'a' \[2, 3\], 'b' \[2, 3, 1\]"):
        one_layer(body, {"a": (2, 3), "b": (2, 3, 1)})


def test_concat_legacy_concat_dim_and_conflict():
    body = '  type: "Concat"\n  bottom: "a"\n  bottom: "b"\n  top: "y"\n  concat_param {{ {} }}'
    a, b = np.zeros((1, 2), np.float32), np.ones((3, 2), np.float32)
    model = one_layer(body.format("concat_dim: 0"), {"a": a.shape, "b": b.shape})
    np.testing.assert_array_equal(forward(model, {"a": a, "b": b})["y"], np.concatenate([a, b]))
    with pytest.raises(NetError, match="either axis or concat_dim"):
        one_layer(body.format("axis: 0 concat_dim: 0"), {"a": a.shape, "b": b.shape})


def slice_model(shape, param, tops=("y0", "y1")):
    top_lines = "".join(f'  top: "{t}"\n' for t in tops)
    body = f'  type: "Slice"\n  bottom: "x"\n{top_lines}  slice_param {{ {param} }}'
    return one_layer(body, {"x": shape})


@pytest.mark.parametrize(
    ("shape", "param", "tops", "message"),
    [
        (
            (2, 5),
            "axis: 1",
            ("y0", "y1"),
            r"2 tops do not evenly divide bottom 'x' \[2, 5\] axis 1",
        ),
        ((2, 6), "slice_point: 2 slice_point: 4", ("y0", "y1"), "2 slice_point.* need 3 tops"),
        ((2, 6), "slice_point: 4 slice_point: 2", ("a", "b", "c"), "must increase strictly"),
        ((2, 6), "slice_point: 7", ("y0", "y1"), r"within bottom 'x' \[2, 6\] axis 1 \(6\)"),
        ((3, 2), "axis: 0 slice_dim: 0", ("y0", "y1"), "either axis or slice_dim"),
        ((3, 2), "slice_dim: 2", ("y0", "y1"), "slice_dim 2 is out of range"),
    ],
)
def test_slice_errors(shape, param, tops, message):
    with pytest.raises(NetError, match=message):
        slice_model(shape, param, tops)


def test_slice_legacy_slice_dim():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    blobs = forward(slice_model(x.shape, "slice_dim: 0 slice_point: 1"), {"x": x})
    np.testing.assert_array_equal(blobs["y0"], x[:1])
    np.testing.assert_array_equal(blobs["y1"], x[1:])


# -- Parameter, Filter, BatchReindex -------------------------------------------------------


def test_parameter_gradient_is_the_top_diff():
    """ParameterLayer shares its blob's diff with the top (the golden ``parameter`` case
    records zero: its generator cleared param diffs after that sharing)."""
    text = (
        "force_backward: true\n"
        'layer { name: "layer" type: "Parameter" top: "y" parameter_param { shape { dim: 2 } } }'
    )
    model = compile_net(text)
    params, state = model.init(0)
    np.testing.assert_array_equal(params["layer"][0], [0.0, 0.0])  # Caffe fills nothing
    dy = jnp.array([1.5, -2.0])
    grads = jax.grad(lambda p: jnp.sum(jitted.forward(model, p, state, {})[0]["y"] * dy))(params)
    np.testing.assert_array_equal(grads["layer"][0], dy)


def golden_feed(case):
    """A golden case fed as the harness does: index inputs as inputs, x/z as Parameter blobs."""
    arrays, meta = load_npz(GOLDEN / "layers" / f"{case}.npz")
    model = compile_net(str(arrays["prototxt"]), phase=meta["phase"])
    params, state = model.init(0)
    for name in params:
        params[name][0] = jnp.asarray(arrays[f"in__{name[3:]}"])
    inputs = {n: arrays[f"in__{n}"] for n in model.inputs}
    return arrays, model, params, state, inputs


def test_filter_pads_to_the_setup_shape_and_matches_caffes_diffs():
    """Tops keep N rows: the selected items first, in order, then zeros. The diffs equal
    Caffe's (golden) for Caffe's k-row top diff padded with zeros. (The golden forward is
    zero: Caffe ran it before the Parameter blobs were fed.)"""
    arrays, model, params, state, inputs = golden_feed("filter")
    sel = arrays["in__sel"] != 0
    k = int(sel.sum())

    def f(params):
        blobs, _ = jitted.forward(model, params, state, inputs)
        return blobs["fx"], blobs["fz"]

    (fx, fz), vjp = jax.vjp(f, params)
    for top, data in ((fx, arrays["in__x"]), (fz, arrays["in__z"])):
        assert top.shape == data.shape
        np.testing.assert_array_equal(top[:k], data[sel])
        np.testing.assert_array_equal(top[k:], 0)

    def pad(d):
        return np.concatenate([d, np.zeros((len(sel) - k,) + d.shape[1:], d.dtype)])

    grads = vjp((pad(arrays["topdiff__fx"]), pad(arrays["topdiff__fz"])))[0]
    np.testing.assert_array_equal(grads["in_x"][0], arrays["grad__x"])
    np.testing.assert_array_equal(grads["in_z"][0], arrays["grad__z"])


def test_filter_under_jit_and_with_nothing_selected():
    body = '  type: "Filter"\n  bottom: "x"\n  bottom: "s"\n  top: "y"'
    model = one_layer(body, {"x": (3, 2), "s": (3, 1)})
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    run = jax.jit(lambda x, s: forward(model, {"x": x, "s": s})["y"])
    np.testing.assert_array_equal(
        run(x, np.array([[0], [2], [1]], np.float32)), [x[1], x[2], 0 * x[0]]
    )
    np.testing.assert_array_equal(run(x, np.zeros((3, 1), np.float32)), np.zeros_like(x))


@pytest.mark.parametrize(
    ("inputs", "tops", "message"),
    [
        ({"x": (3, 2), "s": (3, 2)}, ("y",), r"selector 's' \[3, 2\] must have singleton dims"),
        ({"x": (4, 2), "s": (3,)}, ("y",), r"bottom 'x' \[4, 2\] must have the selector's first"),
        ({"x": (3, 2), "s": (3,)}, ("y", "z"), "one top per filtered bottom"),
    ],
)
def test_filter_errors(inputs, tops, message):
    top_lines = "".join(f'  top: "{t}"\n' for t in tops)
    body = f'  type: "Filter"\n  bottom: "x"\n  bottom: "s"\n{top_lines}'
    with pytest.raises(NetError, match=message):
        one_layer(body, inputs)


def test_batch_reindex_gathers_and_scatter_adds():
    """y[i] = x[idx[i]]; repeated indices accumulate (the golden diff; its forward is zero
    because Caffe ran it before the Parameter blob was fed)."""
    arrays, model, params, state, inputs = golden_feed("batch_reindex")
    x, idx = arrays["in__x"], arrays["in__idx"].astype(int)

    def f(params):
        return jitted.forward(model, params, state, inputs)[0]["y"]

    y, vjp = jax.vjp(f, params)
    np.testing.assert_array_equal(y, x[idx])
    (grads,) = vjp(jnp.asarray(arrays["topdiff__y"]))
    np.testing.assert_allclose(grads["in_x"][0], arrays["grad__x"], rtol=1e-6)


def test_batch_reindex_truncates_float_indices_and_marks_invalid_rows():
    body = '  type: "BatchReindex"\n  bottom: "x"\n  bottom: "i"\n  top: "y"'
    model = one_layer(body, {"x": (3, 2), "i": (4,)})
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    idx = np.array([2.9, 0.0, 3.0, -0.5], np.float32)
    y = np.asarray(jax.jit(lambda x, i: forward(model, {"x": x, "i": i})["y"])(x, idx))
    np.testing.assert_array_equal(y[:2], [x[2], x[0]])
    assert np.isnan(y[2:]).all()  # Caffe aborts on indices outside [0, N)
    with pytest.raises(NetError, match="index bottom must be 1-D"):
        one_layer(body, {"x": (3, 2), "i": (4, 1)})


def test_silence_sends_zero_diff_and_split_sums():
    x = np.ones((2, 3), np.float32)
    silent = one_layer('  type: "Silence"\n  bottom: "x"', {"x": x.shape})
    params, state = silent.init(0)
    grad = jax.grad(lambda x: jnp.sum(silent.apply(params, state, {"x": x})[0]["x"] * 0.0))(x)
    np.testing.assert_array_equal(grad, 0.0)
    split = one_layer('  type: "Split"\n  bottom: "x"\n  top: "a"\n  top: "b"', {"x": x.shape})

    def f(x):
        blobs = split.apply(params, state, {"x": x})[0]
        return jnp.sum(2 * blobs["a"] + 3 * blobs["b"])

    np.testing.assert_array_equal(jax.grad(f)(x), 5.0)
