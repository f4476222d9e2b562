"""Common layers: InnerProduct, Embed, Eltwise, Reduction, ArgMax, Softmax, Scale, Bias.

Each lowering reproduces the forward of Caffe's layer of the same name (BVLC 9b89154) in its
own blob layouts; gradients are JAX's, which equal Caffe's backward for these layers once the
forward is written as Caffe computes it (Eltwise MAX selects one bottom by index, so ties route
as Caffe's mask does; ArgMax has no backward).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.registry import ParamDecl, Shape, register
from caffe2jax.lowering.util import canonical_axis, count, fail

# -- InnerProduct -------------------------------------------------------------------------


def _ip_dims(layer: ir.Layer, shape: Shape) -> tuple[int, int, int]:
    """(axis, K, N): K = count(axis), N = num_output (InnerProductLayer::LayerSetUp)."""
    p = layer.param.inner_product_param
    axis = canonical_axis(layer, p.axis, len(shape))
    return axis, count(shape, axis), p.num_output


@register("InnerProduct", counts=(1, 1, 1, 1), bf16=True)
def inner_product(layer, params, bottoms, ctx):
    """y = x·Wᵀ + b over the axes from ``axis`` on; W is (N, K), or (K, N) with ``transpose``."""
    p = layer.param.inner_product_param
    (x,) = bottoms
    axis, k, n = _ip_dims(layer, x.shape)
    flat = x.reshape(count(x.shape, 0, axis), k)
    # W's K axis contracted in place: `flat @ W.T` left a transpose that XLA:CPU copies on every
    # call (GoogLeNet b1's classifier: 1.4 ms) or runs slowly (1×4096·4096: 44 vs 2.0 ms)
    y = lax.dot_general(flat, params[0], (((1,), (0 if p.transpose else 1,)), ((), ())))
    if p.bias_term:
        y = y + params[1]
    return [y.reshape(x.shape[:axis] + (n,))]


@inner_product.param_shapes
def _(layer, bottom_shapes):
    p = layer.param.inner_product_param
    _, k, n = _ip_dims(layer, bottom_shapes[0])
    decls = [ParamDecl((k, n) if p.transpose else (n, k), p.weight_filler)]
    if p.bias_term:
        decls.append(ParamDecl((n,), p.bias_filler))
    return decls


# -- Embed --------------------------------------------------------------------------------


@register("Embed", counts=(1, 1, 1, 1))
def embed(layer, params, bottoms, ctx):
    """Row ``int(x)`` of W (input_dim, num_output), plus the bias; top shape x.shape + (N,).

    Caffe only DCHECKs the index range (reads stray memory in release builds); here an index
    outside [0, input_dim) gives a row of NaN. Caffe refuses to differentiate the indices.
    """
    p = layer.param.embed_param
    idx = lax.stop_gradient(bottoms[0]).astype(jnp.int32)
    weights = params[0]
    rows = weights[jnp.clip(idx, 0, p.input_dim - 1)]
    valid = (idx >= 0) & (idx < p.input_dim)
    y = jnp.where(valid[..., None], rows, jnp.nan)
    if p.bias_term:
        y = y + params[1]
    return [y]


@embed.param_shapes
def _(layer, bottom_shapes):
    p = layer.param.embed_param
    if p.input_dim <= 0:
        raise fail(layer, "embed_param.input_dim must be positive")
    if p.num_output <= 0:
        raise fail(layer, "embed_param.num_output must be positive")
    decls = [ParamDecl((p.input_dim, p.num_output), p.weight_filler)]
    if p.bias_term:
        decls.append(ParamDecl((p.num_output,), p.bias_filler))
    return decls


# -- Eltwise ------------------------------------------------------------------------------

_ELTWISE = caffe_pb2.EltwiseParameter


def _check_same_shapes(layer: ir.Layer, bottoms: Sequence[jax.Array]) -> None:
    for name, b in zip(layer.bottom_names[1:], bottoms[1:]):
        if b.shape != bottoms[0].shape:
            raise fail(
                layer,
                f"bottom '{name}' {list(b.shape)} must have the shape of bottom "
                f"'{layer.bottom_names[0]}' {list(bottoms[0].shape)}",
            )


def _eltwise_max(bottoms: Sequence[jax.Array]) -> jax.Array:
    """Caffe's MAX with its mask: bottom 0 wins only if strictly above bottom 1 (a tie goes to
    bottom 1); later bottoms win only if strictly above the running max. Selecting by that
    index makes the gradient go to exactly the bottom Caffe's mask names."""
    stack = jnp.stack(bottoms)
    winner = jnp.argmax(stack, axis=0)  # first bottom holding the max
    winner = jnp.where((winner == 0) & (bottoms[0] == bottoms[1]), 1, winner)
    return jnp.take_along_axis(stack, winner[None], axis=0)[0]


