"""pycaffe's ``Blob`` (writable numpy ``data`` and ``diff``) and its layer view."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from caffe2jax import ir


class Blob:
    """pycaffe's Blob: writable numpy ``data`` and ``diff``, fetched from the device lazily."""

    def __init__(self, shape: Sequence[int], dtype: Any = np.float32):
        self._dtype = np.dtype(dtype)
        self._shape = tuple(int(d) for d in shape)
        self._device: jax.Array | None = None
        self._data: np.ndarray | None = np.zeros(self._shape, self._dtype)
        self._diff = np.zeros(self._shape, self._dtype)

    def _set_device(self, value: jax.Array) -> None:
        """New contents computed on the device; numpy copies are made only when asked for."""
        self._device = value
        self._data = None
        self._shape = tuple(value.shape)

    def _value(self) -> jax.Array | np.ndarray:
        """The current contents for the next computation (a user's edits included)."""
        return self._data if self._data is not None else self._device

    @property
    def data(self) -> np.ndarray:
        if self._data is None:
            self._data = np.array(self._device, dtype=self._dtype)
        return self._data

    @data.setter
    def data(self, value) -> None:
        self.data[...] = value

    @property
    def diff(self) -> np.ndarray:
        return self._diff

    @diff.setter
    def diff(self, value) -> None:
        self._diff[...] = value

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def count(self) -> int:
        return int(np.prod(self._shape))

    def _legacy(self, axis: int) -> int:
        return self._shape[axis] if len(self._shape) > axis else 1

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))

    def reshape(self, *shape: int) -> None:
        """Give the blob a new shape (call ``net.reshape()`` or just forward afterwards)."""
        self._shape = tuple(int(d) for d in shape)
        self._device = None
        self._data = np.zeros(self._shape, self._dtype)
        self._diff = np.zeros(self._shape, self._dtype)


class Layer:
    """pycaffe's layer view: ``type`` and ``blobs``."""

    def __init__(self, layer: ir.Layer, blobs: list[Blob]):
        self.type = layer.type
        self.name = layer.param.name if layer.param is not None else layer.name
        self.blobs = blobs
