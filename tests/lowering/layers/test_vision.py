"""The vision family (lowering/layers/vision.py) beyond the golden cases: N-D and batched-axis
convolution and deconvolution against numpy references, several bottoms sharing weights,
Im2col as Caffe's column buffer, LRN, Crop, and the errors for configurations Caffe refuses.
Pooling and SPP are in test_pooling.py; the convolution forms (oneDNN, 1×1 matrix products,
im2col patches) in tests/lowering/engines/."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests.lowering.nets import net_text, rel, run

jax.config.update("jax_default_matmul_precision", "highest")

RNG = np.random.default_rng(20240607)


# -- convolution ------------------------------------------------------------------------------


def conv_ref(x, w, b, stride, pad, dil, group):
    """Caffe's grouped N-D convolution in float64 numpy: one einsum per kernel offset."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    ks = w.shape[2:]
    out = tuple(
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, p, d, k, s in zip(x.shape[2:], pad, dil, ks, stride)
    )
    cg, og = x.shape[1] // group, w.shape[0] // group
    y = np.zeros((x.shape[0], w.shape[0]) + out)
    for off in itertools.product(*map(range, ks)):
        idx = tuple(
            slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, n, s in zip(off, dil, out, stride)
        )
        patch = xp[(slice(None), slice(None)) + idx]
        for g in range(group):
            wg = w[(slice(g * og, (g + 1) * og), slice(None)) + off]
            y[:, g * og : (g + 1) * og] += np.einsum(
                "nc...,oc->no...", patch[:, g * cg : (g + 1) * cg], wg
            )
    return y + np.asarray(b, np.float64).reshape((-1,) + (1,) * len(out))


