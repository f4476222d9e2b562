"""Normalisation layers in ONNX (lowering/layers/normalization.py's semantics):

* BatchNorm with its global statistics (TEST's default): the moving-average scale factor is
  folded at export, ``mean = blob0/blob2``, ``var = blob1/blob2`` (0 when blob2 is 0), and the
  layer is BatchNormalization with scale 1 and bias 0: ``(x − mean)/√(var + eps)``. With
  ``use_global_stats: false`` (batch statistics in TEST): the batch mean and biased variance
  over (N, spatial) per channel.
* MVN: ``x − mean`` per (n, c), or per n with ``across_channels``; with
  ``normalize_variance`` divided by ``√(mean((x − mean)²)) + eps`` (eps on the std).
"""

from __future__ import annotations

import numpy as np

from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site


def global_stats(site: Site) -> tuple[np.ndarray, np.ndarray]:
    """BatchNorm's (mean, variance) from its blobs, the scale factor folded in float32 as
    caffe2jax computes them."""
    mean_sum, var_sum, factor = site.array(0), site.array(1), site.array(2)
    f = np.float32(factor.reshape(-1)[0])
    inv = np.float32(0.0) if f == 0 else np.float32(1.0) / f
    return (mean_sum * inv).astype(np.float32), (var_sum * inv).astype(np.float32)


def batch_normalization(site: Site, x: str, scale, bias, mean, var, eps: float) -> str:
    """ONNX BatchNormalization of ``x`` (N, C, ...) with per-channel constants."""
    g = site.g
    named = (("scale", scale), ("bias", bias), ("mean", mean), ("var", var))
    consts = [g.const(np.asarray(v, np.float32).reshape(-1), hint=h) for h, v in named]
    return g.op("BatchNormalization", [x, *consts], epsilon=float(np.float32(eps)))


def _uses_global_stats(site: Site) -> bool:
    p = site.param.batch_norm_param
    return p.use_global_stats if p.HasField("use_global_stats") else True


def batch_statistics(site: Site, x: str, axes: list[int]) -> tuple[str, str]:
    """(mean, biased variance) of ``x`` over ``axes``, kept as broadcastable values."""
    g = site.g
    mean = g.reduce("ReduceMean", x, axes)
    centered = g.op("Sub", [x, mean])
    return mean, g.reduce("ReduceMean", g.op("Mul", [centered, centered]), axes)


@register("BatchNorm")
def batch_norm(site: Site) -> list[str]:
    p = site.param.batch_norm_param
    shape = site.bottom_shapes[0]
    (x,) = site.bottoms
    g = site.g
    if _uses_global_stats(site):
        mean, var = global_stats(site)
        if len(shape) >= 2:
            ones = np.ones_like(mean)
            return [batch_normalization(site, x, ones, np.zeros_like(mean), mean, var, p.eps)]
        std = np.sqrt(var + np.float32(p.eps)).astype(np.float32)
        centered = g.op("Sub", [x, g.const(mean.reshape(()))])
        return [g.op("Div", [centered, g.const(std.reshape(()))])]
    if len(shape) < 2:
        site.refuse("batch statistics of a 1-D blob")
    axes = [0, *range(2, len(shape))]
    mean, var = batch_statistics(site, x, axes)
    std = g.op("Sqrt", [g.op("Add", [var, g.f32(p.eps)])])
    return [g.op("Div", [g.op("Sub", [x, mean]), std])]


@register("MVN")
def mvn(site: Site) -> list[str]:
    p = site.param.mvn_param
    shape = site.bottom_shapes[0]
    (x,) = site.bottoms
    g = site.g
    axes = list(range(1 if p.across_channels else 2, len(shape)))
    if not axes:  # one value per row: x − mean is 0
        return [g.op("Sub", [x, x])]
    mean = g.reduce("ReduceMean", x, axes)
    centered = g.op("Sub", [x, mean])
    if not p.normalize_variance:
        return [centered]
    var = g.reduce("ReduceMean", g.op("Mul", [centered, centered]), axes)
    denom = g.op("Add", [g.op("Sqrt", [var]), g.f32(p.eps)])
    return [g.op("Div", [centered, denom])]
