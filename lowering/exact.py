"""Float32 arithmetic exactly as the forks' C++ computes it, under ``jax.jit`` as in eager.

Caffe's layers round every float operation to float32 on its own (IEEE, round half to even;
its x86 builds have no fused multiply-add). Under jit XLA does not: it turns ``x / c`` for a
constant ``c`` into ``x * (1/c)``, and it contracts ``a * b + c`` (also ``a * b - t``) into one
fused multiply-add that rounds once (both measured with jax 0.10 on CPU; an
``optimization_barrier`` between the multiply and the add does not stop the contraction).
Where a floor, ceil, round or comparison follows, one ulp moves a value across an integer:
``ceil(7 · (3 · 0.142857149)) = 4`` where Caffe's ``ceil(7 · (3 / 7))`` is 3.

These functions compute a product or a quotient of float32 values from their bit patterns
with integer operations (long division, a two-limb product) and round the result to float32
as IEEE does. XLA has nothing to rewrite there, so the bits equal the C++ result on every
backend, jitted or not (each is a ``jax.jit`` function: one small program when called eagerly,
inlined under an enclosing jit). Domain: finite normal floats (and 0); results that would be
subnormal, infinite or NaN are not reproduced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

_U32 = jnp.uint32
_MANT = 0x7FFFFF


@jax.jit
def c_round(x: jax.Array) -> jax.Array:
    """C's ``round``: halves away from zero. Exact for every float32, unlike
    ``floor(x + 0.5)`` (0.49999997 + 0.5 rounds to 1.0; 2²³ + 1 + 0.5 rounds to 2²³ + 2)."""
    t = jnp.trunc(x)
    return jnp.where(jnp.abs(x - t) >= 0.5, t + jnp.sign(x), t)


def _u32(value: int, like: jax.Array) -> jax.Array:
    return lax.full_like(like, value, _U32)


def _split(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(sign bit, biased exponent, 24-bit significand) of a float32 array (lax operations
    throughout: they trace several times faster than jnp's operators)."""
    bits = lax.bitcast_convert_type(x, _U32)
    exp = lax.bitwise_and(lax.shift_right_logical(bits, _u32(23, bits)), _u32(0xFF, bits))
    sig = lax.bitwise_or(lax.bitwise_and(bits, _u32(_MANT, bits)), _u32(_MANT + 1, bits))
    return lax.shift_right_logical(bits, _u32(31, bits)), exp.astype(jnp.int32), sig


def _join(sign, exp, sig, zero) -> jax.Array:
    """The float32 of sign, biased exponent and significand; ±0 where ``zero``."""
    sign = lax.shift_left(sign, _u32(31, sign))
    bits = lax.bitwise_or(sign, lax.shift_left(exp.astype(_U32), _u32(23, sign)))
    bits = lax.bitwise_or(bits, lax.bitwise_and(sig, _u32(_MANT, sig)))
    return lax.bitcast_convert_type(lax.select(zero, sign, bits), jnp.float32)


def _round_even(sig, guard, sticky, exp):
    """Round a 24-bit significand by its guard bit and sticky flag, half to even; a carry out
    of the 24 bits bumps the exponent."""
    odd = lax.ne(lax.bitwise_and(sig, _u32(1, sig)), _u32(0, sig))
    up = lax.bitwise_and(guard, lax.bitwise_or(sticky, odd))
    sig = lax.add(sig, up.astype(_U32))
    carry = lax.ge(sig, _u32(1 << 24, sig))
    sig = lax.select(carry, lax.shift_right_logical(sig, _u32(1, sig)), sig)
    return sig, lax.add(exp, carry.astype(jnp.int32))


def _operands(x, y):
    x, y = jnp.broadcast_arrays(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
    return x, y, lax.bitwise_or(lax.eq(x, lax.full_like(x, 0)), lax.eq(y, lax.full_like(y, 0)))


@jax.jit
def div(x, y) -> jax.Array:
    """``x / y`` rounded to float32 as IEEE does, by binary long division of the
    significands (25 quotient bits and a sticky remainder); XLA cannot turn it into a
    multiplication by ``1/y``. ``x`` and ``y`` broadcast; ``y`` must not be 0."""
    x, y, zero = _operands(x, y)
    sx, ex, mx = _split(x)
    sy, ey, my = _split(y)
    seven = _u32(7, mx)
    a, b = lax.shift_left(mx, seven), lax.shift_left(my, seven)  # both in [2^30, 2^31)
    low = lax.lt(a, b)
    r = lax.select(low, lax.shift_left(a, _u32(1, a)), a)

    def step(_, rq):
        r, q = rq
        bit = lax.ge(r, b)
        r = lax.shift_left(lax.select(bit, lax.sub(r, b), r), _u32(1, r))
        return r, lax.bitwise_or(lax.shift_left(q, _u32(1, q)), bit.astype(_U32))

    r, q = lax.fori_loop(0, 25, step, (r, _u32(0, r)))
    guard = lax.ne(lax.bitwise_and(q, _u32(1, q)), _u32(0, q))
    exp = ex - ey + 127 - low.astype(jnp.int32)
    sig, exp = _round_even(lax.shift_right_logical(q, _u32(1, q)), guard, r != 0, exp)
    return _join(lax.bitwise_xor(sx, sy), exp, sig, lax.eq(x, lax.full_like(x, 0)))


@jax.jit
def mul(x, y) -> jax.Array:
    """``x * y`` rounded to float32 as IEEE does, from the 48-bit product of the significands
    (12-bit limbs); nothing for XLA to contract into a fused multiply-add with a later add."""
    x, y, zero = _operands(x, y)
    sx, ex, mx = _split(x)
    sy, ey, my = _split(y)
    c12, c24, low12 = _u32(12, mx), _u32(24, mx), _u32(0xFFF, mx)
    x1, x0 = lax.shift_right_logical(mx, c12), lax.bitwise_and(mx, low12)
    y1, y0 = lax.shift_right_logical(my, c12), lax.bitwise_and(my, low12)
    mid = x1 * y0 + x0 * y1
    lo = x0 * y0 + lax.shift_left(lax.bitwise_and(mid, low12), c12)
    hi = x1 * y1 + lax.shift_right_logical(mid, c12) + lax.shift_right_logical(lo, c24)
    lo = lax.bitwise_and(lo, _u32(0xFFFFFF, lo))  # product = hi·2^24 + lo, hi in [2^22, 2^24)
    top = lax.ge(hi, _u32(1 << 23, hi))
    shifted = lax.shift_left(hi, _u32(1, hi))
    sig = lax.select(top, hi, lax.bitwise_or(shifted, lax.shift_right_logical(lo, _u32(23, lo))))
    guard = lax.shift_right_logical(lo, lax.select(top, _u32(23, lo), _u32(22, lo)))
    guard = lax.ne(lax.bitwise_and(guard, _u32(1, lo)), _u32(0, lo))
    rest = lax.bitwise_and(lo, lax.select(top, _u32(_MANT, lo), _u32(0x3FFFFF, lo)))
    exp = ex + ey - 127 + top.astype(jnp.int32)
    sig, exp = _round_even(sig, guard, rest != 0, exp)
    return _join(lax.bitwise_xor(sx, sy), exp, sig, zero)
