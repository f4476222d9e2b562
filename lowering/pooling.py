"""Pooling and SPP: Caffe's PoolingLayer (MAX, AVE, STOCHASTIC) and SPPLayer.

Reproduced from Caffe (pooling_layer.cpp/.cu, spp_layer.cpp):

* Output size ``ceil((H + 2p − k)/s) + 1`` (``floor`` with ``round_mode: FLOOR``), then minus 1
  on an axis whose last window would start in the padding (``(out−1)·s ≥ H + p``) when any pad
  is non-zero. Windows past the input are clipped.
* MAX ignores padding; its backward routes each top diff to the first maximum in the window's
  row-major scan. An optional second top holds that argmax as the float ``h·W + w``.
* AVE divides by the window clipped to ``[−p, H + p)``: padded cells count, cells past the
  padded border do not.
* STOCHASTIC (Caffe's GPU kernels; there is no CPU one): TRAIN draws one element per window
  with probability ``x / Σx`` and back-propagates only to it; TEST outputs
  ``Σx² / (FLT_MIN + Σx)``.
* SPP: level ``i`` pools ``2^i × 2^i`` bins with kernel ``ceil(H / 2^i)``, stride = kernel and
  pad ``(kernel·2^i − H + 1) / 2``, then flattens; levels are concatenated along axis 1. With
  ``pyramid_height: 1`` the single pooling's 4-D top is the output.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.engines import windows
from caffe2jax.lowering.engines.windows import offset_slices, spatial
from caffe2jax.lowering.registry import Context, register
from caffe2jax.lowering.util import fail

P = caffe_pb2.PoolingParameter
MAX, AVE, STOCHASTIC = P.MAX, P.AVE, P.STOCHASTIC
_NAMES = {MAX: "MAX", AVE: "AVE", STOCHASTIC: "STOCHASTIC"}
# Caffe's FLT_MIN (the smallest normal float), the start of its TEST-time stochastic sum.
_FLT_MIN = float(np.finfo(np.float32).tiny)
_FLT_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class PoolSpec:
    """One pooling's static geometry over the two spatial axes (H, W) of an NCHW blob."""

    method: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]
    out: tuple[int, int]


