"""The channels-last pass (lowering/layout.py) changes no result beyond float rounding.

Each net runs twice from the same weights and inputs, pass on and off: every blob ``apply``
returns, the loss and every param gradient must agree to float rounding, and every blob must
come back in Caffe's (N, C, H, W) shape.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.layout import plan
from caffe2jax.lowering.model import Model
from caffe2jax.runtime.formats.weights import load_weights
from tests.golden import GOLDEN, require
from tests.lowering.nets import one_layer

jax.config.update("jax_default_matmul_precision", "highest")

NETS = require(GOLDEN / "nets")
GOLDEN_NETS = ["lenet_train", "cifar10_quick_train", "cifar10_full_sigmoid_bn_train",
               "cifar10_quick_deploy", "lenet_deploy"]  # fmt: skip
# Relative to each array's largest magnitude. On CPU: float32 rounding of reordered sums. On a
# GPU each layout's convolutions run the cuDNN algorithms XLA's autotuner picks for it, which are
# not exact float32: on an H100, conv1's gradient in cifar10_full_sigmoid_bn differed from
# float64 by up to 6.3e-3 (2.3e-6 with --xla_gpu_autotune_level=0, as on CPU), either layout.
RTOL = 1e-5 if jax.default_backend() == "cpu" else 1e-2


def close(ours, theirs, what: str) -> None:
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape, what
    scale = max(np.abs(theirs).max(), 1e-30)
    assert np.abs(ours - theirs).max() <= RTOL * scale, (what, np.abs(ours - theirs).max(), scale)


def both(net, shapes=None) -> tuple[Model, Model]:
    return Model(net, shapes, channels_last=True), Model(net, shapes, channels_last=False)


def compare(on: Model, off: Model, params, state, inputs) -> None:
    key = jax.random.key(3)
    grad = jax.value_and_grad(lambda m, p: m.loss(p, state, inputs, key), argnums=1, has_aux=True)
    (loss_on, (blobs_on, _)), g_on = grad(on, params)
    (loss_off, (blobs_off, _)), g_off = grad(off, params)
    close(loss_on, loss_off, "loss")
    assert blobs_on.keys() == blobs_off.keys()
    for name in blobs_off:
        close(blobs_on[name], blobs_off[name], name)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_on), jax.tree.leaves(g_off)):
        close(a, b, f"grad {jax.tree_util.keystr(path)}")


@pytest.mark.parametrize("case", GOLDEN_NETS)
def test_golden_nets_same_with_channels_last(case):
    phase = "TRAIN" if case.endswith("train") else "TEST"
    net = load_net(NETS / f"{case}.prototxt", phase)
    batch = 4
    source = Model(net, None if phase == "TEST" else
                   {"data": (batch, *_data_shape(case)), "label": (batch,)})  # fmt: skip
    on, off = both(source.net, source.inputs)
    assert on.graph.nhwc_layers, "the pass chose no layer: nothing was tested"
    assert not off.graph.nhwc_layers
    params, state = load_weights(NETS / f"{case}.caffemodel", off)
    compare(on, off, params, state, golden_inputs(off))


def golden_inputs(model: Model) -> dict[str, np.ndarray]:
    """Seeded inputs for a golden net: data in [0, 1), labels over 10 classes."""
    rng = np.random.default_rng(0)
    inputs = {name: rng.uniform(0, 1, shape).astype(np.float32)
              for name, shape in model.inputs.items()}  # fmt: skip
    if "label" in inputs:
        inputs["label"] = rng.integers(0, 10, model.inputs["label"]).astype(np.float32)
    return inputs


def _data_shape(case: str) -> tuple[int, ...]:
    return (1, 28, 28) if case.startswith("lenet") else (3, 32, 32)


LAYERS = {
    "conv_group_dilated_strided": ('type: "Convolution" bottom: "x" top: "y" convolution_param '
                                   '{ num_output: 6 kernel_size: 3 stride: 2 pad: 2 dilation: 2 '
                                   'group: 2 weight_filler { type: "gaussian" } '
                                   'bias_filler { type: "gaussian" } }'),
    "pool_max_ceil_pad": ('type: "Pooling" bottom: "x" top: "y" pooling_param '
                          '{ pool: MAX kernel_size: 3 stride: 2 pad: 1 }'),
    "pool_ave_ceil": ('type: "Pooling" bottom: "x" top: "y" pooling_param '
                      '{ pool: AVE kernel_size: 3 stride: 2 }'),
    "pool_max_kernel_lt_stride": ('type: "Pooling" bottom: "x" top: "y" pooling_param '
                                  '{ pool: MAX kernel_size: 2 stride: 3 }'),
    "lrn_across": 'type: "LRN" bottom: "x" top: "y" lrn_param { local_size: 3 alpha: 0.5 }',
    "lrn_within": ('type: "LRN" bottom: "x" top: "y" lrn_param '
                   '{ local_size: 3 alpha: 0.5 norm_region: WITHIN_CHANNEL }'),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(LAYERS))
def test_layer_same_after_a_convolution(case):
    """Each channels-last form behind a convolution (which starts a channels-last chain)."""
    conv = ('type: "Convolution" bottom: "data" top: "x" convolution_param '
            '{ num_output: 4 kernel_size: 1 weight_filler { type: "gaussian" } }')  # fmt: skip
    body = conv + '\n}\nlayer {\n  name: "layer2"\n' + LAYERS[case]
    model = one_layer(body, {"data": (2, 3, 9, 11)}, phase="TRAIN")
    on, off = both(model.net, model.inputs)
    assert on.graph.nhwc_layers == {"layer", "layer2"}, on.graph.nhwc_layers
    params, state = off.init(0)
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 11)).astype(np.float32)
    x[0, :, :2, :2] = 0.5  # ties inside pooling windows
    compare(on, off, params, state, {"data": x})


BN_CHAIN = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 3 dim: 4 dim: 7 dim: 6 } } }
layer { name: "t" type: "Input" top: "t" input_param { shape { dim: 3 dim: 5 dim: 7 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
        convolution_param { num_output: 5 kernel_size: 3 pad: 1 bias_term: false
                            weight_filler { type: "gaussian" } } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" %s }
layer { name: "scale" type: "Scale" bottom: "c" top: "c"
        scale_param { bias_term: true filler { type: "gaussian" } bias_filler { type: "gaussian" } } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
layer { name: "loss" type: "EuclideanLoss" bottom: "c" bottom: "t" top: "loss" }
"""  # noqa: E501


