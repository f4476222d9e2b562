"""lowering/forks/rcf.py and frontend/forks/coord_maps.py: RCF's AutoCrop (yun-liu/rcf@ce460ff,
src/caffe/layers/auto_crop_layer.cpp, include/caffe/util/coords.hpp) — the offsets its
LayerSetUp finds from the coordinate maps, worked by hand, and the crop against a loop
transcribed from Forward_cpu, jitted and inside value_and_grad; an RCF side output (as in
examples/rcf/train_vgg16.prototxt) compiled and trained one step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import net


def _auto_crop_loop(x, ref_shape, crop_h, crop_w):
    """AutoCropLayer::Forward_cpu: per (n, c, h) one row of bottom 0 from (crop_h + h, crop_w)."""
    n, c = x.shape[:2]
    height, width = ref_shape[2], ref_shape[3]
    top = np.empty((n, c, height, width), x.dtype)
    for i, j, h in np.ndindex(n, c, height):
        top[i, j, h, :] = x[i, j, crop_h + h, crop_w : crop_w + width]
    return top


def _side_output(conv: str, pool: str, deconv: str, size: int = 16) -> str:
    """data → conv (ReLU in place) → pool → 1×1 score → deconv → AutoCrop to data → loss."""
    return net(
        f'layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv" '
        f'convolution_param {{ num_output: 4 {conv} weight_filler {{ type: "xavier" }} }} }}\n'
        'layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }\n'
        f'layer {{ name: "pool" type: "Pooling" bottom: "conv" top: "pool" '
        f"pooling_param {{ pool: MAX {pool} }} }}\n"
        'layer { name: "score" type: "Convolution" bottom: "pool" top: "score" '
        'convolution_param { num_output: 1 kernel_size: 1 weight_filler { type: "xavier" } } }\n'
        f'layer {{ name: "up" type: "Deconvolution" bottom: "score" top: "up" '
        f'convolution_param {{ num_output: 1 {deconv} weight_filler {{ type: "bilinear" }} }} }}\n'
        'layer { name: "crop" type: "AutoCrop" bottom: "up" bottom: "data" top: "out" }\n'
        'layer { name: "loss" type: "SigmoidCrossEntropyLoss" bottom: "out" bottom: "label" '
        'top: "loss" }',
        {"data": (2, 3, size, size), "label": (2, 1, size, size)},
    )


@pytest.mark.parametrize("conv, pool, deconv, offset", [
    # Maps from data's coordinates: conv k3 p1 x (FilterMap (1, 0) inverted), pool k2 s2
    # (x − 1/2)/2, deconv k4 s2 2y + 3/2: together x + 1, so the crop starts at 1.
    ("kernel_size: 3 pad: 1", "kernel_size: 2 stride: 2", "kernel_size: 4 stride: 2", (1, 1)),
    # pool k4 s4 (x − 3/2)/4, deconv k8 s4 4y + 7/2: x + 2 (RCF's dsn3: two k2 s2 pools, the
    # same map)
    ("kernel_size: 3 pad: 1", "kernel_size: 4 stride: 4", "kernel_size: 8 stride: 4", (2, 2)),
    # an unpadded conv x − 1 cancels the pooling's and deconvolution's +1: no crop
    ("kernel_size: 3", "kernel_size: 2 stride: 2", "kernel_size: 4 stride: 2", (0, 0)),
    ("kernel_size: 3 pad: 2", "kernel_size: 2 stride: 2", "kernel_size: 4 stride: 2", (2, 2)),
])  # fmt: skip
def test_offset_from_coordinate_maps_and_crop_match_the_fork(conv, pool, deconv, offset):
    model = compile_net(_side_output(conv, pool, deconv), phase="TRAIN")
    crop = model.net.layers[[lay.name for lay in model.net.layers].index("crop")]
    assert tuple(crop.param.crop_param.offset) == offset
    assert model.net.dialect == "rcf"
    params, state = model.init(0)
    rng = np.random.default_rng(0)
    feed = {"data": jnp.asarray(rng.standard_normal((2, 3, 16, 16)), jnp.float32),
            "label": jnp.asarray(rng.uniform(size=(2, 1, 16, 16)), jnp.float32)}  # fmt: skip
    blobs, _ = jitted.forward(model, params, state, feed, jax.random.key(0))
    want = _auto_crop_loop(np.asarray(blobs["up"]), (2, 1, 16, 16), *offset)
    np.testing.assert_array_equal(blobs["out"], want)

    def loss(p):
        return model.apply(p, state, feed)[0]["loss"]

    value, grads = jitted.value_and_grad(loss)(params)
    assert np.isfinite(value) and np.abs(grads["score"][0]).sum() > 0


def test_backward_writes_the_window_and_zeros_elsewhere():
    """AutoCropLayer::Backward_cpu: the top's diff into the window, 0 outside."""
    model = compile_net(_side_output("kernel_size: 3 pad: 1", "kernel_size: 2 stride: 2",
                                     "kernel_size: 4 stride: 2"), phase="TRAIN")  # fmt: skip
    params, state = model.init(0)
    up = jnp.asarray(np.random.default_rng(1).standard_normal((2, 1, 18, 18)), jnp.float32)
    dy = np.random.default_rng(2).standard_normal((2, 1, 16, 16)).astype(np.float32)
    lowering_in = {"data": jnp.zeros((2, 3, 16, 16)), "label": jnp.zeros((2, 1, 16, 16))}

    def f(u):
        from caffe2jax.lowering.forks.rcf import auto_crop

        crop = next(lay for lay in model.net.layers if lay.name == "crop")
        return auto_crop(crop, [], [u, lowering_in["data"]], None)[0]

    _, (grad,) = jitted.vjp(f, [up], dy)
    want = np.zeros((2, 1, 18, 18), np.float32)
    want[:, :, 1:17, 1:17] = dy
    np.testing.assert_array_equal(grad, want)


@pytest.mark.parametrize("deconv, problem", [
    ("kernel_size: 2 stride: 2 pad: 1", "negative crop width along height"),  # x − 1
    ("kernel_size: 3 stride: 2", r"the crop along height is not whole \(0.5\)"),  # x + 1/2
    ("kernel_size: 2 stride: 1", "its bottoms' heights differ in scale"),
])  # fmt: skip
def test_what_the_fork_refuses_is_one_line(deconv, problem):
    text = _side_output("kernel_size: 3 pad: 1", "kernel_size: 2 stride: 2", deconv)
    with pytest.raises(NetError, match=r"layer 'crop' \(type AutoCrop\): " + problem):
        compile_net(text)


def test_a_layer_without_a_coordinate_map_is_one_line():
    text = _side_output("kernel_size: 3 pad: 1", "global_pooling: true", "kernel_size: 4")
    with pytest.raises(NetError, match=r"layer 'pool' \(type Pooling\): AutoCrop cannot align"):
        compile_net(text)
