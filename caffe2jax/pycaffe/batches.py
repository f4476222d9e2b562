"""pycaffe's whole-array helpers (``forward_all``, ``forward_backward_all``): every row of
the given arrays through the net a batch at a time, the last batch padded, as pycaffe's
``_Net_forward_all`` and ``_Net_forward_backward_all`` do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from caffe2jax.frontend.errors import NetError

if TYPE_CHECKING:
    from caffe2jax.pycaffe.net import Net


def forward_all(net: Net, blobs: Sequence[str] | None = None, **kwargs: Any) -> dict:
    """Forward every row of the given input arrays, a batch at a time (the last batch is
    padded); returns the outputs (and ``blobs``) for all rows, as pycaffe does."""
    if not kwargs:
        raise NetError("forward_all() needs the input arrays as keywords")
    rows = {len(v) for v in kwargs.values()}
    if len(rows) != 1:
        raise NetError("forward_all(): every input needs the same number of rows")
    total = rows.pop()
    batch = net.blobs[next(iter(kwargs))].shape[0]
    outs: dict[str, list[np.ndarray]] = {}
    for start in range(0, total, batch):
        chunk = {name: _padded(value[start : start + batch], batch)
                 for name, value in kwargs.items()}  # fmt: skip
        for name, value in net.forward(blobs, **chunk).items():
            outs.setdefault(name, []).append(np.array(value))
    return _rows(outs, total)


def forward_backward_all(
    net: Net, blobs: Sequence[str] | None = None, diffs: Sequence[str] | None = None, **kwargs
) -> tuple[dict, dict]:
    """pycaffe's forward_backward_all: forward and backward over every batch of the given
    inputs (output diffs may be given as keywords too); outputs and input diffs."""
    inputs = {k: v for k, v in kwargs.items() if k in net.inputs}
    top_diffs = {k: v for k, v in kwargs.items() if k in net.outputs}
    rows = {len(v) for v in [*inputs.values(), *top_diffs.values()]}
    if len(rows) != 1:
        raise NetError("forward_backward_all(): every array needs the same number of rows")
    total = rows.pop()
    batch = net.blobs[net.inputs[0]].shape[0] if net.inputs else total
    outs: dict[str, list] = {}
    grads: dict[str, list] = {}
    for start in range(0, total, batch):
        rows_in = {k: _padded(v[start : start + batch], batch) for k, v in inputs.items()}
        for name, value in net.forward(blobs, **rows_in).items():
            outs.setdefault(name, []).append(np.array(value))
        rows_diff = {k: _padded(v[start : start + batch], batch)
                     for k, v in top_diffs.items()}  # fmt: skip
        for name, value in net.backward(diffs, **rows_diff).items():
            grads.setdefault(name, []).append(np.array(value))
    return _rows(outs, total), _rows(grads, total)


def _rows(parts: dict[str, list[np.ndarray]], total: int) -> dict[str, np.ndarray]:
    """Per-batch results joined row-wise (padding dropped); a scalar output such as a loss
    gives one value per batch (pycaffe cannot join those at all)."""
    return {name: np.stack(v) if v[0].ndim == 0 else np.concatenate(v)[:total]
            for name, v in parts.items()}  # fmt: skip


def _padded(value: Any, batch: int) -> np.ndarray:
    part = np.asarray(value, np.float32)
    if len(part) < batch:  # pad the last batch, as pycaffe does
        part = np.concatenate([part, np.zeros((batch - len(part), *part.shape[1:]), np.float32)])
    return part