@pytest.mark.parametrize("bn_param", ["", "batch_norm_param { use_global_stats: true }"])
def test_batchnorm_and_scale_stay_channels_last_under_jit(bn_param):
    """Convolution → BatchNorm → Scale → ReLU runs channels-last (MobileNet-SSD's and ResNet's
    chains, no transpose between them): under jit, in value_and_grad of the loss, the loss,
    every blob, every gradient and BatchNorm's updated statistics equal the NCHW run's to
    float rounding — batch statistics (TRAIN) and global ones. (The convolution has no bias:
    before batch statistics its gradient is exactly 0, only rounding left to compare.)"""
    net = load_net(BN_CHAIN % bn_param, "TRAIN")
    on, off = both(net)
    assert {"bn", "scale", "relu"} <= on.graph.nhwc_layers, on.graph.nhwc_layers
    params, state = off.init(0)
    state["bn"] = [np.full(5, 0.3, np.float32), np.full(5, 2.0, np.float32), np.ones(1, np.float32)]
    rng = np.random.default_rng(2)
    inputs = {"data": rng.standard_normal((3, 4, 7, 6)).astype(np.float32),
              "t": rng.standard_normal((3, 5, 7, 6)).astype(np.float32)}  # fmt: skip
    results = []
    for model in (on, off):
        loss = lambda p, m=model: m.loss(p, state, inputs, jax.random.key(3))  # noqa: E731
        grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
        results.append(grad(params))
    leaves_on, leaves_off = (jax.tree_util.tree_leaves_with_path(r) for r in results)
    assert len(leaves_on) == len(leaves_off) > 10
    for (path, a), (_, b) in zip(leaves_on, leaves_off):
        close(a, b, jax.tree_util.keystr(path))


def test_scale_over_other_axes_stays_in_caffes_layout():
    """A Scale over more than the channel axis (num_axes 2) has no channels-last form."""
    text = BN_CHAIN.replace("bias_term: true", "bias_term: true num_axes: 2") % ""
    assert "scale" not in Model(load_net(text, "TRAIN")).graph.nhwc_layers


def test_plan_starts_at_a_convolution():
    """A pooling or ReLU that reads no channels-last blob stays NCHW (two transposes for
    nothing); a Concat on axis 2 or an unsupported type ends the chain."""
    text = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 6 dim: 6 } } }
layer { name: "pool0" type: "Pooling" bottom: "data" top: "p0" pooling_param { pool: MAX kernel_size: 2 } }
layer { name: "conv" type: "Convolution" bottom: "p0" top: "c" convolution_param { num_output: 2 kernel_size: 1 } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
layer { name: "cat" type: "Concat" bottom: "c" bottom: "c" top: "cat" concat_param { axis: 2 } }
layer { name: "sig" type: "Sigmoid" bottom: "c" top: "s" }
"""  # noqa: E501
    model = Model(load_net(text, "TEST"))
    assert plan(model.net) == {"conv", "relu"}