def test_conv_3d_matches_numpy():
    x = RNG.standard_normal((2, 4, 5, 6, 7)).astype(np.float32)
    w = RNG.standard_normal((6, 2, 3, 2, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    param = (
        "convolution_param { num_output: 6 group: 2 kernel_size: 3 kernel_size: 2 "
        "kernel_size: 3 stride: 2 stride: 1 stride: 2 pad: 1 pad: 0 pad: 2 dilation: 1 "
        "dilation: 2 dilation: 1 }"
    )
    _, blobs = run(net_text("Convolution", [x.shape], param), {"x": x}, [w, b])
    ref = conv_ref(x, w, b, (2, 1, 2), (1, 0, 2), (1, 2, 1), 2)
    assert blobs["y"].shape == ref.shape
    assert rel(blobs["y"], ref) < 1e-6


def test_conv_axis_treats_leading_axes_as_batch():
    x = RNG.standard_normal((2, 3, 4, 6, 5)).astype(np.float32)
    w = RNG.standard_normal((5, 4, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(5).astype(np.float32)
    param = "convolution_param { num_output: 5 kernel_size: 3 pad: 1 axis: 2 }"
    _, blobs = run(net_text("Convolution", [x.shape], param), {"x": x}, [w, b])
    ref = conv_ref(x.reshape(6, 4, 6, 5), w, b, (1, 1), (1, 1), (1, 1), 1)
    assert rel(blobs["y"], ref.reshape(2, 3, 5, 6, 5)) < 1e-6


def test_conv_two_bottoms_share_weights():
    x1 = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    x2 = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    text = (
        'layer { name: "in" type: "Input" top: "a" top: "b" '
        "input_param { shape { dim: 1 dim: 2 dim: 5 dim: 5 } } }\n"
        'layer { name: "layer" type: "Convolution" bottom: "a" bottom: "b" top: "ya" top: "yb" '
        "convolution_param { num_output: 3 kernel_size: 3 } }"
    )
    w = RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)
    b = np.zeros(3, np.float32)
    _, blobs = run(text, {"a": x1, "b": x2}, [w, b])
    for x, top in ((x1, "ya"), (x2, "yb")):
        assert rel(blobs[top], conv_ref(x, w, b, (1, 1), (0, 0), (1, 1), 1)) < 1e-6


def deconv_ref(x, w, b, stride, pad, dil, group):
    """Caffe's deconvolution in numpy: every input pixel scatters its kernel (col2im)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    ks, n_in = w.shape[2:], x.shape[2:]
    full = tuple(s * (n - 1) + d * (k - 1) + 1 for s, n, d, k in zip(stride, n_in, dil, ks))
    cg, og = x.shape[1] // group, w.shape[1]
    y = np.zeros((x.shape[0], og * group) + full)
    for off in itertools.product(*map(range, ks)):
        idx = tuple(
            slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, n, s in zip(off, dil, n_in, stride)
        )
        for g in range(group):
            wg = w[(slice(g * cg, (g + 1) * cg), slice(None)) + off]
            y[(slice(None), slice(g * og, (g + 1) * og)) + idx] += np.einsum(
                "nc...,co->no...", x[:, g * cg : (g + 1) * cg], wg
            )
    crop = tuple(slice(p, f - p) for p, f in zip(pad, full))
    return y[(slice(None), slice(None)) + crop] + b.reshape((-1,) + (1,) * len(ks))


@pytest.mark.parametrize(
    "k,s,p,d,group",
    [(3, 2, 1, 1, 2), (2, 3, 0, 2, 1), (1, 2, 1, 1, 1), (3, 2, 3, 1, 3)],  # pad > extent−1
)
def test_deconv_matches_scatter_reference(k, s, p, d, group):
    x = RNG.standard_normal((2, 6, 4, 5)).astype(np.float32)
    w = RNG.standard_normal((6, 2, k, k)).astype(np.float32)
    b = RNG.standard_normal(2 * group).astype(np.float32)
    param = (
        f"convolution_param {{ num_output: {2 * group} kernel_size: {k} stride: {s} pad: {p} "
        f"dilation: {d} group: {group} }}"
    )
    _, blobs = run(net_text("Deconvolution", [x.shape], param), {"x": x}, [w, b])
    ref = deconv_ref(x, w, b, (s, s), (p, p), (d, d), group)
    assert blobs["y"].shape == ref.shape
    assert rel(blobs["y"], ref) < 1e-6


def test_im2col_times_weights_is_convolution():
    """Caffe's convolution is W (O, C·kh·kw) times the Im2col column buffer."""
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 3, 2)).astype(np.float32)
    geometry = "kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 1"
    _, blobs = run(net_text("Im2col", [x.shape], f"convolution_param {{ {geometry} }}"), {"x": x})
    cols = np.asarray(blobs["y"], np.float64)
    ours = np.einsum("ok,nk...->no...", w.reshape(4, -1).astype(np.float64), cols)
    ref = conv_ref(x, w, np.zeros(4), (2, 1), (1, 1), (1, 1), 1)
    assert rel(ours, ref) < 1e-6


# -- LRN and Crop -----------------------------------------------------------------------------


def test_lrn_across_channels_matches_numpy():
    x = RNG.standard_normal((2, 7, 3, 4)).astype(np.float32)
    param = "lrn_param { local_size: 5 alpha: 0.7 beta: 0.6 k: 1.5 }"
    _, blobs = run(net_text("LRN", [x.shape], param), {"x": x})
    sq = np.pad(x.astype(np.float64) ** 2, [(0, 0), (2, 2), (0, 0), (0, 0)])
    window = sum(sq[:, i : i + 7] for i in range(5))
    assert rel(blobs["y"], x * (1.5 + 0.7 / 5 * window) ** -0.6) < 1e-6


def test_crop_one_offset_for_every_cropped_axis():
    x = RNG.standard_normal((2, 5, 6, 7)).astype(np.float32)
    ref = np.zeros((2, 3, 4, 4), np.float32)
    text = net_text("Crop", [x.shape, ref.shape], "crop_param { axis: 1 offset: 1 }")
    _, blobs = run(text, {"x": x, "ref": ref})
    np.testing.assert_array_equal(blobs["y"], x[:, 1:4, 1:5, 1:5])


# -- errors Caffe raises ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,shapes,param,match",
    [
        ("Convolution", [(1, 2, 4, 4)], "convolution_param { num_output: 2 kernel_size: 7 }",
         "larger than the padded input"),
        ("Convolution", [(1, 2, 4, 4)],
         "convolution_param { num_output: 2 kernel_size: 3 dilation: 3 pad: 1 }",
         "larger than the padded input"),
        ("Convolution", [(1, 4, 5, 5)],
         "convolution_param { num_output: 3 kernel_size: 3 group: 2 }",
         "num_output 3 is not divisible by group 2"),
        ("Convolution", [(1, 3, 5, 5)],
         "convolution_param { num_output: 4 kernel_size: 3 group: 2 }",
         "channels 3 are not divisible by group 2"),
        ("Deconvolution", [(1, 3, 5, 5)],
         "convolution_param { num_output: 4 kernel_size: 3 group: 2 }",
         "channels 3 are not divisible by group 2"),
        ("Convolution", [(1, 3, 5, 5)],
         "convolution_param { num_output: 4 kernel_size: 3 kernel_size: 3 kernel_size: 3 }",
         "once per spatial dimension"),
        ("Convolution", [(1, 3, 5, 5, 5)],
         "convolution_param { num_output: 4 kernel_h: 3 kernel_w: 3 }",
         "only be used for 2D"),
        ("Convolution", [(1, 3, 5, 5)], "convolution_param { num_output: 4 }",
         "kernel_size must be specified"),
        ("Crop", [(1, 3, 5, 5), (1, 3, 4, 4)], "crop_param { axis: 2 offset: 2 }",
         "invalid crop in axis 2"),
        ("Crop", [(1, 3, 5, 5), (1, 3, 4, 4)], "crop_param { axis: 1 offset: 0 offset: 1 }",
         "2 offsets given for 3 cropped axes"),
        ("Crop", [(1, 3, 5, 5), (1, 3, 4)], "", "axes; they must be equal"),
        ("LRN", [(1, 3, 5, 5)], "lrn_param { local_size: 4 }", "odd values"),
    ],
)  # fmt: skip
def test_refused_configurations_name_the_layer(kind, shapes, param, match):
    with pytest.raises(NetError, match=rf"layer 'layer' \(type {kind}\).*{match}"):
        compile_net(net_text(kind, shapes, param))
