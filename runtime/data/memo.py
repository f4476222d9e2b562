"""Keeping small files a data layer reads again and again (within a byte budget).

Caffe reads each HDF5 file or listed image again every time its batch reaches it: with a
batch larger than the files hold (``batch_size`` 100000 over 6-row HDF5 files, over an image
list of one picture), a single batch re-reads the same files tens of thousands of times. A
:class:`Memo` keeps what was read while the total stays within :data:`MEMO_BYTES`; the arrays
are what a fresh read gives (they are never written to), so batches are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

import numpy as np

MEMO_BYTES = 64 << 20  # per reader
T = TypeVar("T")


def _nbytes(value: object) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


def _freeze(value: object) -> None:
    if isinstance(value, np.ndarray):
        value.setflags(write=False)
    elif isinstance(value, list | tuple):
        for v in value:
            _freeze(v)


class Memo:
    """``memo.get(key, read)``: ``read()`` once per key while the kept bytes fit."""

    def __init__(self, limit: int = MEMO_BYTES) -> None:
        self.limit = limit
        self.held = 0
        self._kept: dict[Hashable, object] = {}

    def get(self, key: Hashable, read: Callable[[], T]) -> T:
        if key in self._kept:
            return self._kept[key]  # type: ignore[return-value]
        value = read()
        size = _nbytes(value)
        if self.held + size <= self.limit:
            _freeze(value)  # kept arrays are shared between batches: nothing may write them
            self._kept[key] = value
            self.held += size
        return value
