"""Common layers in ONNX (lowering/layers/common.py's semantics):

* InnerProduct → Flatten at ``axis`` + Gemm (``transB`` unless ``transpose``), reshaped back
  to ``shape[:axis] + (num_output,)`` when ``axis`` > 1.
* Embed → Gather of row ``int(x)`` (+ bias), NaN rows for an index outside ``[0, input_dim)``.
* Eltwise → Add of ``coeff_i·x_i`` (SUM), Mul (PROD), Max (MAX).
* Reduction → ReduceSum / ReduceL1 (ASUM) / ReduceSumSquare over the axes from ``axis``, times
  ``coeff`` (MEAN: ``coeff/count``); ``axis: 0`` gives a 0-d top.
* ArgMax → TopK on the reversed axis (Caffe's ties put the larger index first), indices as
  floats; without ``axis`` per item over all its values, shaped (N, 1|2, top_k, 1…).
* Softmax → Softmax on ``axis``. Scale / Bias → Mul / Add with the operand (bottom[1] or the
  blob) spanning the axes from ``axis``.
"""

from __future__ import annotations

import math

from onnx import TensorProto

from caffe2jax.frontend import caffe_pb2
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site

_ELTWISE = caffe_pb2.EltwiseParameter
_REDUCTION = caffe_pb2.ReductionParameter


@register("InnerProduct")
def inner_product(site: Site) -> list[str]:
    p = site.param.inner_product_param
    shape = site.bottom_shapes[0]
    axis = p.axis % len(shape)
    g = site.g
    x = site.bottoms[0]
    flat = x if (len(shape) == 2 and axis == 1) else g.op("Flatten", [x], axis=axis)
    inputs = [flat, site.blob(0)] + ([site.blob(1)] if p.bias_term else [])
    y = g.op("Gemm", inputs, transB=0 if p.transpose else 1)
    if axis == 1:
        return [y]
    return [site.reshape_top(y)]


@register("Embed")
def embed(site: Site) -> list[str]:
    p = site.param.embed_param
    g = site.g
    x = site.bottoms[0]
    index = g.cast(x, TensorProto.INT64)
    valid = g.op("And", [g.op("GreaterOrEqual", [index, g.i64(0)]),
                         g.op("Less", [index, g.i64(p.input_dim)])])  # fmt: skip
    safe = g.op("Clip", [index, g.i64(0), g.i64(p.input_dim - 1)])
    rows = g.op("Gather", [site.blob(0), safe], axis=0)
    rows = g.where(g.unsqueeze(valid, [-1]), rows, g.f32(float("nan")))
    return [g.op("Add", [rows, site.blob(1)]) if p.bias_term else rows]


@register("Eltwise")
def eltwise(site: Site) -> list[str]:
    p = site.param.eltwise_param
    g = site.g
    xs = list(site.bottoms)
    if p.operation == _ELTWISE.PROD:
        out = xs[0]
        for x in xs[1:]:
            out = g.op("Mul", [out, x])
        return [out]
    if p.operation == _ELTWISE.MAX:
        return [g.op("Max", xs)]
    coeffs = list(p.coeff) or [1.0] * len(xs)
    terms = [x if c == 1.0 else g.op("Mul", [x, g.f32(c)]) for c, x in zip(coeffs, xs)]
    out = terms[0]
    for t in terms[1:]:
        out = g.op("Add", [out, t])
    return [out]


@register("Reduction")
def reduction(site: Site) -> list[str]:
    p = site.param.reduction_param
    shape = site.bottom_shapes[0]
    axis = p.axis % len(shape) if shape else 0
    axes = list(range(axis, len(shape)))
    g = site.g
    x = site.bottoms[0]
    op = {_REDUCTION.ASUM: "ReduceL1", _REDUCTION.SUMSQ: "ReduceSumSquare"}.get(
        p.operation, "ReduceSum"
    )
    total = g.reduce(op, x, axes, keepdims=False) if axes else x
    factor = p.coeff / math.prod(shape[axis:]) if p.operation == _REDUCTION.MEAN else p.coeff
    return [total if factor == 1.0 else g.op("Mul", [total, g.f32(factor)])]


