"""Greedy (best-path) CTC decoding of a CRNN net's scores, for inference scripts.

The decoding is the one CRNN's LabelsequenceAccuracy layer scores (yalecyu/crnn.caffe
labelsequence_accuracy_layer.cpp): per step the class with the highest score (the first on
ties), then a step equal to the step before it or to ``blank_label`` is dropped (the step
before t = 0 counts as a blank). ``caffe2jax.ctc_greedy_decode(net.blobs["fc1"].data,
blank_label=10)`` reads the (T, N, C) scores a CRNN net's last InnerProduct gives.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend.errors import DataError
from caffe2jax.lowering.forks.crnn import greedy_decode

_LAYOUTS = ("TNC", "NTC")


def ctc_greedy_decode(scores, blank_label: int = 0, layout: str = "TNC") -> list[list[int]]:
    """The label sequence of each sample of ``scores`` ((T, N, C) time-major as CtcLoss reads
    them, or (N, T, C) with ``layout="NTC"`` as LabelsequenceAccuracy reads them)."""
    x = np.asarray(scores)
    if layout not in _LAYOUTS or x.ndim != 3:
        raise DataError(f"ctc_greedy_decode needs 3-D scores in layout {' or '.join(_LAYOUTS)}; "
                        f"got shape {list(x.shape)}, layout {layout!r}")  # fmt: skip
    if layout == "TNC":
        x = x.transpose(1, 0, 2)
    labels, lengths = (np.asarray(a) for a in greedy_decode(jnp.asarray(x), blank_label))
    return [row[:n].tolist() for row, n in zip(labels, lengths)]
