"""Caffe's blob-shape limits at compile time (lowering/limits.py): too many axes, negative
dims, counts past INT_MAX, in a declared input, a computed top or a param blob, each refused
with the layer and blob named before summary, time or init see them."""

from __future__ import annotations

import pytest

import caffe2jax
from caffe2jax.cli.summary import summary_lines
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.limits import INT_MAX, shape_problem, show_count, show_shape


def _input(dims: list[int], extra: str = "") -> str:
    shape = " ".join(f"dim: {d}" for d in dims)
    return (f'layer {{ name: "in" type: "Input" top: "data" '
            f"input_param {{ shape {{ {shape} }} }} }}\n{extra}")  # fmt: skip


@pytest.mark.parametrize(
    ("dims", "expected"),
    [
        ([1] * 1000, "[1, 1, 1, 1, 1, 1, ... (1000 axes)] has 1000 axes, more than Caffe's 32"),
        ([2, -1], "[2, -1] has a negative dim (-1); every dim must be >= 0"),
        ([2, -(2**63)], "has a negative dim (-9223372036854775808)"),
        ([2, 2**63 - 1], "[2, 9.22e+18] holds 1.84e+19 values, over Caffe's INT_MAX "
         "(2147483647)"),
        ([10**9] * 30, "holds 1e+270 values"),
    ],
)  # fmt: skip
def test_input_shapes_caffe_refuses_are_refused_naming_layer_and_blob(dims, expected):
    with pytest.raises(NetError) as err:
        caffe2jax.compile(_input(dims))
    text = str(err.value)
    assert "layer 'in' (type Input): top 'data' " in text
    assert expected in text
    assert "\n" not in text and len(text) < 240


def test_a_count_of_exactly_int_max_is_allowed_as_in_caffe():
    model = caffe2jax.compile(_input([INT_MAX]))
    assert model.inputs["data"] == (INT_MAX,)
    assert "Top shape: 2147483647 (2147483647)" in summary_lines(model.net)


def test_computed_tops_and_param_blobs_are_checked_too():
    tile = (
        'layer { name: "t" type: "Tile" bottom: "data" top: "t" tile_param { tiles: 1000000000 } }'
    )
    with pytest.raises(NetError, match=r"layer 't' \(type Tile\): top 't' \[2, 3000000000\] holds"):
        caffe2jax.compile(_input([2, 3], tile))
    ip = ('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
          "inner_product_param { num_output: 2000000000 } }")  # fmt: skip
    with pytest.raises(NetError, match=r"layer 'ip' \(type InnerProduct\): param blob 0 "):
        caffe2jax.compile(_input([2, 3], ip))


def test_input_shapes_given_by_the_caller_are_checked():
    data = ('layer { name: "d" type: "MemoryData" top: "data" top: "label" '
            "memory_data_param { batch_size: 2 channels: 1 height: 2 width: 2 } }")  # fmt: skip
    with pytest.raises(NetError, match=r"top 'data' \[2, 1, -2, 2\] has a negative dim"):
        caffe2jax.compile(data, input_shapes={"data": (2, 1, -2, 2), "label": (2,)})


def test_the_texts_stay_short_whatever_the_numbers():
    assert show_count((10**9,) * 1000) == "1e+9000"
    assert show_shape((1,) * 40).endswith("... (40 axes)]")
    assert shape_problem((0, 10**30)) == ""  # an empty blob holds nothing
    assert shape_problem((3, 4)) == ""
