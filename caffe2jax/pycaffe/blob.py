"""pycaffe's ``Blob``: ``data`` and ``diff`` as stable, writable numpy views, filled lazily.

Caffe's blobs are memory a script can hold: ``w = net.params['conv1'][0].data`` keeps showing
the weights after ``solver.step``, and ``w[...] = 0`` changes what the next step starts from.
Here each of ``data`` and ``diff`` is a :class:`Slot`: its current value lives where it was
computed (a device array, or a function that computes it on first access), and the numpy
array a user sees is made only when asked for. Once made, the array *is* the slot: a new value
is copied into it when anyone still holds it (so held arrays and views never go stale), and it
is the value the next computation reads (so writes through it are honoured). Nobody holding it
means nobody can read it again, so a new value simply replaces it: users who never read a blob
pay nothing for it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Value = Any  # a jax.Array, a numpy array, or a zero-argument function computing one


class Slot:
    """One numpy-backed value (a blob's data or its diff) that is filled on first access."""

    __slots__ = ("_array", "_cache", "_source", "_touched", "dtype", "shape")

    def __init__(self, shape: Sequence[int], dtype: Any, value: Value = None):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self._array: np.ndarray | None = None
        self._source: Value = value
        self._cache: Any = None
        self._touched = False

    def _held(self) -> bool:
        """True when something besides this slot references the numpy array (a user's
        variable, a view of it): then it must keep showing the slot's value."""
        # getrefcount counts the attribute and its own argument.
        return self._array is not None and sys.getrefcount(self._array) > 2

    def set(self, value: Value) -> None:
        """A new value (device array, numpy array or thunk); held arrays see it at once."""
        if self._array is not None and self._held():
            value = _materialize(value, self.shape, self.dtype)
            self._array[...] = value
            self._source = None
            self._cache = value if isinstance(value, jax.Array) else None
        else:
            self._array = None
            self._source = value
            self._cache = None
        self._touched = False

    def array(self) -> np.ndarray:
        """The numpy array users read and write (made on first access, then stable)."""
        if self._array is None:
            self._array = _fresh(_materialize(self._source, self.shape, self.dtype), self.dtype)
            self._source = None
        self._touched = True
        return self._array

    def value(self) -> Value:
        """The current value for a computation: the user's array when one was made, else the
        device value (a thunk is evaluated, and its result kept)."""
        if self._array is not None:
            return self._array
        if callable(self._source):
            self._source = self._source()
        if self._source is None:
            self._source = np.zeros(self.shape, self.dtype)
        return self._source

    def device(self) -> jax.Array:
        """The current value as a device array, transferred again only when the user's array
        may have changed since the last transfer."""
        if self._array is not None:
            if self._cache is None or self.dirty():
                # a copy on the host first: the user keeps writing the array, and on the CPU
                # jax.device_put of a NumPy array shares its memory even with may_alias=False
                # (jax 0.10); no compiled program per shape, as jnp.asarray would make
                self._cache = jax.device_put(np.array(self._array, copy=True))
                self._touched = False
            return self._cache
        value = self.value()
        if not isinstance(value, jax.Array):
            value = self._source = jnp.asarray(value)
        return value

    def dirty(self) -> bool:
        """Whether a user may have written the array since the last :meth:`set` or
        :meth:`clean`: it was handed out, or is still held."""
        return self._array is not None and (self._touched or self._held())

    def clean(self) -> None:
        self._touched = False

    def reshape(self, shape: Sequence[int]) -> None:
        """Caffe's Blob::Reshape: the same shape keeps the contents; a new one starts from
        zeros (an array users hold keeps its old shape, as a numpy array over Caffe's
        reallocated memory would not exist either)."""
        shape = tuple(int(d) for d in shape)
        if shape == self.shape:
            return
        self.shape = shape
        self._array = None
        self._source = None
        self._cache = None
        self._touched = False


def _materialize(value: Value, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    if callable(value):
        from caffe2jax.lowering.python_class import user_errors

        with user_errors():
            value = value()
    if value is None:
        return np.zeros(shape, dtype)
    return value


def _fresh(value: Any, dtype: np.dtype) -> np.ndarray:
    """A writable numpy array of its own (never an alias of a device buffer); a Python
    layer's exception that reaches this read keeps its own type."""
    if isinstance(value, np.ndarray):
        return np.array(value, dtype=dtype, copy=True)
    from caffe2jax.lowering.python_class import user_errors

    with user_errors():
        return np.array(value, dtype=dtype, copy=True)


class Blob:
    """pycaffe's Blob: ``data``, ``diff``, ``shape``, ``count``, ``num``…, ``reshape``."""

    def __init__(self, shape: Sequence[int], dtype: Any = np.float32):
        self._dtype = np.dtype(dtype)
        self._data = Slot(shape, self._dtype)
        self._diff = Slot(shape, self._dtype)

    @property
    def data(self) -> np.ndarray:
        return self._data.array()

    @data.setter
    def data(self, value) -> None:
        self.data[...] = value

    @property
    def diff(self) -> np.ndarray:
        return self._diff.array()

    @diff.setter
    def diff(self, value) -> None:
        self.diff[...] = value

    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def count(self) -> int:
        return int(np.prod(self.shape))

    def _legacy(self, axis: int) -> int:
        return self.shape[axis] if len(self.shape) > axis else 1

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))

    def reshape(self, *shape: int) -> None:
        """Caffe's Blob::Reshape, in place: this Blob object stays the net's (handles a
        script holds see the new shape); the next forward takes the new shape."""
        shape = tuple(int(d) for d in (shape[0] if len(shape) == 1 and
                                       isinstance(shape[0], tuple | list) else shape))  # fmt: skip
        from caffe2jax.frontend.errors import NetError
        from caffe2jax.lowering.limits import shape_problem

        problem = shape_problem(shape)  # Blob::Reshape's CHECKs: dims >= 0, count <= INT_MAX
        if problem:
            raise NetError(f"Blob.reshape{shape}: the shape {problem}")
        self._data.reshape(shape)
        self._diff.reshape(shape)

    # -- the owning net's side: how a computation hands the blob a value and reads it back ---

    def set_data(self, value: Value) -> None:
        """A new ``data`` value (device array, numpy array, or a function computing it on
        first read); arrays a script holds see it at once."""
        self._data.set(value)

    def set_diff(self, value: Value) -> None:
        """A new ``diff`` value (as :meth:`set_data`; None: zeros)."""
        self._diff.set(value)

    def device_data(self) -> jax.Array:
        """``data`` as a device array for the next computation (what a script wrote
        included)."""
        return self._data.device()

    def device_diff(self) -> jax.Array:
        """``diff`` as a device array for the next computation."""
        return self._diff.device()

    def data_written(self) -> bool:
        """Whether a script may have written ``data`` since its value was last set."""
        return self._data.dirty()
