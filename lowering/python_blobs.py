"""The host blobs a class-style Python layer sees: pycaffe's ``caffe.Layer`` base class, its
numpy ``bottom``/``top`` blobs and ``self.blobs`` (see :mod:`caffe2jax.lowering.python_class`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from caffe2jax.frontend.phase import TRAIN


class HostBlob:
    """A numpy blob handed to a Python layer: ``data``, ``diff``, ``shape``, ``count``,
    ``num``/``channels``/``height``/``width`` and ``reshape(*shape)`` as pycaffe's Blob.

    These are host buffers for one callback, not views of the net's blobs (those are
    :class:`caffe2jax.Blob`)."""

    def __init__(self, shape: Sequence[int] = (), dtype: Any = np.float32):
        self._dtype = np.dtype(dtype)
        self.reshape(*shape)

    def reshape(self, *shape: int) -> None:
        """Caffe's Blob::Reshape: the same shape keeps the contents; a new one starts from
        zeros."""
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        shape = tuple(int(d) for d in shape)
        if getattr(self, "data", None) is not None and self.data.shape == shape:
            return
        self.data = np.zeros(shape, self._dtype)
        self.diff = np.zeros_like(self.data)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def count(self) -> int:
        return int(self.data.size)

    def _legacy(self, axis: int) -> int:
        return self.data.shape[axis] if self.data.ndim > axis else 1

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))


class BlobVec(list):
    """pycaffe's ``layer.blobs``: a list of blobs with ``add_blob(*shape)``."""

    def add_blob(self, *shape: int) -> None:
        self.append(HostBlob(shape))


class Layer:
    """pycaffe's ``caffe.Layer``: subclass it and define ``setup``, ``reshape``, ``forward``
    and (when a bottom or blob needs a gradient) ``backward``."""

    def __init__(self, param: Any = None):
        self.layer_param = param
        self.param_str = param.python_param.param_str if param is not None else ""
        self.phase = TRAIN  # Caffe's Phase enum: == 0, str() 'TRAIN'
        self.blobs = BlobVec()

    @property
    def type(self) -> str:
        return "Python"

    def setup(self, bottom: list[HostBlob], top: list[HostBlob]) -> None:
        """Called once, when the net is built."""

    def reshape(self, bottom: list[HostBlob], top: list[HostBlob]) -> None:
        """Give the tops their shapes (called before every forward, as Caffe does)."""
