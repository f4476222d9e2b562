"""The forms a 2-D (or N-D) cross-correlation with Caffe-layout weights can run in.

Arrays and geometry in, array out; nothing here knows a layer. ``x`` is Caffe's (N, C,
*spatial) or, with ``channels_last``, (N, H, W, C); ``w`` is Caffe's (num_output, C/group,
*kernel) in every form. The engine policy (policy.py) picks the form per convolution when a
net is planned; each equals :func:`general` to float rounding (tests/lowering/engines/
test_conv_forms.py):

* ``xla``: :func:`general`, ``lax.conv_general_dilated`` with the layout as a parameter.
* ``onednn``: oneDNN's primitives (onednn.py), 2-D float32 on the CPU.
* ``onednn-blocked``: the same, the weight diff on oneDNN's blocked activations
  (blocked_grads.py: large kernels, channels-last).
* ``pointwise``: a channels-last 1×1 convolution as one matrix product over channels.
* ``pointwise-dnn``: the same forward, its gradients by oneDNN's backward primitives (XLA:CPU
  transposes the pixels × channels operands for the two gradient products).
* ``patches``: a channels-last convolution as Caffe computes it, im2col + one matrix product.
* ``onednn-dwpatches``: oneDNN's forward and backward-data; the weight diff as Caffe's
  ``weight_cpu_gemm`` computes it, one matrix product of the top diff and the im2col patches
  (on a small image oneDNN's backward-weights primitive is the slower: benchmarks/
  crnn_train.py, docs/performance.md). A forward-only program packs its weights as ``onednn``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.lowering.engines import blocked_grads, folding, fused, onednn, packing

Ints = Sequence[int]


def general(x, w, stride: Ints, pad: Ints, dilation: Ints, group: int, channels_last: bool):
    """The plain form: XLA's convolution, channels-last or Caffe's layout (N-D in the latter)."""
    return lax.conv_general_dilated(
        x,
        w,
        tuple(stride),
        [(p, p) for p in pad],
        rhs_dilation=tuple(dilation),
        feature_group_count=group,
        dimension_numbers=("NHWC", "OIHW", "NHWC") if channels_last else None,
    )


def pointwise(x: jax.Array, w: jax.Array, stride: Ints) -> jax.Array:
    """(N, H, W, C) ⊛ (O, C, 1, 1): the strided pixels times Wᵀ, contracted in place (XLA:CPU
    would otherwise copy the kernel into HWIO on every call)."""
    if any(s > 1 for s in stride):
        x = x[:, :: stride[0], :: stride[1], :]
    w2 = w.reshape(w.shape[:2])
    return lax.dot_general(x, w2, (((3,), (1,)), ((), ())))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def pointwise_dnn(g: onednn.Geometry, x: jax.Array, w: jax.Array, stride: tuple) -> jax.Array:
    """:func:`pointwise`'s forward; its gradients are oneDNN's (the convolution's true
    derivative, as :func:`pointwise`'s autodiff, to float summation order). On a training
    step's large 1×1 convolutions XLA:CPU's gradient products lay the (pixels, channels)
    operands out channel-major with a transpose each; oneDNN's backward-weights reads them in
    place (benchmarks/ssd_train.py, docs/performance.md)."""
    return pointwise(x, w, stride)


def _pointwise_dnn_fwd(g, x, w, stride):
    return pointwise(x, w, stride), (x, w)


def _pointwise_dnn_bwd(g, stride, res, dy):
    return onednn.backward(g, *res, dy)


pointwise_dnn.defvjp(_pointwise_dnn_fwd, _pointwise_dnn_bwd)


def patches(x: jax.Array, w: jax.Array, stride: Ints, pad: Ints, dilation: Ints) -> jax.Array:
    """(N, H, W, C) ⊛ (O, C, kh, kw) as Caffe's im2col + GEMM: patches ordered (i, j, c), one
    matrix product with a contraction deep enough for the CPU where C is small."""
    (kh, kw), (sh, sw), (dh, dw) = w.shape[2:], stride, dilation
    ph, pw = pad
    xp = jnp.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)])
    oh = (xp.shape[1] - (dh * (kh - 1) + 1)) // sh + 1
    ow = (xp.shape[2] - (dw * (kw - 1) + 1)) // sw + 1
    columns = jnp.concatenate(
        [xp[:, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw]
         for i in range(kh) for j in range(kw)],
        axis=3,
    )  # fmt: skip
    w2 = jnp.transpose(w, (0, 2, 3, 1)).reshape(w.shape[0], -1)
    return lax.dot_general(columns, w2, (((3,), (1,)), ((), ())))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def onednn_dwpatches(g: onednn.Geometry, x: jax.Array, w: jax.Array) -> jax.Array:
    """oneDNN's convolution ``g`` (channels-last, ungrouped) whose weight diff is the patches
    product: Σ over pixels of dy ⊗ im2col(x), the convolution's true derivative (to float
    summation order), as :func:`patches`' autodiff computes it."""
    return onednn.conv2d(g, x, w)


