"""Caffe's ``MemoryData`` layer (layers/memory_data_layer.cpp): ``batch_size`` rows per
forward from the arrays given to ``set_input_arrays``, wrapping, as MemoryDataLayer::Reset and
Forward do."""

from __future__ import annotations

import numpy as np

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.readers import reader


@reader("MemoryData")
class MemoryData:
    """Caffe's MemoryDataLayer: cycles through user arrays ``batch_size`` rows at a time."""

    def __init__(self, layer: ir.Layer):
        p = layer.param.memory_data_param
        self.layer = layer
        self.batch_size = p.batch_size
        self.shape = (p.channels, p.height, p.width)
        self.data: np.ndarray | None = None
        self.labels: np.ndarray | None = None
        self.pos = 0

    def top_shapes(self) -> list[tuple[int, ...]]:
        return [(self.batch_size, *self.shape), (self.batch_size,)]

    def reset(self, data: np.ndarray, labels: np.ndarray) -> None:
        data = np.ascontiguousarray(data, np.float32)
        labels = np.ascontiguousarray(labels, np.float32).reshape(len(labels), -1)[:, 0]
        name = self.layer.name
        if data.ndim != 4 or data.shape[1:] != self.shape:
            raise DataError(
                f"MemoryData layer '{name}': data must be (N, {', '.join(map(str, self.shape))}), "
                f"got {list(data.shape)}"
            )
        if len(labels) != len(data):
            raise DataError(
                f"MemoryData layer '{name}': {len(data)} data rows but {len(labels)} labels"
            )
        if len(data) % self.batch_size:
            raise DataError(
                f"MemoryData layer '{name}': the number of rows ({len(data)}) must be a "
                f"multiple of batch_size ({self.batch_size})"
            )
        self.data, self.labels, self.pos = data, labels, 0

    def next_batch(self) -> list[np.ndarray]:
        if self.data is None:
            raise DataError(
                f"MemoryData layer '{self.layer.name}' has no data: call "
                "set_input_arrays(data, labels) first"
            )
        rows = slice(self.pos, self.pos + self.batch_size)
        self.pos = (self.pos + self.batch_size) % len(self.data)
        return [self.data[rows], self.labels[rows]]

    def get_state(self) -> dict:
        return {"pos": self.pos}

    def set_state(self, state: dict) -> None:
        self.pos = int(state["pos"])

    def skip(self, batches: int) -> None:
        """Advance as if ``batches`` forwards had run (resuming a run at an iteration)."""
        if self.data is not None:
            self.pos = (self.pos + batches * self.batch_size) % len(self.data)
