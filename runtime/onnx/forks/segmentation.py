"""SegNet / ENet / PSPNet / DeepLab layers in ONNX (lowering/fork_bn.py, fork_resample.py,
fork_neuron.py):

* BN ``segnet``: INFERENCE ``scale·x + shift``; LEARN the batch statistics in every phase,
  ``scale·(x − μ)/√(σ² + 1e-9) + shift`` with ``σ² = E[x²] − μ²`` over (N, H, W), tops 1 and 2
  μ and σ². BN ``pspnet``: ``slope·(x − mean)/√(var + eps) + bias`` → BatchNormalization.
* Upsample ``max_unpool`` → MaxUnpool: the mask (the Pooling's second top, ``h·W + w`` in the
  pooling input's plane) plus each plane's offset; a later value wins a shared index, as in
  the fork. Upsample ``nearest`` → each value repeated ``scale``×``scale`` (Expand + Reshape:
  exact copies).
* Interp (PSPNet, DeepLab v2; DeepLab v1's form with its own size rules) → Slice for
  ``pad_beg``/``pad_end`` crops, then Resize ``linear`` with ``align_corners``: the fork's
  ``(H_in − 1)/(H_out − 1)`` source coordinates (util/interp.cpp).
* ENet's ``spatial_dropout.SpatialDropoutLayer`` (built in): ``x/(1 − p)`` unless its
  ``param_str`` phase is TRAIN (random, refused).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from caffe2jax.frontend import caffe_pb2
from caffe2jax.lowering.forks.deeplab import interp_size
from caffe2jax.lowering.forks.enet import spatial_dropout_args
from caffe2jax.lowering.forks.segnet import SEGNET_EPS, unpool_size
from caffe2jax.runtime.onnx.layers.normalization import batch_normalization
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site

LEARN = caffe_pb2.BNParameter.LEARN


@register("BN", form="segnet")
def bn_segnet(site: Site) -> list[str]:
    g = site.g
    (x,) = site.bottoms
    scale, shift = (g.const(site.array(j).reshape(1, -1, 1, 1), hint=h)
                    for j, h in ((0, "scale"), (1, "shift")))  # fmt: skip
    if site.param.bn_param.bn_mode != LEARN:
        return [g.op("Add", [g.op("Mul", [scale, x]), shift])]
    axes = [0, 2, 3]
    mean = g.reduce("ReduceMean", x, axes)
    var = g.op("Sub", [g.reduce("ReduceMean", g.op("Mul", [x, x]), axes),
                       g.op("Mul", [mean, mean])])  # fmt: skip
    std = g.op("Sqrt", [g.op("Add", [var, g.f32(SEGNET_EPS)])])
    y = g.op("Add", [g.op("Div", [g.op("Mul", [scale, g.op("Sub", [x, mean])]), std]), shift])
    return [y, mean, var][: len(site.tops)]


@register("BN", form="pspnet")
def bn_pspnet(site: Site) -> list[str]:
    slope, bias, mean, var = (site.array(j).reshape(-1) for j in range(4))
    eps = site.param.bn_param.eps
    return [batch_normalization(site, site.bottoms[0], slope, bias, mean, var, eps)]


@register("Upsample", form="max_unpool")
def upsample_unpool(site: Site) -> list[str]:
    """SegNet's UpsampleLayer: values scattered to the mask's positions."""
    n, c, h, w = site.bottom_shapes[0]
    oh, ow = unpool_size(site.layer, (h, w))
    g = site.g
    x, mask = site.bottoms
    planes = np.arange(c, dtype=np.int64).reshape(1, c, 1, 1) * (oh * ow)
    if site.bottom_batch[0] is None:
        offset = g.const(planes + np.arange(n, dtype=np.int64).reshape(n, 1, 1, 1) * c * oh * ow)
    else:
        batch = g.reshape(g.op("Range", [g.i64(0), g.reshape(g.batch_size(), []), g.i64(1)]),
                          [-1, 1, 1, 1])  # fmt: skip
        offset = g.op("Add", [g.op("Mul", [batch, g.i64(c * oh * ow)]), g.const(planes)])
    index = g.op("Add", [g.cast(mask, TensorProto.INT64), offset])
    shape = site.shape_value([n, c, oh, ow], site.top_batch[0])
    return [g.op("MaxUnpool", [x, index, shape], kernel_shape=[1, 1])]


@register("Upsample", form="nearest")
def upsample_nearest(site: Site) -> list[str]:
    """The YOLO ports' nearest-neighbour Upsample: ``top[h, w] = x[h div s, w div s]``."""
    s = site.param.upsample_param.scale
    if s == 1:
        return list(site.bottoms)
    g = site.g
    grid = g.unsqueeze(site.bottoms[0], [3, 5])  # (N, C, H, 1, W, 1)
    spread = g.op("Expand", [grid, g.i64([1, 1, 1, s, 1, s])])
    return [site.reshape_top(spread)]


@register("Interp", form=("", "deeplab-v1"))
def interp(site: Site) -> list[str]:
    """InterpLayer: crop, then align-corners bilinear resize to the fork's size."""
    p = site.param.interp_param
    n, c, h, w = site.bottom_shapes[0]
    oh, ow = interp_size(site.layer, (h, w))
    g = site.g
    x = site.bottoms[0]
    if p.pad_beg or p.pad_end:
        x = g.slice(x, [-p.pad_beg] * 2, [h + p.pad_end, w + p.pad_end], [2, 3])
    eff = (h + p.pad_beg + p.pad_end, w + p.pad_beg + p.pad_end)
    if eff == (oh, ow):
        return [x]
    sizes = site.shape_value([n, c, oh, ow], site.top_batch[0])
    return [g.op("Resize", [x, "", "", sizes], mode="linear",
                 coordinate_transformation_mode="align_corners")]  # fmt: skip


@register("Python:spatial_dropout.SpatialDropoutLayer")
def spatial_dropout(site: Site) -> list[str]:
    site.require_builtin()
    phase, p = spatial_dropout_args(site.param.python_param.param_str, site.layer.where)
    if phase == "TRAIN":
        site.refuse("its param_str phase is TRAIN: it drops random channels on every forward")
    g = site.g
    return [g.op("Mul", [site.bottoms[0], g.f32(1.0 / (1.0 - p))])]