def _dwpatches_fwd(g, x, w):
    return onednn.conv2d(g, x, w), (x, w)


def _dwpatches_bwd(g, res, dy):
    x, w = res
    dx = onednn.call("bwd_data", g, g.shaped(g.x), dy, w)
    # after oneDNN's call, not beside it: its OpenMP threads and XLA's pool share the cores
    dx, x, dy = lax.optimization_barrier((dx, x, dy))
    _, vjp = jax.vjp(lambda w: patches(x, w, g.stride, g.pad, g.dilation), w)
    return dx, vjp(dy)[0]


onednn_dwpatches.defvjp(_dwpatches_fwd, _dwpatches_bwd)


def convolve(
    form: str, x, w, stride: Ints, pad: Ints, dilation: Ints, group: int, channels_last: bool
) -> jax.Array:
    """The convolution of ``x`` with ``w`` (no bias) in ``form`` (see the module docstring);
    ``w`` may be a forward-only program's :class:`~packing.PackedWeights` (packing.py), or
    :class:`~folding.Folded` weights with a BatchNorm and Scale folded in (folding.py)."""
    if isinstance(w, folding.Folded):
        if isinstance(w.weights, packing.PackedWeights) and fused.is_fused(w.weights.key):
            g = onednn.geometry(x, w, stride, pad, dilation, group, channels_last)
            return fused.convolve(g, x, w.weights, w.bias, w.relu)
        y = convolve(form, x, w.weights, stride, pad, dilation, group, channels_last)
        return folding.epilogue(y, w, channels_last)
    if isinstance(w, packing.PackedWeights):
        if form not in ("onednn", "onednn-blocked", "onednn-dwpatches"):  # one forward
            raise ValueError(f"packed weights of {w.slot} reached a {form!r} convolution")
        g = onednn.geometry(x, w, stride, pad, dilation, group, channels_last)
        return packing.convolve(g, x, w)
    if form == "onednn":
        return onednn.convolution(x, w, stride, pad, dilation, group, channels_last)
    if form == "onednn-blocked":
        return blocked_grads.convolution(x, w, stride, pad, dilation, group, channels_last)
    if form == "onednn-dwpatches":
        g = onednn.geometry(x, w, stride, pad, dilation, group, channels_last)
        return onednn_dwpatches(g, x, w)
    if form == "pointwise":
        return pointwise(x, w, stride)
    if form == "pointwise-dnn":
        g = onednn.geometry(x, w, stride, pad, dilation, group, channels_last)
        return pointwise_dnn(g, x, w, tuple(stride))
    if form == "patches":
        return patches(x, w, stride, pad, dilation)
    if form != "xla":
        raise ValueError(f"unknown convolution form {form!r}")
    return general(x, w, stride, pad, dilation, group, channels_last)
