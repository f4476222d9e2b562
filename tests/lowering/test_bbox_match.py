"""lowering/bbox_match.py: SSD's JaccardOverlap, bit for bit as bbox_util.cpp's float32 under
jax.jit (the IoU MultiBoxLoss matches priors with at overlap_threshold)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.lowering.bbox_match import jaccard

F = np.float32


def fork_jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """JaccardOverlap(normalized) transcribed: float32 arithmetic, each product rounded."""
    ax1, ay1, ax2, ay2 = (a[:, None, i] for i in range(4))
    bx1, by1, bx2, by2 = (b[None, :, i] for i in range(4))
    disjoint = (bx1 > ax2) | (bx2 < ax1) | (by1 > ay2) | (by2 < ay1)
    iw = np.minimum(ax2, bx2) - np.maximum(ax1, bx1)
    ih = np.minimum(ay2, by2) - np.maximum(ay1, by1)
    touching = ~disjoint & (iw > 0) & (ih > 0)
    size_a = np.where((ax2 < ax1) | (ay2 < ay1), F(0), (ax2 - ax1) * (ay2 - ay1))
    size_b = np.where((bx2 < bx1) | (by2 < by1), F(0), (bx2 - bx1) * (by2 - by1))
    inter = iw * ih
    with np.errstate(invalid="ignore", divide="ignore"):
        overlap = inter / (size_a + size_b - inter)
    return np.where(touching, overlap, F(0)).astype(F)


def _boxes(rng, n):
    xy = rng.random((n, 2), dtype=F) * F(0.8)
    wh = rng.random((n, 2), dtype=F) * F(0.5) + F(0.01)
    return np.concatenate([xy, xy + wh], 1).astype(F)


def test_jaccard_is_the_forks_float32_under_jit():
    """400 × 300 boxes; where the plain expression fused under jit (one multiply-add)
    gives other bits, the layer's does not."""
    rng = np.random.default_rng(0)
    a, b = _boxes(rng, 400), _boxes(rng, 300)
    want = fork_jaccard(a, b)
    got = np.asarray(jax.jit(jaccard)(a, b))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))

    @jax.jit
    def fused(a, b):  # the former expression: s1 + s2 − w·h is one FMA under XLA CPU's jit
        ax1, ay1, ax2, ay2 = (a[:, None, i] for i in range(4))
        bx1, by1, bx2, by2 = (b[None, :, i] for i in range(4))
        iw = jnp.minimum(ax2, bx2) - jnp.maximum(ax1, bx1)
        ih = jnp.minimum(ay2, by2) - jnp.maximum(ay1, by1)
        inter = iw * ih
        union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
        return jnp.where((iw > 0) & (ih > 0), inter / union, 0.0)

    if jax.default_backend() == "cpu":
        assert (np.asarray(fused(a, b)) != want).sum() > 0  # the fault this guards against
