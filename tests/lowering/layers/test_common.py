"""Common layers (lowering/layers/common.py) beyond the golden cases: Eltwise, ArgMax and Reduction
tie and gradient rules, Scale/Bias/InnerProduct/Embed blob shapes, fillers and errors naming blobs
and shapes."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from tests.lowering.nets import apply, grads, one_layer

jax.config.update("jax_default_matmul_precision", "highest")

RNG = np.random.default_rng(7)


# -- Eltwise, ArgMax, Reduction -----------------------------------------------------------


def test_eltwise_max_routes_ties_like_caffes_mask():
    a = np.array([1.0, 2.0, 0.0, 3.0], np.float32)
    b = np.array([1.0, 1.0, 4.0, 3.0], np.float32)
    c = np.array([0.0, 2.0, 4.0, 3.0], np.float32)
    body = '  type: "Eltwise"\n  bottom: "a"\n  bottom: "b"\n  bottom: "c"\n  top: "y"\n'
    body += "  eltwise_param { operation: MAX }"
    model = one_layer(body, {"a": (4,), "b": (4,), "c": (4,)})
    y, g = grads(model, {"a": a, "b": b, "c": c}, "y", np.ones(4))
    np.testing.assert_array_equal(y, [1, 2, 4, 3])
    # a == b goes to b; a later bottom only wins when strictly larger.
    np.testing.assert_array_equal(g["a"], [0, 1, 0, 0])
    np.testing.assert_array_equal(g["b"], [1, 0, 1, 1])
    np.testing.assert_array_equal(g["c"], [0, 0, 0, 0])


def test_eltwise_coefficients_only_for_sum():
    body = '  type: "Eltwise"\n  bottom: "a"\n  bottom: "b"\n  top: "y"\n'
    with pytest.raises(NetError, match="only takes coefficients for summation"):
        one_layer(
            body + "  eltwise_param { operation: PROD coeff: 1 coeff: 2 }", {"a": (2,), "b": (2,)}
        )
    with pytest.raises(NetError, match="one coefficient per bottom"):
        one_layer(body + "  eltwise_param { coeff: 1 }", {"a": (2,), "b": (2,)})


def test_eltwise_shape_mismatch_names_blobs():
    body = '  type: "Eltwise"\n  bottom: "a"\n  bottom: "b"\n  top: "y"'
    with pytest.raises(NetError, match=r"'b' \[2, 4\].*'a' \[2, 3\]"):
        one_layer(body, {"a": (2, 3), "b": (2, 4)})


def test_argmax_ties_go_to_the_larger_index():
    x = np.array([[1.0, 3.0, 3.0, 0.0, 3.0]], np.float32)
    body = (
        '  type: "ArgMax"\n  bottom: "x"\n  top: "y"\n  argmax_param { top_k: 2 out_max_val: true }'
    )
    blobs, _ = apply(one_layer(body, {"x": x.shape}), {"x": x})
    np.testing.assert_array_equal(blobs["y"], [[[4, 2], [3, 3]]])


def test_argmax_without_axis_pads_to_caffes_shape():
    body = '  type: "ArgMax"\n  bottom: "x"\n  top: "y"\n  argmax_param { top_k: 3 }'
    model = one_layer(body, {"x": (2, 3, 4, 5)})
    assert model.net.shapes[model.net.blob_names["y"]] == (2, 1, 3, 1)
    with pytest.raises(NetError, match="top_k 7"):
        one_layer(body.replace("3", "7"), {"x": (2, 6)})


def test_reduction_asum_gradient_is_zero_at_zero():
    x = np.array([[-2.0, 0.0, 3.0]], np.float32)
    body = '  type: "Reduction"\n  bottom: "x"\n  top: "y"\n'
    body += "  reduction_param { operation: ASUM axis: 1 coeff: 2 }"
    y, g = grads(one_layer(body, {"x": x.shape}), {"x": x}, "y", np.ones(1))
    np.testing.assert_allclose(y, [10.0])
    np.testing.assert_array_equal(g["x"], [[-2.0, 0.0, 2.0]])


# -- Scale, Bias, InnerProduct, Embed -----------------------------------------------------


def test_scale_defaults_to_unit_filler_and_bias_to_zero():
    body = '  type: "Scale"\n  bottom: "x"\n  top: "y"\n  scale_param { bias_term: true }'
    params, _ = one_layer(body, {"x": (2, 3, 4)}).init(0)
    np.testing.assert_array_equal(params["layer"][0], np.ones(3))
    np.testing.assert_array_equal(params["layer"][1], np.zeros(3))


def test_scale_bottom_shape_mismatch_names_blobs():
    body = '  type: "Scale"\n  bottom: "x"\n  bottom: "s"\n  top: "y"'
    with pytest.raises(NetError, match=r"bottom 's' \[4\].*'x' \[2, 3, 4\]"):
        one_layer(body, {"x": (2, 3, 4), "s": (4,)})


def test_bias_learned_blob_past_the_bottom_is_refused():
    body = '  type: "Bias"\n  bottom: "x"\n  top: "y"\n  bias_param { axis: 1 num_axes: 3 }'
    with pytest.raises(NetError, match="extends past"):
        one_layer(body, {"x": (2, 3)})


def test_inner_product_blob_shapes():
    body = '  type: "InnerProduct"\n  bottom: "x"\n  top: "y"\n'
    model = one_layer(body + "  inner_product_param { num_output: 5 }", {"x": (2, 3, 4)})
    assert [d.shape for d in model.graph.decls["layer"]] == [(5, 12), (5,)]
    model = one_layer(
        body + "  inner_product_param { num_output: 5 axis: 2 transpose: true bias_term: false }",
        {"x": (2, 3, 4)},
    )
    assert [d.shape for d in model.graph.decls["layer"]] == [(4, 5)]
    assert model.net.shapes[model.net.blob_names["y"]] == (2, 3, 5)


def test_embed_out_of_range_index_gives_nan_rows():
    body = (
        '  type: "Embed"\n  bottom: "i"\n  top: "y"\n  embed_param { num_output: 2 input_dim: 3 }'
    )
    blobs, _ = apply(one_layer(body, {"i": (4,)}), {"i": np.array([0, 2, 3, -1])})
    assert np.all(np.isfinite(blobs["y"][:2])) and np.all(np.isnan(blobs["y"][2:]))