def top_k_caffe(site: Site, x: str, axis: int, size: int, k: int) -> tuple[str, str]:
    """(values, float indices) of the ``k`` largest along ``axis`` of length ``size``,
    descending, equal values with the larger index first (Caffe's partial_sort of pairs)."""
    g = site.g
    flipped = g.slice(x, [size - 1], [-size - 1], [axis], [-1])
    values, index = g.op("TopK", [flipped, g.i64([k])], outputs=2, axis=axis, largest=1,
                         sorted=1)  # fmt: skip
    index = g.op("Sub", [g.i64(size - 1), index])
    return values, g.cast(index, TensorProto.FLOAT)


@register("ArgMax")
def argmax(site: Site) -> list[str]:
    p = site.param.argmax_param
    shape = site.bottom_shapes[0]
    g = site.g
    x = site.bottoms[0]
    if p.HasField("axis"):
        axis = p.axis % len(shape)
        values, index = top_k_caffe(site, x, axis, shape[axis], p.top_k)
        return [values if p.out_max_val else index]
    flat = g.op("Flatten", [x], axis=1)
    values, index = top_k_caffe(site, flat, 1, math.prod(shape[1:]), p.top_k)
    rows = [g.unsqueeze(index, [1])]
    if p.out_max_val:
        rows.append(g.unsqueeze(values, [1]))
    out = g.op("Concat", rows, axis=1) if len(rows) > 1 else rows[0]
    extra = len(site.top_shapes[0]) - 3
    return [g.unsqueeze(out, list(range(3, 3 + extra))) if extra > 0 else out]


@register("Softmax")
def softmax(site: Site) -> list[str]:
    axis = site.param.softmax_param.axis % len(site.bottom_shapes[0])
    return [site.g.op("Softmax", site.bottoms, axis=axis)]


def operand(site: Site, value: str, shape, axis: int) -> str:
    """``value`` (of ``shape``, spanning bottom[0]'s axes from ``axis``) with trailing unit
    axes so that it broadcasts over the axes after its span."""
    ndim = len(site.bottom_shapes[0])
    axis = 0 if not shape else axis % ndim
    trailing = ndim - axis - len(shape)
    if trailing <= 0 or not shape:
        return value
    start = len(shape)
    return site.g.unsqueeze(value, list(range(start, start + trailing)))


def _learned(site: Site, j: int, axis: int) -> str:
    """Blob ``j`` as a constant shaped to broadcast from ``axis`` (folded at export)."""
    blob = site.array(j)
    ndim = len(site.bottom_shapes[0])
    axis = 0 if blob.ndim == 0 else axis % ndim
    shape = blob.shape + (1,) * (ndim - axis - blob.ndim)
    return site.g.const(blob.reshape(shape), hint="operand")


@register("Scale")
def scale(site: Site) -> list[str]:
    p = site.param.scale_param
    g = site.g
    x = site.bottoms[0]
    if len(site.bottoms) > 1:
        s = operand(site, site.bottoms[1], site.bottom_shapes[1], p.axis)
    else:
        s = _learned(site, 0, p.axis)
    y = g.op("Mul", [x, s])
    if p.bias_term:
        y = g.op("Add", [y, _learned(site, len(site.blobs) - 1, p.axis)])
    return [y]


@register("Bias")
def bias(site: Site) -> list[str]:
    p = site.param.bias_param
    x = site.bottoms[0]
    if len(site.bottoms) > 1:
        b = operand(site, site.bottoms[1], site.bottom_shapes[1], p.axis)
    else:
        b = _learned(site, 0, p.axis)
    return [site.g.op("Add", [x, b])]
