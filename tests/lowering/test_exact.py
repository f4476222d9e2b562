"""lowering/exact.py: float32 products, quotients and C's round, bit for bit as IEEE float32
(NumPy's float32 arithmetic is the reference), under jax.jit, where XLA's own division by a
constant and its fused multiply-adds differ."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.lowering import exact


def _floats(rng, n: int) -> np.ndarray:
    """Normal float32 values of both signs over 80 binades."""
    mantissa = rng.random(n).astype(np.float32) + np.float32(1)
    scale = np.float32(2.0) ** rng.integers(-40, 40, n).astype(np.float32)
    return (mantissa * scale * rng.choice([-1, 1], n)).astype(np.float32)


def _bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def test_div_and_mul_are_ieee_float32_bit_for_bit_jitted():
    rng = np.random.default_rng(0)
    n = 1 << 18
    cases = [
        (_floats(rng, n), _floats(rng, n)),
        # integer sizes over small integer counts: ROIPooling's size / pooled
        (rng.integers(1, 1 << 24, n).astype(np.float32), rng.integers(1, 300, n) + np.float32(0)),
        (np.arange(1, 65, dtype=np.float32)[:, None], np.arange(1, 15, dtype=np.float32)[None]),
    ]
    div, mul = jax.jit(exact.div), jax.jit(exact.mul)
    for x, y in cases:
        np.testing.assert_array_equal(_bits(div(x, y)), _bits(x / y))
        np.testing.assert_array_equal(_bits(mul(x, y)), _bits(x * y))


def test_zero_operands_give_signed_zero():
    assert _bits(exact.mul(np.float32(-2), np.float32(0))) == _bits(np.float32(-0.0))
    assert float(exact.mul(0.0, 3.0)) == 0 and float(exact.div(0.0, 7.0)) == 0


def test_a_ceil_of_a_product_of_a_quotient_is_the_c_one_under_jit():
    """ceil(7 · (57 / 7)) is 58 in float32 C (57/7 rounds up, the product to 57.000004), and
    ceil(7 · (3 / 7)) is 3, never XLA's ceil(7 · (3 · (1/7))) = 4."""

    @jax.jit
    def edges(size):
        q = exact.div(size, 7.0)
        return jnp.ceil(exact.mul(q[:, None], jnp.arange(8, dtype=jnp.float32)))

    sizes = np.arange(1, 65, dtype=np.float32)
    want = np.ceil((sizes / np.float32(7))[:, None] * np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(edges(sizes)), want)
    assert want[56, 7] == 58 and want[2, 7] == 3


def test_a_product_then_an_add_is_rounded_twice_as_in_c():
    """fl(fl(a·b) + c): XLA contracts a·b + c into one FMA under jit; exact.mul does not."""
    rng = np.random.default_rng(1)
    a, b, c = (rng.random(1 << 16).astype(np.float32) for _ in range(3))
    got = jax.jit(lambda a, b, c: exact.mul(a, b) + c)(a, b, c)
    np.testing.assert_array_equal(_bits(got), _bits(a * b + c))


def test_c_round_goes_half_away_from_zero_for_every_float32():
    v = np.array([0.49999997, -0.49999997, 0.5, -0.5, 1.5, 2.5, -2.5, 8388609, -8388609,
                  16777215, 3.4e38, -0.0], np.float32)  # fmt: skip
    want = np.array([0, -0.0, 1, -1, 2, 3, -3, 8388609, -8388609, 16777215, 3.4e38, -0.0],
                    np.float32)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(jax.jit(exact.c_round)(v)), want)
    # floor(x + 0.5), the usual shortcut, gets two of them wrong
    assert np.floor(v[0] + np.float32(0.5)) == 1 and np.floor(v[7] + np.float32(0.5)) != v[7]
