"""runtime/outputs/ctc_decode.py: greedy CTC decoding of (T, N, C) and (N, T, C) scores, by hand."""

from __future__ import annotations

import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.outputs.ctc_decode import ctc_greedy_decode


def _scores(paths, classes: int) -> np.ndarray:
    """(N, T, C) scores whose argmax per step is ``paths[n][t]``."""
    x = np.full((len(paths), len(paths[0]), classes), -1.0, np.float32)
    for n, path in enumerate(paths):
        for t, k in enumerate(path):
            x[n, t, k] = 2.0
    return x


PATHS = [[10, 3, 3, 10, 3, 7], [10, 10, 10, 10, 10, 10], [0, 0, 1, 1, 10, 1]]
DECODED = [[3, 3, 7], [], [0, 1, 1]]  # blank 10 splits repeats; runs of a class collapse


def test_decode_time_major_and_batch_major():
    ntc = _scores(PATHS, 11)
    assert ctc_greedy_decode(ntc.transpose(1, 0, 2), blank_label=10) == DECODED
    assert ctc_greedy_decode(ntc, blank_label=10, layout="NTC") == DECODED
    assert caffe2jax.ctc_greedy_decode is ctc_greedy_decode


def test_decode_blank_zero():
    x = _scores([[0, 2, 2, 0, 2, 1]], 3)
    assert ctc_greedy_decode(x, layout="NTC") == [[2, 2, 1]]


def test_decode_refuses_other_shapes():
    with pytest.raises(DataError, match="3-D scores"):
        ctc_greedy_decode(np.zeros((2, 3)))
    with pytest.raises(DataError, match="layout"):
        ctc_greedy_decode(np.zeros((2, 3, 4)), layout="CTN")