def pooled_size(size: int, kernel: int, stride: int, pad: int, ceil: bool, padded: bool) -> int:
    """Caffe's pooled size on one axis (``padded``: any of pad_h/pad_w is non-zero)."""
    span = size + 2 * pad - kernel
    out = (-(-span // stride) if ceil else span // stride) + 1
    if padded and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def make_spec(
    layer: ir.Layer,
    method: int,
    hw: tuple[int, int],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    pad: tuple[int, int],
    ceil: bool = True,
) -> PoolSpec:
    """Validate a pooling geometry as PoolingLayer::LayerSetUp/Reshape do; compute the size."""
    if min(kernel) <= 0:
        raise fail(layer, f"pooling kernel {list(kernel)} must be positive")
    if min(stride) <= 0:
        raise fail(layer, f"pooling stride {list(stride)} must be positive")
    padded = any(pad)
    if padded and method not in (MAX, AVE):
        raise fail(layer, "padding is implemented only for AVE and MAX pooling")
    if padded and any(p >= k for p, k in zip(pad, kernel)):
        raise fail(layer, f"pooling pad {list(pad)} must be smaller than kernel {list(kernel)}")
    out = tuple(
        pooled_size(n, k, s, p, ceil, padded) for n, k, s, p in zip(hw, kernel, stride, pad)
    )
    if min(out) < 1:
        raise fail(
            layer,
            f"pooling kernel {list(kernel)} with pad {list(pad)} and stride {list(stride)} "
            f"gives an empty output for input {list(hw)}",
        )
    return PoolSpec(method, kernel, stride, pad, out)  # type: ignore[arg-type]


def _pair(layer, p, name: str, default: int | None) -> tuple[int, int]:
    """``name`` or ``name_h``/``name_w`` of a PoolingParameter (Caffe's either-or rule)."""
    has_h, has_w = p.HasField(f"{name}_h"), p.HasField(f"{name}_w")
    field = "kernel_size" if name == "kernel" else name
    if has_h or has_w:
        if p.HasField(field) or not (has_h and has_w):
            raise fail(layer, f"give {field} OR both {name}_h and {name}_w")
        return getattr(p, f"{name}_h"), getattr(p, f"{name}_w")
    if default is None and not p.HasField(field):
        raise fail(layer, "pooling needs kernel_size, or kernel_h and kernel_w")
    value = getattr(p, field) if p.HasField(field) else default
    return value, value


def pooling_spec(layer: ir.Layer, shape: tuple[int, ...]) -> PoolSpec:
    """The PoolSpec of a Pooling layer for a bottom of ``shape``."""
    if len(shape) != 4:
        raise fail(layer, f"input must have 4 axes (num, channels, height, width), got {shape}")
    p = layer.param.pooling_param
    hw = (shape[2], shape[3])
    if p.global_pooling:
        if p.HasField("kernel_size") or p.HasField("kernel_h") or p.HasField("kernel_w"):
            raise fail(layer, "with global_pooling the kernel size cannot be given")
        kernel = hw
    else:
        kernel = _pair(layer, p, "kernel", None)
    pad = _pair(layer, p, "pad", p.pad)
    stride = _pair(layer, p, "stride", p.stride)
    if p.global_pooling and (any(pad) or stride != (1, 1)):
        raise fail(layer, "with global_pooling only pad = 0 and stride = 1 are allowed")
    return make_spec(layer, p.pool, hw, kernel, stride, pad, p.round_mode == P.CEIL)


# -- the computations -------------------------------------------------------------------------

# How MAX and AVE pooling run: "phases" (lowering/engines/windows.py: the windows as strided views,
# their backward as shifted sums per stride phase, all fusible), "xla" (reduce_window, whose
# backward is select_and_scatter / a padded window sum), or "auto": phases on the CPU, where
# benchmarks/fast_paths.py --path pool measured it; elsewhere what the GPU table in
# docs/performance.md was measured with (reduce_window forwards; MAX's backward as per-offset
# selects where windows do not overlap, select_and_scatter where they do; AVE's autodiff).
# ``$CAFFE2JAX_POOL`` (auto|phases|xla), read when a net is traced, overrides it: "phases" is
# a jax.custom_vjp, which forward-mode autodiff (jax.jvp, jax.jacfwd) cannot go through.
POOL_BACKWARD = "auto"
POOL_ENV = "CAFFE2JAX_POOL"


def _form() -> str:
    """The pooling form in force: phases, xla, or (off the CPU) auto; see POOL_BACKWARD."""
    form = os.environ.get(POOL_ENV, "").strip().lower() or POOL_BACKWARD
    if form not in ("auto", "phases", "xla"):
        raise ValueError(f"${POOL_ENV}={form!r}: use auto, phases or xla")
    return "phases" if form == "auto" and jax.default_backend() == "cpu" else form


def _window(x: jax.Array, spec: PoolSpec, init: float, op, nhwc: bool = False) -> jax.Array:
    return windows.reduce_windows(x, spec, init, op, nhwc)


# Layers whose output XLA:CPU would recompute in each of the window views it is fused into
# (they call exp, log or pow per element): behind one, MAX/AVE pooling reads through
# reduce_window, which reads its input once (lowering/engines/windows.py window_max).
EXPENSIVE_PRODUCERS = frozenset(
    {"LRN", "Sigmoid", "TanH", "Power", "Exp", "Log", "BNLL", "ELU", "Swish", "Softmax", "MVN"}
)


def _views(ctx: Context | None) -> bool:
    """Whether the pooling may read its bottom as k_h·k_w fused views (see above)."""
    return ctx is None or not (set(ctx.bottom_types[:1]) & EXPENSIVE_PRODUCERS)


def max_pool(x: jax.Array, spec: PoolSpec, nhwc: bool = False, views: bool = True) -> jax.Array:
    """MAX over each window, padding ignored; the backward routes each diff to the window's
    first maximum in row-major order, as Caffe's mask does.

    Both forms keep that rule: windows.max_first by its per-offset ``==`` selects, XLA's
    select_and_scatter by its ``>=`` select in the window's row-major order
    (tests/lowering/test_vision.py checks both on tied inputs).
    """
    form = _form()
    if form == "auto" and all(k <= s for k, s in zip(spec.kernel, spec.stride)):
        y = windows.max_first(x, spec, nhwc, False)
    elif form == "phases":
        y = windows.max_first(x, spec, nhwc, views)
    else:
        y = _window(x, spec, -jnp.inf, lax.max, nhwc)
    if _has_empty_window(spec, spatial(x, nhwc)):  # kernel < stride: Caffe leaves its -FLT_MAX
        y = jnp.where(jnp.isneginf(y), jnp.asarray(-_FLT_MAX, y.dtype), y)
    return y


def _has_empty_window(spec: PoolSpec, hw: tuple[int, ...]) -> bool:
    """Whether the last window on some axis starts past the input (possible without pad)."""
    return any((o - 1) * s - p >= n for o, s, p, n in zip(spec.out, spec.stride, spec.pad, hw))


def ave_pool(x: jax.Array, spec: PoolSpec, nhwc: bool = False, views: bool = True) -> jax.Array:
    """AVE: the zero-padded window sum over Caffe's clipped window size."""
    if _form() == "phases":
        return windows.ave(x, spec, nhwc, views)
    hw = spatial(x, nhwc)
    return _window(x, spec, 0.0, lax.add, nhwc) / windows.divisor(spec, hw, x.dtype, nhwc)


def max_mask(x: jax.Array, spec: PoolSpec) -> jax.Array:
    """Caffe's MAX mask top: the flat index ``h·W + w`` of the first maximum, as a float.

    A scan over the k_h·k_w window offsets (a static loop) with Caffe's strict ``>`` test and
    its ``−FLT_MAX`` start, so ties keep the earlier element. Carries no gradient.
    """
    x = lax.stop_gradient(x)
    h, w = x.shape[2:]
    index = jnp.broadcast_to(jnp.arange(h * w, dtype=x.dtype).reshape(1, 1, h, w), x.shape)
    best = jnp.full(x.shape[:2] + spec.out, -_FLT_MAX, x.dtype)
    arg = jnp.full(best.shape, -1, x.dtype)
    for value, where in zip(offset_slices(x, spec, -jnp.inf), offset_slices(index, spec, -1)):
        take = value > best
        best = jnp.where(take, value, best)
        arg = jnp.where(take, where, arg)
    return arg


def stochastic_pool(x: jax.Array, spec: PoolSpec, train: bool, ctx: Context) -> jax.Array:
    """STOCHASTIC pooling as Caffe's GPU kernels compute it (windows clipped, never padded).

    TRAIN: threshold ``u·Σx`` with ``u ~ U[0, 1)`` per window; the output is the first element
    (row-major) whose running sum reaches it. Its gradient reaches only that element, which is
    what autodiff of the gather gives (the choice itself is integer-valued). TEST:
    ``Σx² / (FLT_MIN + Σx)``; its gradient is the true derivative of that forward.
    """
    if not train:
        squares = _window(x * x, spec, 0.0, lax.add)
        return squares / (_window(x, spec, 0.0, lax.add) + jnp.asarray(_FLT_MIN, x.dtype))
    patches = jnp.stack(list(offset_slices(x, spec, 0.0)), axis=-1)
    running = jnp.cumsum(patches, axis=-1)
    u = jax.random.uniform(ctx.key(), running.shape[:-1], x.dtype)
    threshold = u * running[..., -1]
    chosen = lax.stop_gradient(jnp.argmax(running >= threshold[..., None], axis=-1))
    return jnp.take_along_axis(patches, chosen[..., None], axis=-1)[..., 0]


def pool_nhwc(x: jax.Array, spec: PoolSpec, ctx: Context | None = None) -> jax.Array:
    """MAX or AVE pooling of a channels-last ``x`` (N, H, W, C) (see ``lowering/layout.py``)."""
    form = max_pool if spec.method == MAX else ave_pool
    return form(x, spec, nhwc=True, views=_views(ctx))


def pool(x: jax.Array, spec: PoolSpec, train: bool, ctx: Context) -> jax.Array:
    """The pooled top of ``x`` (N, C, H, W) for ``spec``."""
    if spec.method == MAX:
        return max_pool(x, spec, views=_views(ctx))
    if spec.method == AVE:
        return ave_pool(x, spec, views=_views(ctx))
    return stochastic_pool(x, spec, train, ctx)


# -- the layers -------------------------------------------------------------------------------


@register("Pooling", counts=(1, 1, 1, 2))
def pooling(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """PoolingLayer: one top, or for MAX a second top with the argmax mask."""
    if len(bottoms) != 1:
        raise fail(layer, f"takes exactly 1 bottom, got {len(bottoms)}")
    (x,) = bottoms
    spec = pooling_spec(layer, tuple(x.shape))
    n_tops = len(layer.tops)
    if n_tops not in (1, 2) or (n_tops == 2 and spec.method != MAX):
        raise fail(
            layer,
            f"{_NAMES[spec.method]} pooling has {'1 or 2 tops' if spec.method == MAX else '1 top'}"
            f", got {n_tops}",
        )
    y = pool(x, spec, ctx.train, ctx)
    return [y, max_mask(x, spec)] if n_tops == 2 else [y]


def spp_spec(layer: ir.Layer, method: int, hw: tuple[int, int], level: int) -> PoolSpec:
    """SPPLayer::GetPoolingParam: the pooling of pyramid level ``level``."""
    bins = 2**level
    kernel = tuple(math.ceil(n / bins) for n in hw)
    pad = tuple((k * bins - n + 1) // 2 for k, n in zip(kernel, hw))
    return make_spec(layer, method, hw, kernel, kernel, pad)  # type: ignore[arg-type]


@register("SPP", counts=(1, 1, 1, 1))
def spp(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """SPPLayer: pyramid levels of pooling, each flattened, concatenated along axis 1.

    Caffe builds each level's PoolingLayer from a fresh LayerParameter whose phase is the
    default TRAIN, so STOCHASTIC SPP samples in every phase; this reproduces that.
    """
    if len(bottoms) != 1 or len(layer.tops) != 1:
        raise fail(layer, "takes exactly 1 bottom and 1 top")
    (x,) = bottoms
    if x.ndim != 4:
        raise fail(layer, f"input must have 4 axes (num, channels, height, width), got {x.shape}")
    p = layer.param.spp_param
    if p.pyramid_height < 1:
        raise fail(layer, "spp_param.pyramid_height must be at least 1")
    method = P.PoolMethod.Value(caffe_pb2.SPPParameter.PoolMethod.Name(p.pool))
    hw = (x.shape[2], x.shape[3])
    specs = [spp_spec(layer, method, hw, level) for level in range(p.pyramid_height)]
    levels = [pool(x, spec, True, ctx) for spec in specs]
    if len(levels) == 1:
        return levels
    return [jnp.concatenate([y.reshape(y.shape[0], -1) for y in levels], axis=1)]
