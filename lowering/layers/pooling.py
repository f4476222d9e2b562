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
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.engines import windows
from caffe2jax.lowering.engines.windows import offset_slices, on_hw, spatial
from caffe2jax.lowering.registry import Context, Planning, register
from caffe2jax.lowering.util import fail, nchw

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

# MAX and AVE pooling run in the form the engine policy chose when the net was planned
# (lowering/engines/policy.py pool_form, ``ctx.engine``): "phases" (lowering/engines/windows.py:
# the windows as strided views, their backward as shifted sums per stride phase, all fusible),
# "phases-rw" (the same backward, the forward XLA's reduce_window, which reads its input once)
# or "xla" (reduce_window, whose backward is select_and_scatter / a padded window sum: the only
# form forward-mode autodiff goes through). Without a plan (shape inference), "xla".

# Layers whose output XLA:CPU would recompute in each of the window views it is fused into
# (they call exp, log or pow per element): behind one, the policy's pooling reads its bottom
# once (lowering/engines/windows.py window_max).
EXPENSIVE_PRODUCERS = frozenset(
    {"LRN", "Sigmoid", "TanH", "Power", "Exp", "Log", "BNLL", "ELU", "Swish", "Softmax", "MVN"}
)


def _window(x: jax.Array, spec: PoolSpec, init: float, op, nhwc: bool = False) -> jax.Array:
    return windows.reduce_windows(x, spec, init, op, nhwc)


