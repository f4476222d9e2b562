"""lowering/boxes/matching.py's MatchBBox for a whole batch (``match_batch``): against a
transcription of the SSD fork's loops (bbox_util.cpp MatchBBox: the bipartite rounds over the
overlaps map, prior by prior, gt pool in order, strict ``>``; then PER_PREDICTION) on the same
float32 overlaps, with heavy ties (overlaps drawn from a few values), several images, padding
rows and ignored priors, jitted. The rounds here take every mutually-best pair at once; the
result must be the fork's exactly. Also the cost: a 2,000-box image matches in a few rounds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.lowering.boxes.iou import SSD, iou
from caffe2jax.lowering.boxes.matching import bipartite, match_batch

RNG = np.random.default_rng(3737)


def fork_match(overlaps, item, valid, ignored, threshold, per_prediction):
    """MatchBBox per image, loop for loop, over (G, P) overlaps (rows: gts of every image)."""
    n, p = ignored.shape
    match, best = np.full((n, p), -1), np.zeros((n, p), np.float32)
    for image in range(n):
        gts = [j for j in range(len(item)) if valid[j] and item[j] == image]
        if not gts:
            continue
        recorded = {}
        for i in range(p):
            if ignored[image, i]:
                match[image, i] = -2
                continue
            for j in gts:
                if overlaps[j, i] > 1e-6:
                    best[image, i] = max(best[image, i], overlaps[j, i])
                    recorded.setdefault(i, {})[j] = overlaps[j, i]
        pool = list(gts)
        while pool:
            mi, mj, mo = -1, -1, -1.0
            for i in sorted(recorded):
                if match[image, i] != -1:
                    continue
                for j in pool:
                    if j in recorded[i] and recorded[i][j] > mo:
                        mi, mj, mo = i, j, recorded[i][j]
            if mi == -1:
                break
            match[image, mi] = mj
            pool.remove(mj)
        for i in sorted(recorded) if per_prediction else ():
            if match[image, i] != -1:
                continue
            mj, mo = -1, -1.0
            for j in gts:
                o = recorded[i].get(j)
                if o is not None and o >= threshold and o > mo:
                    mj, mo = j, o
            if mj != -1:
                match[image, i] = mj
    return match, best


def _case(n, g, p, levels):
    """Random overlaps from ``levels`` distinct values (ties everywhere), 0 for a third."""
    values = RNG.choice(np.linspace(0.1, 0.9, levels).astype(np.float32), (g, p))
    overlaps = np.where(RNG.random((g, p)) < 0.33, 0.0, values).astype(np.float32)
    item = np.sort(RNG.integers(0, n, g))
    valid = RNG.random(g) < 0.85
    ignored = RNG.random((n, p)) < 0.1
    return overlaps, item, valid, ignored


@pytest.mark.parametrize("per_prediction", [True, False])
@pytest.mark.parametrize("n,g,p,levels", [(1, 6, 9, 3), (3, 12, 20, 2), (4, 40, 60, 5),
                                          (2, 70, 30, 4), (3, 25, 80, 50)])  # fmt: skip
def test_match_batch_equals_the_forks_loops_on_tied_overlaps(per_prediction, n, g, p, levels):
    for _ in range(3):
        overlaps, item, valid, ignored = _case(n, g, p, levels)
        run = jax.jit(lambda o, it, v, ig: match_batch(o, it, v, n, 0.5, per_prediction, ig))
        match, overlap = run(overlaps, item.astype(np.int32), valid, ignored)
        want, best = fork_match(overlaps, item, valid, ignored, 0.5, per_prediction)
        np.testing.assert_array_equal(match, want)
        unmatched = want == -1  # the fork rewrites a matched prior's overlap; only these are read
        np.testing.assert_array_equal(np.asarray(overlap)[unmatched], best[unmatched])


def test_match_batch_on_real_boxes_with_padding_rows():
    """Boxes through SSD's IoU, padding rows (item −1 marked invalid) and an image with none."""
    priors = _boxes(120)
    gt = _boxes(30)
    item = np.sort(RNG.integers(0, 3, 30))  # image 3 of 4 has no gt
    valid = RNG.random(30) < 0.9
    overlaps = np.asarray(iou(jnp.asarray(priors), jnp.asarray(gt), SSD)).T
    ignored = np.zeros((4, 120), bool)
    match, _ = jax.jit(lambda o: match_batch(o, item, valid, 4, 0.5, True, ignored))(overlaps)
    want, _ = fork_match(overlaps, item, valid, ignored, 0.5, True)
    np.testing.assert_array_equal(match, want)
    assert (np.asarray(match)[3] == -1).all()


def _boxes(count):
    centre = RNG.uniform(0.1, 0.9, (count, 2))
    side = RNG.uniform(0.05, 0.5, (count, 2))
    return np.concatenate([centre - side / 2, centre + side / 2], 1).astype(np.float32)


def test_two_thousand_boxes_match_in_a_few_rounds():
    """One image of 2,000 random boxes against 3,000 priors: the fork's loop runs ~2,000 rounds
    of (P × G); the mutual-best rounds stay few, so the matching is ~linear in boxes × priors
    (benchmarks/multibox_matching.py times the loss)."""
    gt, priors = _boxes(2000), _boxes(3000)
    overlaps = iou(jnp.asarray(priors), jnp.asarray(gt), SSD).T
    recorded = overlaps > 1e-6
    segments = jnp.zeros((2000,), jnp.int32)
    start = jnp.full((1, 3000), -1, jnp.int32)
    match, rounds = jax.jit(bipartite)(overlaps, recorded, start, segments)
    taken = np.asarray(match)[0]
    assert len(set(taken[taken >= 0])) == (taken >= 0).sum() > 1000  # one prior per gt
    assert int(rounds) < 100, int(rounds)
