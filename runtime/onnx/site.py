"""What a converter sees of its layer: the builder, its bottoms and tops (ONNX value names and
the static shapes caffe2jax inferred), its weights in Caffe's blob order, and which axis of
each blob holds the batch when the export's batch is dynamic."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import numpy as np

from caffe2jax.frontend import ir
from caffe2jax.lowering.python_layer import registered_python_layers
from caffe2jax.runtime.onnx.builder import Builder
from caffe2jax.runtime.onnx.registry import refusal

Shape = tuple[int, ...]


@dataclass(frozen=True)
class BatchDim:
    """Axis ``axis`` of a blob holds ``per_batch``·N items (N the batch size)."""

    axis: int
    per_batch: int


@dataclass
class Site:
    """One layer being converted (see the module docstring)."""

    g: Builder
    layer: ir.Layer
    bottoms: list[str]
    tops: list[str]
    bottom_shapes: list[Shape]
    top_shapes: list[Shape]
    blobs: list[np.ndarray]
    blob_keys: list[tuple[str, int]]
    bottom_batch: list[BatchDim | None]
    top_batch: list[BatchDim | None]
    phase: str = ir.TEST
    producers: list[ir.Layer | None] = field(default_factory=list)
    consts: dict = field(default_factory=dict)  # shared: (owner, j) -> initializer name
    writers: dict = field(default_factory=dict)  # every blob (SSA id) -> the layer writing it

    @property
    def param(self):
        """The layer's LayerParameter (read only)."""
        return self.layer.param

    @property
    def dynamic(self) -> bool:
        """Whether any bottom or top has a symbolic batch axis."""
        return any(b is not None for b in (*self.bottom_batch, *self.top_batch))

    def refuse(self, why: str) -> NoReturn:
        raise refusal(self.layer, why)

    def require_builtin(self) -> None:
        """A Python layer converts only when caffe2jax runs its own built-in version of it
        (no function registered for it, its module not importable), as the lowering does."""
        p = self.param.python_param
        if f"{p.module}.{p.layer}" in registered_python_layers():
            self.refuse("a Python layer registered with register_python_layer has no ONNX form")
        try:
            found = importlib.util.find_spec(p.module) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            self.refuse(f"module '{p.module}' on sys.path runs instead of caffe2jax's built-in "
                        "layer, and a user's Python code has no ONNX form")  # fmt: skip

    def blob(self, j: int) -> str:
        """The initializer holding blob ``j`` as the file stores it (one per blob, shared
        blobs once under their owner's name ``<owner>/<j>``)."""
        key = self.blob_keys[j]
        if key not in self.consts:
            self.consts[key] = self.g.const(self.blobs[j], name=f"{key[0]}/{key[1]}")
        return self.consts[key]

    def array(self, j: int) -> np.ndarray:
        """Blob ``j`` as a float32 numpy array (to fold at export)."""
        return np.asarray(self.blobs[j], np.float32)

    # -- shapes that follow the batch ------------------------------------------------------

    def static_batch(self, what: str) -> None:
        """Refuse a dynamic batch for a computation that needs its batch size fixed."""
        if self.dynamic:
            self.refuse(f"{what}: export it with a fixed batch (without --dynamic-batch)")

    def target(self, shape: Sequence[int], batch: BatchDim | None) -> list[int]:
        """``shape`` for a Reshape: the batch axis (when dynamic) as -1."""
        dims = [int(d) for d in shape]
        if batch is not None:
            dims[batch.axis] = -1
        return dims

    def reshape_top(self, x: str, i: int = 0) -> str:
        """``x`` reshaped to top ``i``'s shape (its batch axis, when dynamic, as -1)."""
        return self.g.reshape(x, self.target(self.top_shapes[i], self.top_batch[i]))

    def shape_value(self, shape: Sequence[int], batch: BatchDim | None) -> str:
        """An int64 shape value for Expand / ConstantOfShape (N read at run time if dynamic)."""
        if batch is None:
            return self.g.i64(list(shape))
        return self.g.shape_tensor(shape, batch.axis, batch.per_batch)

    def batch_at(self, i: int, axis: int = 0) -> bool:
        """Whether bottom ``i`` has its batch (when dynamic) on ``axis`` or none at all."""
        b = self.bottom_batch[i]
        return b is None or b.axis == axis