@register("Eltwise", counts=(2, None, 1, 1), bf16=True)
def eltwise(layer, params, bottoms, ctx):
    """SUM (Σ coeff_i·x_i), PROD (Π x_i) or MAX over bottoms of one shape.

    ``stable_prod_grad`` only changes how Caffe computes PROD's backward: true (default)
    multiplies the other bottoms, false divides top by the bottom (differs by rounding, and is
    NaN where that bottom is 0). Both are the derivative of Π x_i, which is what we use.
    """
    p = layer.param.eltwise_param
    if p.coeff and p.operation != _ELTWISE.SUM:
        raise fail(layer, "Eltwise layer only takes coefficients for summation")
    if p.coeff and len(p.coeff) != len(bottoms):
        raise fail(
            layer, f"takes one coefficient per bottom blob: {len(p.coeff)} for {len(bottoms)}"
        )
    _check_same_shapes(layer, bottoms)
    if p.operation == _ELTWISE.PROD:
        return [functools.reduce(jnp.multiply, bottoms)]
    if p.operation == _ELTWISE.MAX:
        return [_eltwise_max(bottoms)]
    coeffs = list(p.coeff) or [1.0] * len(bottoms)
    return [functools.reduce(jnp.add, [c * b for c, b in zip(coeffs, bottoms)])]


# element by element over bottoms of one shape (refused otherwise): the same function in any
# layout (lowering/layout.py)
eltwise.nhwc(eltwise.fn)


# -- Reduction ----------------------------------------------------------------------------

_REDUCTION = caffe_pb2.ReductionParameter


@register("Reduction", counts=(1, 1, 1, 1))
def reduction(layer, params, bottoms, ctx):
    """SUM, ASUM, SUMSQ or MEAN over every axis from ``axis`` on, times ``coeff``.

    The top keeps the axes before ``axis`` (default axis 0: a 0-d top). ASUM's gradient is
    coeff·sign(x), 0 at x = 0 as Caffe's caffe_cpu_sign.
    """
    p = layer.param.reduction_param
    (x,) = bottoms
    axis = canonical_axis(layer, p.axis, x.ndim)
    dims = tuple(range(axis, x.ndim))
    if p.operation == _REDUCTION.ASUM:
        x = x * lax.stop_gradient(jnp.sign(x))  # |x| exactly; d/dx = sign(x)
    elif p.operation == _REDUCTION.SUMSQ:
        x = x * x
    total = jnp.sum(x, axis=dims)
    factor = p.coeff / count(x.shape, axis) if p.operation == _REDUCTION.MEAN else p.coeff
    return [total * factor if factor != 1.0 else total]


# -- ArgMax -------------------------------------------------------------------------------


