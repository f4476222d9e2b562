"""``state``: Caffe's state blobs by layer, and carried recurrent values in their own tree."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import caffe2jax
from caffe2jax.lowering.registry import NetState

NET = """
layer { name: "in" type: "Input" top: "x" top: "cont"
        input_param { shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 } } }
layer { name: "rnn" type: "RNN" bottom: "x" bottom: "cont" top: "h"
        recurrent_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn" type: "BatchNorm" bottom: "h" top: "hn" }
"""


def test_carry_lives_in_its_own_tree():
    model = caffe2jax.compile(NET, phase="TRAIN")
    params, state = model.init(0)
    assert isinstance(state, NetState) and set(state) == {"bn"}  # only Caffe blobs as keys
    assert set(state.carry) == {"rnn"} and all(not c.any() for c in state.carry["rnn"])
    inputs = {"x": jnp.ones((3, 2, 4)), "cont": jnp.ones((3, 2))}
    _, after = jax.jit(model.apply)(params, state, inputs)
    assert isinstance(after, NetState) and set(after.carry) == {"rnn"}
    assert any(c.any() for c in after.carry["rnn"])  # h_T moved on: the next forward starts there
    doubled = jax.tree.map(lambda v: 2 * v, after)  # a pytree: both trees are mapped
    assert jnp.allclose(doubled.carry["rnn"][0], 2 * after.carry["rnn"][0])
    assert jnp.allclose(doubled["bn"][2], 2 * after["bn"][2])
