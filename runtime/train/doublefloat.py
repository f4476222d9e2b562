"""Double-float scalar arithmetic in float32, for the double-precision parts of Caffe's lr math.

Caffe<float> computes some learning-rate factors in double: ``pow(float, int)`` promotes to
``double pow(double, double)`` in C++11 (the ``step``, ``exp`` and ``multistep`` policies, Adam's
bias correction), and the rest through float libm calls (``powf``, ``expf``) that are correctly
rounded. XLA's float32 ``pow``/``exp`` are several ulps off, and JAX may run without x64, so
those values are computed here as unevaluated sums ``hi + lo`` of two float32 numbers (about
44 significant bits, error-free transformations after Dekker and Knuth). Rounding such a pair
to float32 (its ``hi``) gives the float32 value Caffe gets.

Everything is jittable, works on scalars or arrays and only uses float32 arithmetic on the
device; logarithms of constants (base_lr, gamma, Adam's betas) are taken on the host in double.
Values below about 2**-100 lose the low half of the pair (float32 flushes it), which only matters
for rates nobody trains with.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32


class DF(NamedTuple):
    """An unevaluated float32 pair: the value is ``hi + lo`` with ``hi = fl(hi + lo)``."""

    hi: jax.Array
    lo: jax.Array


def _pair(value: float) -> tuple[np.float32, np.float32]:
    """Split a Python (double) number into its nearest float32 and the float32 remainder."""
    hi = np.float32(value)
    return hi, np.float32(value - float(hi))


def _table(values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    pairs = [_pair(v) for v in values]
    return np.array([p[0] for p in pairs], np.float32), np.array([p[1] for p in pairs], np.float32)


_LN2 = _pair(math.log(2.0))
# exp: e**x = 2**(n/32) · e**r with |r| <= ln2/64; 2**(j/32) tabulated, Taylor degree 5.
_LN2_32 = _pair(math.log(2.0) / 32)
_INV_LN2_32 = np.float32(32 / math.log(2.0))
_EXP2_TABLE = _table([2.0 ** (j / 32) for j in range(32)])
_EXP_TAYLOR = [_pair(1.0 / math.factorial(k)) for k in range(6)]
# log: ln m = ln c + 2·atanh((m-c)/(m+c)) with c = 1 + j/64 tabulated, |s| <= 1/180.
_LOG_J0, _LOG_J1 = -19, 27
_LOG_TABLE = _table([math.log1p(j / 64) for j in range(_LOG_J0, _LOG_J1 + 1)])
_ATANH_SERIES = [_pair(1.0 / (2 * j + 1)) for j in range(4)]
_SQRT_HALF = np.float32(math.sqrt(0.5))
_SPLITTER = np.float32(4097.0)  # 2**12 + 1: Veltkamp split of a 24-bit significand


def const(value: float) -> DF:
    """A Python float as a double-float constant."""
    hi, lo = _pair(value)
    return DF(jnp.asarray(hi, F32), jnp.asarray(lo, F32))


def from_f32(x: jax.Array) -> DF:
    """A float32 value as an exact double-float."""
    x = jnp.asarray(x, F32)
    return DF(x, jnp.zeros_like(x))


def from_int(n: jax.Array) -> DF:
    """An int32 value as an exact double-float (split at 2**12, so no rounding or overflow)."""
    n = jnp.asarray(n, jnp.int32)
    low = jnp.bitwise_and(n, 4095)
    return DF(*_fast_two_sum((n - low).astype(F32), low.astype(F32)))


def rounded(x: jax.Array) -> jax.Array:
    """x, opaque to floating-point contraction.

    XLA (on CPU at least) fuses ``a * b + c`` into one FMA, and its algebraic simplifier
    rewrites ``(a + b) - a`` to ``b``: both are exact in real arithmetic but destroy the
    error-free transformations below (and Caffe's separately rounded float ops). A select the
    compiler cannot fold (``x == x`` is false for NaN) hides how x was computed.
    """
    return jax.lax.select(x == x, x, jnp.zeros_like(x))


def _two_sum(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    s = rounded(a + b)
    bb = rounded(s - a)
    return s, (a - (s - bb)) + (b - bb)


def _fast_two_sum(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    s = rounded(a + b)
    return s, b - (s - a)


def _split(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    c = rounded(_SPLITTER * a)
    hi = c - rounded(c - a)
    return hi, a - hi


def _two_prod(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    p = rounded(a * b)
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def neg(x: DF) -> DF:
    """-x (exact)."""
    return DF(-x.hi, -x.lo)


def add(x: DF, y: DF) -> DF:
    """x + y, accurate also under cancellation."""
    s, e = _two_sum(x.hi, y.hi)
    t, f = _two_sum(x.lo, y.lo)
    s, e = _fast_two_sum(s, e + t)
    return DF(*_fast_two_sum(s, e + f))


def _add_same_sign(x: DF, y: DF) -> DF:
    """x + y when no cancellation can occur (cheaper; used by the series evaluations)."""
    s, e = _two_sum(x.hi, y.hi)
    return DF(*_fast_two_sum(s, e + (x.lo + y.lo)))


def mul(x: DF, y: DF) -> DF:
    """x * y."""
    p, e = _two_prod(x.hi, y.hi)
    return DF(*_fast_two_sum(p, e + (x.hi * y.lo + x.lo * y.hi)))


def div(x: DF, y: DF) -> DF:
    """x / y (one correction step on the float32 quotient)."""
    q1 = x.hi / y.hi
    r = add(x, neg(mul(y, from_f32(q1))))
    return DF(*_fast_two_sum(q1, r.hi / y.hi))


def divf(a: jax.Array, b: jax.Array) -> jax.Array:
    """The correctly rounded float32 quotient a / b.

    XLA rewrites a division by a constant into a multiplication by its reciprocal, which is
    not correctly rounded; the exact residual of ``div`` repairs that.
    """
    return div(from_f32(a), from_f32(b)).hi


def sqrt(x: DF) -> DF:
    """sqrt(x) for x >= 0 (one Newton correction on the float32 root)."""
    s = jnp.sqrt(x.hi)
    safe = jnp.where(s > 0, s, jnp.ones_like(s))
    r = add(x, neg(mul(from_f32(s), from_f32(s))))
    corr = jnp.where(s > 0, r.hi / (2 * safe), jnp.zeros_like(s))
    return DF(*_fast_two_sum(s, corr))


def _exp2_int(k: jax.Array) -> jax.Array:
    """2**k as float32 for integer-valued k in [-126, 127], built from its bit pattern."""
    bits = jnp.left_shift(k.astype(jnp.int32) + 127, 23)
    return jax.lax.bitcast_convert_type(bits, F32)


def _lookup(table: tuple[np.ndarray, np.ndarray], index: jax.Array) -> DF:
    return DF(jnp.asarray(table[0])[index], jnp.asarray(table[1])[index])


def _horner(coeffs: list[tuple[np.float32, np.float32]], x: DF) -> DF:
    """Σ coeffs[k]·x**k for positive coefficients and |x| small enough that no term cancels."""
    p = DF(*map(jnp.asarray, coeffs[-1]))
    for coeff in reversed(coeffs[:-1]):
        p = _add_same_sign(mul(p, x), DF(*map(jnp.asarray, coeff)))
    return p


def exp(x: DF) -> DF:
    """e**x = 2**q · 2**(j/32) · e**r with n = 32q + j = round(32x/ln 2), |r| <= ln2/64."""
    xh = jnp.clip(x.hi, -104.0, 89.0)
    n = jnp.round(xh * _INV_LN2_32)
    r = add(DF(xh, x.lo), neg(mul(DF(*map(jnp.asarray, _LN2_32)), from_f32(n))))
    ni = n.astype(jnp.int32)
    p = mul(_horner(_EXP_TAYLOR, r), _lookup(_EXP2_TABLE, jnp.bitwise_and(ni, 31)))
    q = jnp.right_shift(ni, 5)
    q1 = jnp.right_shift(q, 1)
    s1, s2 = _exp2_int(q1), _exp2_int(q - q1)
    hi, lo = p.hi * s1 * s2, p.lo * s1 * s2
    big, small = x.hi > 89.0, x.hi < -104.0
    hi = jnp.where(big, jnp.inf, jnp.where(small, 0.0, hi))
    lo = jnp.where(big | small, 0.0, lo)
    return DF(hi.astype(F32), lo.astype(F32))


def _log_mantissa(m: jax.Array) -> DF:
    """ln(m) for m in [√½, √2): ln c + 2·atanh(s), c = 1 + j/64 nearest m, s = (m-c)/(m+c)."""
    j = jnp.round((m - 1.0) * 64.0)
    c = 1.0 + j / 64.0
    s = div(from_f32(m - c), add(from_f32(m), from_f32(c)))  # m - c is exact (Sterbenz)
    p = mul(s, _horner(_ATANH_SERIES, mul(s, s)))
    index = j.astype(jnp.int32) - _LOG_J0
    return add(_lookup(_LOG_TABLE, index), DF(2.0 * p.hi, 2.0 * p.lo))


def log(x: jax.Array) -> DF:
    """ln(x) for normal float32 x > 0, as ln(m) + e·ln 2 with x = m·2**e, m in [√½, √2)."""
    m, e = jnp.frexp(jnp.asarray(x, F32))
    low = m < _SQRT_HALF
    m = jnp.where(low, 2.0 * m, m)
    e = jnp.where(low, e - 1, e)
    return add(_log_mantissa(m), mul(DF(*map(jnp.asarray, _LN2)), from_int(e)))


def pow_int(base: float, k: jax.Array) -> DF:
    """C++ ``pow(float base, int k)`` evaluated in double, for a constant base >= 0 and k >= 0.

    The logarithm of the constant is taken on the host in double.
    """
    k = jnp.asarray(k, jnp.int32)
    if base == 0:
        return from_f32(jnp.where(k == 0, 1.0, 0.0).astype(F32))
    return exp(mul(const(math.log(base)), from_int(k)))


def scaled_pow_int(scale: float, base: float, k: jax.Array) -> jax.Array:
    """float32 of the double product ``scale * pow(base, k)`` (constants scale > 0, base >= 0).

    Evaluated as one exponential, exp(ln scale + k·ln base), so that tiny results keep their
    accuracy (double-float products lose their low part below about 2**-100).
    """
    k = jnp.asarray(k, jnp.int32)
    if base == 0:
        return jnp.where(k == 0, np.float32(scale), np.float32(0.0))
    arg = add(const(math.log(scale)), mul(const(math.log(base)), from_int(k)))
    return exp(arg).hi


def powf(x: jax.Array, y: jax.Array) -> jax.Array:
    """C ``powf(x, y)`` (correctly rounded float32), with IEEE special cases for x <= 0."""
    x, y = jnp.asarray(x, F32), jnp.asarray(y, F32)
    ax = jnp.abs(x)
    mag = exp(mul(log(jnp.where(ax > 0, ax, 1.0)), from_f32(y))).hi
    mag = jnp.where(ax > 0, mag, jnp.where(y > 0, 0.0, jnp.inf))
    is_int = jnp.floor(y) == y
    odd = is_int & (jnp.abs(jnp.mod(y, 2.0)) == 1.0)
    signed = jnp.where(odd, -mag, mag)
    out = jnp.where(x < 0, jnp.where(is_int, signed, jnp.nan), mag)
    return jnp.where(y == 0, 1.0, out).astype(F32)


def expf(x: jax.Array) -> jax.Array:
    """C ``expf(x)`` (correctly rounded float32)."""
    return exp(from_f32(x)).hi
