"""lowering/forks/fpn.py: soeaver's caffe-priv Interp with two bottoms (``use_blob_size``, form
``blob_size``) against a loop transcribed from the fork's C++ (soeaver/py-RFCN-priv@ec89b86,
caffe-priv/src/caffe/layers/interp_layer.cpp and util/interp.cpp), jitted; its gradient in
float64; an FPN top-down step (as in soeaver/caffe-model's *-fpn prototxts) compiled and run."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.forks.dialect import Dialect
from caffe2jax.frontend.forks.forms import layer_form
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import fd_check, net, ours


def _interp2_loop(x, pad_beg, pad_end, height2, width2):
    """InterpLayer::Forward_cpu of caffe-priv: caffe_cpu_interp2 on the window
    [−pad_beg, H + pad_end) with float32 source coordinates."""
    n, c, big_h, big_w = x.shape
    x1 = x[:, :, -pad_beg : big_h + pad_end, -pad_beg : big_w + pad_end]
    height1, width1 = x1.shape[2:]
    top = np.zeros((n, c, height2, width2), np.float32)
    if (height1, width1) == (height2, width2):
        return x1.copy()
    rh = np.float32(height1 - 1) / np.float32(height2 - 1) if height2 > 1 else np.float32(0)
    rw = np.float32(width1 - 1) / np.float32(width2 - 1) if width2 > 1 else np.float32(0)
    for h2 in range(height2):
        h1r = np.float32(rh * np.float32(h2))
        h1 = int(h1r)
        h1p = 1 if h1 < height1 - 1 else 0
        h1l = np.float32(h1r - np.float32(h1))
        h0l = np.float32(1) - h1l
        for w2 in range(width2):
            w1r = np.float32(rw * np.float32(w2))
            w1 = int(w1r)
            w1p = 1 if w1 < width1 - 1 else 0
            w1l = np.float32(w1r - np.float32(w1))
            w0l = np.float32(1) - w1l
            top[:, :, h2, w2] = h0l * (
                w0l * x1[:, :, h1, w1] + w1l * x1[:, :, h1, w1 + w1p]
            ) + h1l * (w0l * x1[:, :, h1 + h1p, w1] + w1l * x1[:, :, h1 + h1p, w1 + w1p])
    return top


def _two(param: str, x_shape, ref_shape) -> str:
    return net('layer { name: "y" type: "Interp" bottom: "x" bottom: "ref" top: "y" '
               f"interp_param {{ {param} }} }}", {"x": x_shape, "ref": ref_shape})  # fmt: skip


@pytest.mark.parametrize("x_shape, ref_shape, param, pads", [
    ((2, 3, 4, 5), (1, 7, 8, 10), "use_blob_size: true", (0, 0)),
    ((1, 2, 5, 5), (1, 1, 9, 9), "use_blob_size: true", (0, 0)),
    ((1, 2, 7, 6), (2, 1, 13, 3), "use_blob_size: true pad_beg: -1 pad_end: -1", (-1, -1)),
    ((1, 2, 4, 4), (1, 1, 4, 4), "use_blob_size: true", (0, 0)),  # the same size: a copy
    ((1, 2, 4, 4), (1, 1, 9, 9), "height: 6 width: 3", (0, 0)),  # bottom 1 unused
])  # fmt: skip
def test_interp_blob_size_matches_the_fork_jitted(x_shape, ref_shape, param, pads):
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    ref = np.zeros(ref_shape, np.float32)
    y = ours(_two(param, x_shape, ref_shape), {"x": x, "ref": ref})["y"]
    size = (6, 3) if "height" in param else ref_shape[2:]
    np.testing.assert_allclose(y, _interp2_loop(x, *pads, *size), rtol=1e-6, atol=1e-6)


def test_form_is_decided_by_the_field_or_the_bottom_count():
    param = caffe_pb2.LayerParameter(type="Interp", bottom=["x"])
    param.interp_param.use_blob_size = True
    assert layer_form(param, Dialect()) == "blob_size"
    assert layer_form(caffe_pb2.LayerParameter(type="Interp", bottom=["x", "r"]),
                      Dialect()) == "blob_size"  # fmt: skip
    assert layer_form(caffe_pb2.LayerParameter(type="Interp", bottom=["x"]), Dialect()) == ""


def test_gradient_reaches_bottom_0_only_float64():
    x = np.random.default_rng(1).standard_normal((1, 2, 3, 4))
    text = _two("use_blob_size: true", x.shape, (1, 1, 5, 7))
    fd_check(text, {"x": x}, "y", fixed={"ref": np.zeros((1, 1, 5, 7))})


def test_use_blob_size_with_one_bottom_is_one_line():
    text = net('layer { name: "y" type: "Interp" bottom: "x" top: "y" '
               "interp_param { use_blob_size: true } }", {"x": (1, 1, 2, 2)})  # fmt: skip
    with pytest.raises(NetError, match=r"layer 'y' \(type Interp\).*2 bottom"):
        compile_net(text)


def test_fpn_top_down_step_compiles_and_runs():
    """p5_interp of deploy_faster_coco_inception-v4-merge-aligned-fpn.prototxt, made tiny: the
    coarse map upsampled to the lateral's size, then summed with it."""
    text = net(
        'layer { name: "lat" type: "Convolution" bottom: "c4" top: "lat" '
        'convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "xavier" } } }\n'
        'layer { name: "p5_interp" type: "Interp" bottom: "p5" bottom: "c4" top: "p5_up" '
        "interp_param { use_blob_size: true } }\n"
        'layer { name: "p4" type: "Eltwise" bottom: "p5_up" bottom: "lat" top: "p4" }',
        {"p5": (1, 4, 4, 5), "c4": (1, 8, 7, 9)},
    )
    model = compile_net(text)
    assert model.net.dialect == "caffe-priv"
    params, state = model.init(0)
    rng = np.random.default_rng(2)
    p5, c4 = (rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 4, 5), (1, 8, 7, 9)))
    blobs, _ = jitted.forward(model, params, state, {"p5": jnp.asarray(p5), "c4": jnp.asarray(c4)})
    assert blobs["p4"].shape == (1, 4, 7, 9)
    np.testing.assert_allclose(blobs["p5_up"], _interp2_loop(p5, 0, 0, 7, 9), atol=1e-6)