def _top_k_last(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Caffe's partial_sort with greater<pair<value, index>>: the k largest values along the
    last axis, descending; equal values put the larger index first."""
    iota = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    neg_x, neg_i = lax.sort((-x, -iota), dimension=x.ndim - 1, num_keys=2)
    return -neg_x[..., :k], -neg_i[..., :k]


@register("ArgMax", counts=(1, 1, 1, 1))
def argmax(layer, params, bottoms, ctx):
    """Indices (or values) of the top_k maxima; no backward (outputs carry no gradient).

    With ``axis``: the bottom shape with that axis replaced by top_k, holding indices, or the
    values with ``out_max_val``. Without: per item over count(1) elements, shaped
    (N, 1|2, top_k, 1…) to at least 3 axes; with ``out_max_val`` row 0 holds indices, row 1
    values.
    """
    p = layer.param.argmax_param
    x = lax.stop_gradient(bottoms[0])
    if p.top_k < 1:
        raise fail(layer, "top_k must not be less than 1")
    if p.HasField("axis"):
        axis = canonical_axis(layer, p.axis, x.ndim)
        if p.top_k > x.shape[axis]:
            raise fail(layer, f"top_k {p.top_k} exceeds the size {x.shape[axis]} of axis {axis}")
        values, idx = _top_k_last(jnp.moveaxis(x, axis, -1), p.top_k)
        out = values if p.out_max_val else idx.astype(ctx.dtype)
        return [jnp.moveaxis(out, -1, axis)]
    dim = count(x.shape, 1)
    if p.top_k > dim:
        raise fail(layer, f"top_k {p.top_k} exceeds the {dim} values per item")
    values, idx = _top_k_last(x.reshape(x.shape[0], dim), p.top_k)
    rows = [idx.astype(ctx.dtype)] + ([values.astype(ctx.dtype)] if p.out_max_val else [])
    out = jnp.stack(rows, axis=1)
    return [out.reshape(out.shape + (1,) * (x.ndim - 3))]


# -- Softmax ------------------------------------------------------------------------------


@register("Softmax", counts=(1, 1, 1, 1))
def softmax(layer, params, bottoms, ctx):
    """exp(x − max) / Σ exp(x − max) along ``axis`` (default 1)."""
    (x,) = bottoms
    axis = canonical_axis(layer, layer.param.softmax_param.axis, x.ndim)
    return [jax.nn.softmax(x, axis=axis)]


# -- Scale and Bias -----------------------------------------------------------------------


def _param_operand_shape(layer: ir.Layer, shape: Shape, axis: int, num_axes: int) -> Shape:
    """The learned operand's shape: bottom axes [axis, axis+num_axes) (-1: to the end)."""
    axis = canonical_axis(layer, axis, len(shape))
    if num_axes < -1:
        raise fail(layer, "num_axes must be non-negative, or -1 to extend to the end of bottom[0]")
    if num_axes >= 0 and axis + num_axes > len(shape):
        raise fail(
            layer,
            f"the operand's shape extends past bottom[0]'s shape {list(shape)} when applied "
            f"starting with axis {axis} for {num_axes} axes",
        )
    return tuple(shape[axis:] if num_axes == -1 else shape[axis : axis + num_axes])


def _broadcast_operand(layer: ir.Layer, x: jax.Array, operand: jax.Array, axis: int, name: str):
    """Caffe's (outer, operand, inner) view: the operand spans x's axes from ``axis`` on
    (axis 0 for a 0-d operand). The operand's shape must equal those axes of x."""
    k = operand.ndim
    axis = 0 if k == 0 else canonical_axis(layer, axis, x.ndim)
    if tuple(x.shape[axis : axis + k]) != tuple(operand.shape):
        raise fail(
            layer,
            f"{name} {list(operand.shape)} does not match the axes from {axis} of bottom "
            f"'{layer.bottom_names[0]}' {list(x.shape)}",
        )
    return operand.reshape((1,) * axis + operand.shape + (1,) * (x.ndim - axis - k))


def _operand_name(layer: ir.Layer, n_bottoms: int, what: str) -> str:
    return f"bottom '{layer.bottom_names[1]}'" if n_bottoms > 1 else what


@register("Scale", counts=(1, 2, 1, 1), bf16=True)
def scale(layer, params, bottoms, ctx):
    """y = x ⊙ s (+ b): s is bottom[1] or a learned blob spanning ``num_axes`` axes from
    ``axis``; ``bias_term`` adds a learned bias of the same span (Caffe's internal BiasLayer)."""
    p = layer.param.scale_param
    x = bottoms[0]
    s = bottoms[1] if len(bottoms) > 1 else params[0]
    y = x * _broadcast_operand(layer, x, s, p.axis, _operand_name(layer, len(bottoms), "scale"))
    if p.bias_term:
        y = y + _broadcast_operand(layer, x, params[-1], p.axis, "bias")
    return [y]


def _per_channel(layer, shapes) -> bool:
    """A learned scale over the channel axis alone of a 4-D bottom: the channels-last form."""
    p = layer.param.scale_param
    return len(shapes) == 1 and p.axis in (1, -3) and p.num_axes == 1


@scale.nhwc(when=_per_channel)
def _(layer, params, bottoms, ctx):
    """The same on a channels-last (N, H, W, C) bottom: the (C,) blobs broadcast on the last
    axis (lowering/layout.py)."""
    y = bottoms[0] * params[0]
    return [y + params[-1] if layer.param.scale_param.bias_term else y]


@scale.param_shapes
def _(layer, bottom_shapes):
    p = layer.param.scale_param
    x = bottom_shapes[0]
    decls = []
    if len(bottom_shapes) == 1:
        shape = _param_operand_shape(layer, x, p.axis, p.num_axes)
        filler = p.filler if p.HasField("filler") else caffe_pb2.FillerParameter(value=1.0)
        decls.append(ParamDecl(shape, filler))
    if p.bias_term:
        num_axes = len(bottom_shapes[1]) if len(bottom_shapes) > 1 else p.num_axes
        decls.append(ParamDecl(_param_operand_shape(layer, x, p.axis, num_axes), p.bias_filler))
    return decls


@register("Bias", counts=(1, 2, 1, 1), bf16=True)
def bias(layer, params, bottoms, ctx):
    """y = x + b: b is bottom[1] or a learned blob spanning ``num_axes`` axes from ``axis``."""
    p = layer.param.bias_param
    x = bottoms[0]
    b = bottoms[1] if len(bottoms) > 1 else params[0]
    return [x + _broadcast_operand(layer, x, b, p.axis, _operand_name(layer, len(bottoms), "bias"))]


@bias.param_shapes
def _(layer, bottom_shapes):
    p = layer.param.bias_param
    if len(bottom_shapes) > 1:
        return []
    return [ParamDecl(_param_operand_shape(layer, bottom_shapes[0], p.axis, p.num_axes), p.filler)]