def live_spec(spec: PoolSpec, hw: tuple[int, ...]) -> PoolSpec:
    """The windows that read an input cell: on each axis the first ``ceil((H + p) / s)`` (with
    CEIL rounding a window may start at or past ``H``, and read only padding or nothing). A lone
    window's stride is never used; it is set to 1. Pooling only these windows keeps the padding
    under one kernel past the input whatever the stride (a stride of 2^31 − 1 asked XLA for a
    2^31-wide pad, 65,536 for 34 GB)."""
    live = tuple(
        min(o, (n + p - 1) // s + 1) for o, s, p, n in zip(spec.out, spec.stride, spec.pad, hw)
    )
    stride = tuple(s if count > 1 else 1 for s, count in zip(spec.stride, live))
    return PoolSpec(spec.method, spec.kernel, stride, spec.pad, live)  # type: ignore[arg-type]


def reads_nothing(spec: PoolSpec, hw: tuple[int, ...]) -> bool:
    """Whether some window starts past the input (CEIL rounding, kernel < stride, no pad)."""
    return live_spec(spec, hw).out != spec.out


def extend(y: jax.Array, spec: PoolSpec, fill: float, nhwc: bool = False) -> jax.Array:
    """``y``, pooled over the live windows, padded with ``fill`` to all of ``spec.out``."""
    after = tuple((0, o - n) for o, n in zip(spec.out, spatial(y, nhwc)))
    if not any(a for _, a in after):
        return y
    return jnp.pad(y, on_hw(nhwc, after, (0, 0)), constant_values=fill)


def max_pool(x: jax.Array, spec: PoolSpec, nhwc: bool = False, form: str = "xla") -> jax.Array:
    """MAX over each window, padding ignored; the backward routes each diff to the window's
    first maximum in row-major order, as Caffe's mask does. A window that reads no input keeps
    Caffe's −FLT_MAX start.

    Every form keeps that rule: windows.max_first by its per-offset ``==`` selects, XLA's
    select_and_scatter by its ``>=`` select in the window's row-major order
    (tests/lowering/layers/test_pooling.py checks them on tied inputs).
    """
    live = live_spec(spec, spatial(x, nhwc))
    if form == "xla":
        y = _window(x, live, -jnp.inf, lax.max, nhwc)
    else:
        y = windows.max_first(x, live, nhwc, form == "phases")
    return extend(y, spec, -_FLT_MAX, nhwc)


def ave_pool(x: jax.Array, spec: PoolSpec, nhwc: bool = False, form: str = "xla") -> jax.Array:
    """AVE: the zero-padded window sum over Caffe's clipped window size."""
    hw = spatial(x, nhwc)
    live = live_spec(spec, hw)
    if form != "xla":
        y = windows.ave(x, live, nhwc, form == "phases")
    else:
        y = _window(x, live, 0.0, lax.add, nhwc) / windows.divisor(live, hw, x.dtype, nhwc)
    return y if live.out == spec.out else _empty_windows(y, spec, live, hw, nhwc)


def _empty_windows(y, spec: PoolSpec, live: PoolSpec, hw, nhwc: bool) -> jax.Array:
    """AVE windows that read no input: Caffe's zero sum over its ``pool_size`` (0/0, NaN, when
    the window starts exactly at ``H + pad``, as in Caffe)."""
    empty = jnp.zeros((), y.dtype) / windows.divisor(spec, hw, y.dtype, nhwc)
    rows, cols = (lax.iota(jnp.int32, o) < n for o, n in zip(spec.out, live.out))
    inside = rows[:, None] & cols[None, :]
    return jnp.where(inside[:, :, None] if nhwc else inside, extend(y, spec, 0.0, nhwc), empty)


def max_mask(x: jax.Array, spec: PoolSpec) -> jax.Array:
    """Caffe's MAX mask top: the flat index ``h·W + w`` of the first maximum, as a float.

    A scan over the k_h·k_w window offsets (a static loop) with Caffe's strict ``>`` test and
    its ``−FLT_MAX`` start, so ties keep the earlier element; −1 where the window reads no
    input. Carries no gradient.
    """
    x, live = lax.stop_gradient(x), live_spec(spec, x.shape[2:])
    h, w = x.shape[2:]
    # at least float32: a bfloat16 mask (precision "bf16") would round indices above 256
    kind = jnp.promote_types(x.dtype, jnp.float32)
    index = jnp.broadcast_to(jnp.arange(h * w, dtype=kind).reshape(1, 1, h, w), x.shape)
    best = jnp.full(x.shape[:2] + live.out, -_FLT_MAX, x.dtype)
    arg = jnp.full(best.shape, -1, kind)
    for value, where in zip(offset_slices(x, live, -jnp.inf), offset_slices(index, live, -1)):
        take = value > best
        best = jnp.where(take, value, best)
        arg = jnp.where(take, where, arg)
    return extend(arg, spec, -1.0)


def stochastic_pool(x: jax.Array, spec: PoolSpec, train: bool, ctx: Context) -> jax.Array:
    """STOCHASTIC pooling as Caffe's GPU kernels compute it (windows clipped, never padded).

    TRAIN: threshold ``u·Σx`` with ``u ~ U[0, 1)`` per window; the output is the first element
    (row-major) whose running sum reaches it. Its gradient reaches only that element, which is
    what autodiff of the gather gives (the choice itself is integer-valued). TEST:
    ``Σx² / (FLT_MIN + Σx)``; its gradient is the true derivative of that forward. A window that
    reads no input gives 0 in both.
    """
    live = live_spec(spec, x.shape[2:])
    return extend(_stochastic(x, live, train, ctx), spec, 0.0)


def _stochastic(x: jax.Array, spec: PoolSpec, train: bool, ctx: Context) -> jax.Array:
    if not train:
        squares = _window(x * x, spec, 0.0, lax.add)
        return squares / (_window(x, spec, 0.0, lax.add) + jnp.asarray(_FLT_MIN, x.dtype))
    patches = jnp.stack(list(offset_slices(x, spec, 0.0)), axis=-1)
    running = jnp.cumsum(patches, axis=-1)
    u = jax.random.uniform(ctx.key(), running.shape[:-1], x.dtype)
    threshold = u * running[..., -1]
    chosen = lax.stop_gradient(jnp.argmax(running >= threshold[..., None], axis=-1))
    return jnp.take_along_axis(patches, chosen[..., None], axis=-1)[..., 0]


def pool(x: jax.Array, spec: PoolSpec, train: bool, ctx: Context, form: str | None) -> jax.Array:
    """The pooled top of ``x`` (N, C, H, W) for ``spec``, MAX and AVE in ``form``."""
    if spec.method == MAX:
        return max_pool(x, spec, form=form or "xla")
    if spec.method == AVE:
        return ave_pool(x, spec, form=form or "xla")
    return stochastic_pool(x, spec, train, ctx)


def pool_form(spec: PoolSpec, planning: Planning) -> str | None:
    """The engine policy's form for a MAX or AVE pooling of ``spec`` (None: STOCHASTIC)."""
    if spec.method not in (MAX, AVE):
        return None
    expensive = planning.producers[0] in EXPENSIVE_PRODUCERS
    op = "max" if spec.method == MAX else "ave"
    return planning.policy.pool_form(op, spec.kernel, spec.stride, expensive)


# -- the layers -------------------------------------------------------------------------------


SpecFn = Callable[[ir.Layer, tuple[int, ...]], PoolSpec]


def pool_layer(layer: ir.Layer, bottoms, ctx: Context, spec_of: SpecFn) -> list[jax.Array]:
    """PoolingLayer's forward with the geometry ``spec_of(layer, bottom shape)`` gives: one
    top, or for MAX a second top with the argmax mask."""
    (x,) = bottoms
    spec = spec_of(layer, tuple(x.shape))
    warn_empty_windows(layer, spec, x.shape[2:])
    if len(layer.tops) == 2 and spec.method != MAX:
        raise fail(layer, f"{_NAMES[spec.method]} pooling has 1 top, got 2")
    y = pool(x, spec, ctx.train, ctx, ctx.engine)
    return [y, max_mask(x, spec)] if len(layer.tops) == 2 else [y]


def pool_layer_nhwc(layer: ir.Layer, bottoms, ctx: Context, spec_of: SpecFn) -> list[jax.Array]:
    """MAX or AVE pooling of a channels-last (N, H, W, C) bottom (lowering/layout.py)."""
    (x,) = bottoms
    spec = spec_of(layer, nchw(x.shape))
    warn_empty_windows(layer, spec, spatial(x, True))
    form = max_pool if spec.method == MAX else ave_pool
    return [form(x, spec, nhwc=True, form=ctx.engine or "xla")]


def warn_empty_windows(layer: ir.Layer, spec: PoolSpec, hw) -> None:
    """AVE with a window past the input (CEIL rounding, kernel < stride, no pad): Caffe divides
    its zero sum by the window's size, 0 / 0 = NaN when the window starts at ``H``. Reproduced,
    and said once per layer."""
    if spec.method == AVE and reads_nothing(spec, tuple(hw)):
        warnings.warn(
            f"layer '{layer.name}' ({layer.type}): AVE windows past the {list(hw)} input "
            f"(kernel {list(spec.kernel)} < stride {list(spec.stride)}) give Caffe's "
            "0 / pool_size, NaN where that size is 0",
            UserWarning,
            stacklevel=2,
        )


def max_or_ave(layer: ir.Layer, shapes) -> bool:
    """Whether a Pooling layer has a channels-last form: MAX or AVE with one top."""
    p = layer.param.pooling_param
    return len(layer.tops) == 1 and p.pool in (MAX, AVE)


@register("Pooling", counts=(1, 1, 1, 2), bf16=True)
def pooling(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """PoolingLayer: one top, or for MAX a second top with the argmax mask."""
    return pool_layer(layer, bottoms, ctx, pooling_spec)


@pooling.nhwc(when=max_or_ave)
def _(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    return pool_layer_nhwc(layer, bottoms, ctx, pooling_spec)


@pooling.engine
def _(layer: ir.Layer, bottom_shapes, planning: Planning) -> str | None:
    return pool_form(pooling_spec(layer, tuple(bottom_shapes[0])), planning)


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
    (x,) = bottoms
    specs = _spp_specs(layer, tuple(x.shape))
    forms = ctx.engine or (None,) * len(specs)
    levels = [pool(x, spec, True, ctx, form) for spec, form in zip(specs, forms)]
    if len(levels) == 1:
        return levels
    return [jnp.concatenate([y.reshape(y.shape[0], -1) for y in levels], axis=1)]


def _spp_specs(layer: ir.Layer, shape: tuple[int, ...]) -> list[PoolSpec]:
    """SPPLayer::LayerSetUp: one pooling per pyramid level."""
    if len(shape) != 4:
        raise fail(layer, f"input must have 4 axes (num, channels, height, width), got {shape}")
    p = layer.param.spp_param
    if p.pyramid_height < 1:
        raise fail(layer, "spp_param.pyramid_height must be at least 1")
    method = P.PoolMethod.Value(caffe_pb2.SPPParameter.PoolMethod.Name(p.pool))
    return [spp_spec(layer, method, shape[2:], level) for level in range(p.pyramid_height)]


@spp.engine
def _(layer: ir.Layer, bottom_shapes, planning: Planning) -> tuple[str | None, ...]:
    """Each level's form (its kernel and stride differ)."""
    return tuple(pool_form(spec, planning) for spec in _spp_specs(layer, tuple(bottom_shapes[0])))
