"""Greedy NMS a block at a time (lowering/boxes/nms.py ``greedy_keep_rows``), jitted as the
proposal and region layers run it, against the one-candidate-at-a-time loop of
py-faster-rcnn's nms/py_cpu_nms.py and the YOLO forks' ApplyNms, written here in NumPy over the
same overlaps: the same keep flags, bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.lowering.boxes.iou import RCNN_NMS, YOLO, iou, iou_row
from caffe2jax.lowering.boxes.nms import compact, greedy_keep_rows


def _loop(ov: np.ndarray, valid: np.ndarray, threshold: float, strict: bool) -> np.ndarray:
    """The original's greedy pass: candidate i kept when valid and no kept j < i hits it
    (``ovr[i, j] > thresh`` suppresses, a NaN too; strict: ``>=``, a NaN does not)."""
    keep = np.zeros(len(valid), bool)
    for i in range(len(valid)):
        row = ov[i, keep]
        hit = (row >= threshold) if strict else ~(row <= threshold)
        keep[i] = valid[i] and not hit.any()
    return keep


def _boxes(rng, m: int) -> np.ndarray:
    """Clusters of near-copies (long suppression chains) and scattered boxes, pixel corners."""
    centre = rng.uniform(0, 200, (m, 2))
    centre[: m // 2] = rng.uniform(0, 200, (5, 2))[rng.integers(0, 5, m // 2)] + rng.normal(
        0, 3, (m // 2, 2))  # fmt: skip
    size = rng.uniform(8, 90, (m, 2))
    return np.concatenate([centre - size / 2, centre + size / 2], 1).astype(np.float32)


def _chain(m: int) -> np.ndarray:
    """Boxes each overlapping the next one above 0.7 and the one after below: the greedy pass
    keeps every other box, a chain as long as the list (the block's fixed point needs one
    round per link)."""
    x = np.arange(m, dtype=np.float32) * 2.0  # IoU 360/440 with the next, 320/480 after
    return np.stack([x, np.zeros(m), x + 19, np.full(m, 19)], 1).astype(np.float32)


@pytest.mark.parametrize(("m", "block"), [(300, 128), (41, 7)])
def test_blocks_equal_the_one_at_a_time_loop(m, block):
    """Clustered boxes, thresholds 0.3 and 0.7, a last block part padding."""
    rng = np.random.default_rng(m)
    boxes = _boxes(rng, m)
    valid = rng.uniform(size=m) < 0.9
    row = iou_row(RCNN_NMS)

    @jax.jit
    def run(b, v):
        keeps = [greedy_keep_rows(b, v, t, row, block=block) for t in (0.3, 0.7)]
        return iou(b, b, RCNN_NMS), keeps

    ov, keeps = run(boxes, valid)
    for thr, got in zip((0.3, 0.7), keeps):
        np.testing.assert_array_equal(np.asarray(got), _loop(np.asarray(ov), valid, thr, False))


def test_a_chain_through_whole_blocks():
    boxes = _chain(200)
    valid = np.ones(200, bool)
    ov = np.asarray(jax.jit(lambda b: iou(b, b, RCNN_NMS))(boxes))
    want = _loop(ov, valid, 0.7, False)
    assert want.sum() == 100  # every other box
    got = jax.jit(lambda b, v: greedy_keep_rows(b, v, 0.7, iou_row(RCNN_NMS), block=64))
    np.testing.assert_array_equal(np.asarray(got(boxes, valid)), want)


def test_strict_and_nan_overlaps_as_the_yolo_forks():
    """YOLO centre boxes of zero size overlap 0/0 = NaN: ``>=`` lets them through, the
    non-strict ``not <=`` suppresses with them."""
    rng = np.random.default_rng(4)
    boxes = rng.uniform(10, 40, (60, 4)).astype(np.float32)
    boxes[::7, 2:] = 0  # empty boxes
    valid = np.ones(60, bool)
    ov = np.asarray(jax.jit(lambda b: iou(b, b, YOLO))(boxes))
    assert np.isnan(ov).any()
    for strict in (True, False):
        got = jax.jit(lambda b, v, s=strict: greedy_keep_rows(b, v, 0.45, iou_row(YOLO), s, 16))
        np.testing.assert_array_equal(np.asarray(got(boxes, valid)), _loop(ov, valid, 0.45, strict))


def test_limit_keeps_the_first_kept_rows_compact_takes():
    """With ``limit`` the blocks stop once that many are kept: the first ``limit`` kept rows,
    all :func:`compact` reads (py-faster-rcnn's ``keep[:post_nms_topN]``), are unchanged."""
    rng = np.random.default_rng(9)
    boxes = _boxes(rng, 700)
    valid = np.ones(700, bool)
    row = iou_row(RCNN_NMS)

    @jax.jit
    def top(b, v):
        full = greedy_keep_rows(b, v, 0.7, row, block=64)
        cut = greedy_keep_rows(b, v, 0.7, row, block=64, limit=50)
        fill = jnp.zeros((4,), b.dtype)
        return compact(b, full, 50, fill), compact(b, cut, 50, fill), cut.sum(), full.sum()

    want, got, n_cut, n_full = top(boxes, valid)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert 50 <= int(n_cut) < int(n_full)
