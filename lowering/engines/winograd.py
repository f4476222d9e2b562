"""Winograd's F(2×2, 3×3) for the 3×3 convolutions of forward-only programs.

A 3×3, stride-1, pad-1, ungrouped channels-last convolution computes each 2×2 block of its top
from a 4×4 tile of its bottom; Winograd's minimal filtering (Lavin & Gray, "Fast Algorithms
for Convolutional Neural Networks", 2015) does it with 16 products per channel pair instead
of 36: Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A, the element-wise products summed over the input
channels as 16 matrix products (tiles × C)·(C × O). The filter transform G g Gᵀ is done once,
on the host, when a forward-only program's weights are packed (packing.py, ``Model.packed``);
the input and output transforms are additions XLA fuses around the products.

Not bit for bit: the transforms add and subtract (coefficients 0, ±1, ±½), so the top differs
from the direct convolution's by float rounding — ~1e-6 of its largest magnitude at
GoogLeNet's shapes (benchmarks/inception_forms.py), tested within 1e-5
(tests/lowering/engines/test_winograd.py). Which convolutions take it: :func:`eligible` (the
size rule measured there), under the policy field ``winograd``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.lowering.engines import onednn

PREFIX = b"winograd:"
# The sides (H and W of the bottom) where F(2×2, 3×3) beat oneDNN's direct convolution with
# packed weights (benchmarks/inception_forms.py --only winograd, GoogLeNet's 3×3s, process CPU
# time, load 10–11): 14² and 28² at batch 1 and 8 (0.67–0.96× per layer, one 14² case 1.11×
# in one of three runs); 7² lost (0.93–1.41×: a quarter of its tiles padding) and 56² lost at
# batch 8 (1.95×: its transforms are memory-bound) and was mixed at batch 1 (0.81–1.43×).
MIN_SIDE, MAX_SIDE = 8, 32

BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)


def key(geometry: bytes) -> bytes:
    """The packed slot's key: the oneDNN geometry it replaces, marked as Winograd's."""
    return PREFIX + geometry


def is_winograd(k: bytes) -> bool:
    return k.startswith(PREFIX)


def geometry_of(k: bytes) -> bytes:
    return k[len(PREFIX) :]


def eligible(geometry: bytes) -> bool:
    """A channels-last 3×3 convolution, stride 1, pad 1, no dilation or groups, each side of
    its bottom within [MIN_SIDE, MAX_SIDE]."""
    g = onednn.Geometry.parse(geometry)
    return (
        g.channels_last
        and g.w[2:] == (3, 3)
        and g.stride == (1, 1)
        and g.pad == (1, 1)
        and g.dilation == (1, 1)
        and g.group == 1
        and all(MIN_SIDE <= s <= MAX_SIDE for s in g.x[2:])
    )


def pack(w: np.ndarray) -> np.ndarray:
    """Caffe's (O, C, 3, 3) weights → the 16 transformed (C, O) matrices G g Gᵀ, in float64
    and rounded once to float32."""
    u = np.einsum("ak,ockl,bl->aboc", G, np.asarray(w, np.float64), G)
    return u.reshape(16, *u.shape[2:]).transpose(0, 2, 1).astype(np.float32)


def _combine(parts, coeffs):
    """Σ coeffs[k]·parts[k], zero terms skipped (the coefficients are 0, ±1 and ±½)."""
    out = None
    for c, p in zip(coeffs.tolist(), parts):
        if c:
            term = p if c == 1 else -p if c == -1 else p * np.float32(c)
            out = term if out is None else out + term
    return out


def convolve(x: jax.Array, u: jax.Array) -> jax.Array:
    """(N, H, W, C) ⊛ a 3×3 kernel (stride 1, pad 1) packed by :func:`pack`: (N, H, W, O)."""
    n, h, w, c = x.shape
    th, tw = -(-h // 2), -(-w // 2)  # 2×2 output blocks (odd sides padded, then cropped)
    xp = jnp.pad(x, [(0, 0), (1, 2 * th + 1 - h), (1, 2 * tw + 1 - w), (0, 0)])
    d = [[xp[:, i : i + 2 * th : 2, j : j + 2 * tw : 2] for j in range(4)] for i in range(4)]
    rows = [[_combine([d[k][j] for k in range(4)], BT[a]) for j in range(4)] for a in range(4)]
    v = jnp.stack([_combine(rows[a], BT[b]) for a in range(4) for b in range(4)])
    m = lax.dot_general(v.reshape(16, n * th * tw, c), u, (((2,), (1,)), ((0,), (0,))))
    m = m.reshape(4, 4, n, th, tw, -1)
    cols = [[_combine([m[a, b] for b in range(4)], AT[q]) for q in range(2)] for a in range(4)]
    y = jnp.stack(
        [jnp.stack([_combine([cols[a][q] for a in range(4)], AT[p]) for q in range(2)], 3)
         for p in range(2)],
        2,
    )  # fmt: skip
    # (N, th, 2, tw, 2, O) → (N, H, W, O), the padding's blocks cropped
    return y.reshape(n, 2 * th, 2 * tw, -1)[:, :h, :w]
