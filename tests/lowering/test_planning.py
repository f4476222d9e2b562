"""lowering/planning.py: which BatchNorm → Scale → ReLU chains a run fuses into one step
(lowering/engines/chains.py), and that the fused step's loss, blobs, gradients and BatchNorm
statistics equal the three layers' under jit, in value_and_grad (the train step's path)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.engines.policy import EnginePolicy
from caffe2jax.lowering.model import Model

CHAIN = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 3 dim: 4 dim: 7 dim: 6 } } }
layer { name: "t" type: "Input" top: "t" input_param { shape { dim: 3 dim: 5 dim: 7 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
        convolution_param { num_output: 5 kernel_size: 3 pad: 1 bias_term: false
                            weight_filler { type: "gaussian" } } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "%(bn_top)s" %(bn_param)s }
layer { name: "scale" type: "Scale" bottom: "%(bn_top)s" top: "s"
        scale_param { %(bias)s filler { type: "gaussian" } bias_filler { type: "gaussian" } } }
layer { name: "relu" type: "ReLU" bottom: "s" top: "s" %(relu_param)s }
layer { name: "loss" type: "EuclideanLoss" bottom: "s" bottom: "t" top: "loss" }
%(extra)s
"""  # noqa: E501
UNFUSED = EnginePolicy(fuse_batch_norm_chains=False)
PEEK = 'layer { name: "peek" type: "Power" bottom: "b" top: "p" }'


def net(phase="TRAIN", bn_top="b", bn_param="", bias="bias_term: true", relu_param="", extra=""):
    fields = dict(bn_top=bn_top, bn_param=bn_param, bias=bias, relu_param=relu_param, extra=extra)
    return load_net(CHAIN % fields, phase)


def chains(model: Model) -> list[tuple[str, ...]]:
    steps = model.graph._plan_run(0, None, ())
    return [tuple(x.name for x in (s.layer, *s.chain)) for s in steps.steps if s.chain]


@pytest.mark.parametrize(
    "kwargs,fused",
    [
        ({}, True),
        ({"bias": "bias_term: false"}, True),
        ({"bn_top": "c"}, True),  # in place, as MobileNet-SSD writes it
        ({"bn_param": "batch_norm_param { use_global_stats: true }"}, False),
        ({"phase": "TEST"}, False),  # global statistics
        ({"relu_param": "relu_param { negative_slope: 0.1 }"}, False),
        ({"extra": PEEK}, False),  # BatchNorm's top read by another layer too
    ],
)
def test_which_chains_fuse(kwargs, fused):
    model = Model(net(**kwargs), channels_last=True)
    assert chains(model) == ([("bn", "scale", "relu")] if fused else [])
    off = Model(net(**kwargs), channels_last=True, policy=UNFUSED)
    assert chains(off) == []
    assert chains(Model(net(**kwargs), channels_last=False)) == []  # Caffe's layout: no chain


def test_fused_chain_equals_the_layers_under_jit(bias="bias_term: false"):
    """Loss, every blob (BatchNorm's and Scale's tops too), every gradient and BatchNorm's new
    statistics of the fused step equal the three layers' within 1e-5 of each array's largest
    value (float summation order), jitted in value_and_grad; a Scale without bias here, with
    one in tests/lowering/test_layout.py's BatchNorm chain (fused there, against Caffe's
    layout). The convolution has no bias: before batch statistics its gradient is exactly 0,
    only rounding left to compare."""
    on = Model(net(bias=bias), channels_last=True)
    off = Model(net(bias=bias), channels_last=True, policy=UNFUSED)
    assert chains(on) and not chains(off)
    params, state = off.init(0)
    rng = np.random.default_rng(2)
    inputs = {"data": rng.standard_normal((3, 4, 7, 6)).astype(np.float32),
              "t": rng.standard_normal((3, 5, 7, 6)).astype(np.float32)}  # fmt: skip
    results = []
    for model in (on, off):
        loss = lambda p, m=model: m.loss(p, state, inputs, jax.random.key(3))  # noqa: E731
        results.append(jax.jit(jax.value_and_grad(loss, has_aux=True))(params))
    leaves_on, leaves_off = (jax.tree_util.tree_leaves_with_path(r) for r in results)
    assert len(leaves_on) == len(leaves_off) > 10
    for (path, a), (_, b) in zip(leaves_on, leaves_off):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = max(np.abs(b).max(), 1e-30)
        assert np.abs(a - b).max() <= 1e-5 * scale, jax.tree_util.keystr(path)
