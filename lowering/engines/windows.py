"""Pooling windows as strided slices, and MAX/AVE pooling backwards that XLA:CPU runs fast.

A pooling of kernel (k_h, k_w) and stride (s_h, s_w) reads, at each window offset (i, j), one
strided view of the padded input with the output's shape. Its backward puts each offset's
diff back at rows ``a·s + i`` — a scatter that XLA lowers to select_and_scatter (MAX) or to a
padded window sum (AVE), both slow on CPU (CIFAR-10 quick's pool1 backward: 57 ms). Here the
input rows are split by phase ``r mod s``: the offsets with ``i mod s = p`` land, shifted by
``i // s`` rows, on the rows of phase ``p``, so each phase is a sum of shifted views and the
phases interleave with one stack and reshape — elementwise work XLA fuses (5 ms).

Caffe's order is kept: its CPU backward loops over the outputs (ph, pw) row-major and adds
each diff into the input, so an input cell receives its windows' diffs in increasing (ph, pw),
which is decreasing (i, j); the sums here add the offsets in that order, starting from 0.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def spatial(x: jax.Array, nhwc: bool) -> tuple[int, ...]:
    """(H, W) of an NCHW blob, or of an NHWC one (the internal channels-last layout)."""
    return tuple(x.shape[1:3] if nhwc else x.shape[2:])


def on_hw(nhwc: bool, hw: tuple, other) -> tuple:
    """A per-axis tuple with ``hw`` on the spatial axes and ``other`` on N and C."""
    return (other, *hw, other) if nhwc else (other, other, *hw)


def padding(spec, hw: tuple[int, ...], nhwc: bool = False) -> list[tuple[int, int]]:
    """Window padding: ``pad`` before, enough after for the last (clipped) window."""
    after = [
        max((o - 1) * s + k - n - p, 0)
        for o, s, k, n, p in zip(spec.out, spec.stride, spec.kernel, hw, spec.pad)
    ]
    return list(on_hw(nhwc, tuple((p, a) for p, a in zip(spec.pad, after)), (0, 0)))


def offsets(spec) -> list[tuple[int, int]]:
    """The window offsets (i, j) in row-major order (Caffe's scan order inside a window)."""
    return [(i, j) for i in range(spec.kernel[0]) for j in range(spec.kernel[1])]


def offset_slices(x: jax.Array, spec, fill: float, nhwc: bool = False):
    """For each window offset (i, j) in row-major order: the strided view of the input at that
    offset of every window (shape (N, C, *out), or (N, *out, C) with ``nhwc``), the input
    padded with ``fill``."""
    padded = jnp.pad(x, padding(spec, spatial(x, nhwc), nhwc), constant_values=fill)
    (sh, sw), (oh, ow) = spec.stride, spec.out
    for i, j in offsets(spec):
        rows = slice(i, i + (oh - 1) * sh + 1, sh)
        cols = slice(j, j + (ow - 1) * sw + 1, sw)
        yield padded[on_hw(nhwc, (rows, cols), slice(None))]


def spread(parts, spec, hw: tuple[int, ...], nhwc: bool) -> jax.Array:
    """The transpose of :func:`offset_slices`: ``parts`` are ((i, j), diff) pairs of output
    shape, added in the order given; returns the input-shaped sum (padding cropped)."""
    pads = padding(spec, hw, nhwc)
    spatial_pad = pads[1:3] if nhwc else pads[2:]
    (sh, sw), (oh, ow) = spec.stride, spec.out
    ah, aw = (-(-(n + lo + hi) // s) for n, (lo, hi), s in zip(hw, spatial_pad, spec.stride))
    phases: dict[tuple[int, int], jax.Array] = {}
    for (i, j), g in parts:
        di, dj = i // sh, j // sw
        shift = ((di, ah - oh - di, 0), (dj, aw - ow - dj, 0))
        shifted = lax.pad(g, jnp.zeros((), g.dtype), list(on_hw(nhwc, shift, (0, 0, 0))))
        key = (i % sh, j % sw)
        phases[key] = phases[key] + shifted if key in phases else shifted
    some = next(iter(phases.values()))
    zeros = jnp.zeros_like(some)
    h_axis = 1 if nhwc else 2
    rows = [jnp.stack([phases.get((p, q), zeros) for q in range(sw)], h_axis + 2)
            for p in range(sh)]  # fmt: skip
    full = jnp.stack(rows, h_axis + 1)  # (..., ah, sh, aw, sw, ...)
    shape = list(some.shape)
    shape[h_axis : h_axis + 2] = [ah * sh, aw * sw]
    full = full.reshape(shape)
    crop = on_hw(nhwc, tuple(slice(lo, lo + n) for (lo, _), n in zip(spatial_pad, hw)),
                 slice(None))  # fmt: skip
    return full[crop]


def reduce_windows(x: jax.Array, spec, init: float, op, nhwc: bool = False) -> jax.Array:
    """``op``-reduce every window with XLA's reduce_window (padding holds ``init``), cropped to
    Caffe's output size."""
    out = lax.reduce_window(
        x,
        # A NumPy scalar stays concrete under jit, so JAX recognises max/add with their
        # identities as differentiable monoid reductions (a traced init is not).
        np.asarray(init, x.dtype),
        op,
        on_hw(nhwc, spec.kernel, 1),
        on_hw(nhwc, spec.stride, 1),
        padding(spec, spatial(x, nhwc), nhwc),
    )
    return out[on_hw(nhwc, tuple(slice(0, o) for o in spec.out), slice(None))]


def window_max(x: jax.Array, spec, nhwc: bool, views: bool = True) -> jax.Array:
    """The max of every window (padding never wins): an elementwise max of the views (5× faster
    than reduce_window on CPU), or with ``views=False`` XLA's reduce_window, which reads its
    input once: XLA:CPU fuses an elementwise producer into each view, so behind an expensive
    one (LRN's power) the views compute it k_h·k_w times (AlexNet b1: 1.2× slower)."""
    if not views:
        return reduce_windows(x, spec, -jnp.inf, lax.max, nhwc)
    views = offset_slices(x, spec, -jnp.inf, nhwc)
    y = next(views)
    for v in views:
        y = jnp.maximum(y, v)
    return y


@partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def max_first(x: jax.Array, spec, nhwc: bool, views: bool = True) -> jax.Array:
    """MAX pooling whose backward sends each top diff to the window's first maximum in
    row-major order — the element Caffe's strict ``>`` scan records in its mask."""
    return window_max(x, spec, nhwc, views)


def _max_first_fwd(x, spec, nhwc, views):
    y = window_max(x, spec, nhwc, views)
    return y, (x, y)


def _max_first_bwd(spec, nhwc, views, residuals, dy):
    x, y = residuals
    taken = jnp.zeros(y.shape, bool)
    zero = jnp.zeros((), dy.dtype)
    parts = []
    for offset, value in zip(offsets(spec), offset_slices(x, spec, -jnp.inf, nhwc)):
        hit = (value == y) & ~taken
        taken = taken | hit
        parts.append((offset, jnp.where(hit, dy, zero)))
    return (spread(parts[::-1], spec, spatial(x, nhwc), nhwc),)


max_first.defvjp(_max_first_fwd, _max_first_bwd)


def window_sum(x: jax.Array, spec, nhwc: bool, views: bool = True) -> jax.Array:
    """The zero-padded sum of every window: the views added in Caffe's row-major scan order,
    or (``views=False``, see :func:`window_max`) XLA's reduce_window."""
    if not views:
        return reduce_windows(x, spec, 0.0, lax.add, nhwc)
    views = offset_slices(x, spec, 0.0, nhwc)
    y = next(views)
    for v in views:
        y = y + v
    return y


def divisor(spec, hw: tuple[int, ...], dtype, nhwc: bool) -> jax.Array:
    """AVE's per-output divisor: the window clipped to [−pad, size + pad), as Caffe counts it,
    shaped to broadcast against the top. Built with traced ops (iota), never on the host:
    under shape inference it stays abstract however large the output is declared."""
    sizes = []
    for o, s, k, n, p in zip(spec.out, spec.stride, spec.kernel, hw, spec.pad):
        start = lax.iota(jnp.int64 if jax.config.jax_enable_x64 else jnp.int32, o) * s - p
        # a window starting past the input keeps the sign and zero of its size (all its
        # quotient 0 / size depends on) without overflowing start + k (a stride of 2^31 − 1)
        start = jnp.minimum(start, n + p + 1)
        sizes.append((jnp.minimum(start + k, n + p) - start).astype(dtype))
    d = sizes[0][:, None] * sizes[1][None, :]
    return d[:, :, None] if nhwc else d


def ave(x: jax.Array, spec, nhwc: bool, views: bool = True) -> jax.Array:
    """AVE pooling: the window sum over Caffe's clipped window size; the backward adds
    ``dy / size`` into every cell of the window."""
    return _ave(x, spec, nhwc, views, spatial(x, nhwc))


@partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _ave(x, spec, nhwc, views, hw):
    return window_sum(x, spec, nhwc, views) / divisor(spec, hw, x.dtype, nhwc)


def _ave_fwd(x, spec, nhwc, views, hw):
    return _ave(x, spec, nhwc, views, hw), None


def _ave_bwd(spec, nhwc, views, hw, _, dy):
    g = dy / divisor(spec, hw, dy.dtype, nhwc)
    return (spread([(o, g) for o in offsets(spec)[::-1]], spec, hw, nhwc),)


_ave.defvjp(_ave_fwd, _ave_bwd)
