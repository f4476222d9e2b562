"""Building an ONNX graph: nodes, initializers, fresh names, and the few operator forms that
depend on the opset (reductions take their axes as an attribute before opset 18 and as an
input from it; ReduceSum from opset 13).

The builder knows nothing about Caffe: :mod:`caffe2jax.runtime.onnx.graph` walks the net and
each converter (``runtime/onnx/layers``, ``runtime/onnx/forks``) emits its layer's operators
through :meth:`Builder.op`. Every value is float32 unless an operator makes another type
(indices are int64); names are unique across the graph.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper

#: float32 extremes, as Caffe's FLT_MAX / FLT_MIN
FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)

_AXES_AS_INPUT_SINCE = {"ReduceSum": 13}  # every other Reduce* takes axes as an input from 18


class Builder:
    """The nodes and initializers of one ONNX graph (or Loop body, ``parent`` given)."""

    def __init__(self, opset: int, parent: Builder | None = None):
        self.opset = opset
        self.nodes: list[NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.parent = parent
        self._names: set[str] = set() if parent is None else parent._names
        self._count = itertools.count() if parent is None else parent._count
        self.scope = "" if parent is None else parent.scope
        self.batch_source: tuple[str, int] | None = None  # (value, axis) that holds N
        self._batch: str | None = None

    # -- names ----------------------------------------------------------------------------

    def reserve(self, name: str) -> str:
        """Mark ``name`` (a blob, an input) as taken so that fresh names avoid it."""
        self._names.add(name)
        return name

    def taken(self, name: str) -> bool:
        return name in self._names

    def fresh(self, hint: str = "t") -> str:
        """A new value name ``<layer>/<hint><n>``."""
        prefix = f"{self.scope}/" if self.scope else ""
        while True:
            name = f"{prefix}{hint}{next(self._count)}"
            if name not in self._names:
                return self.reserve(name)

    @contextlib.contextmanager
    def in_scope(self, scope: str) -> Iterator[None]:
        """Fresh names made inside are prefixed with ``scope`` (the layer's name)."""
        before, self.scope = self.scope, scope
        try:
            yield
        finally:
            self.scope = before

    # -- nodes and constants --------------------------------------------------------------

    def op(self, op_type: str, inputs: Sequence[str], *, outputs: int | Sequence[str] = 1,
           hint: str | None = None, **attrs: Any) -> Any:  # fmt: skip
        """Append one node; returns its output name (or the list of them when several). An
        empty string in ``inputs`` is an omitted optional input."""
        if isinstance(outputs, int):
            names = [self.fresh(hint or op_type.lower()) for _ in range(outputs)]
        else:
            names = [self.reserve(n) for n in outputs]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        node = helper.make_node(op_type, list(inputs), names, name=self.fresh(op_type), **attrs)
        self.nodes.append(node)
        return names[0] if len(names) == 1 else names

    def const(self, value: Any, hint: str = "c", dtype: Any = None, name: str | None = None) -> str:
        """An initializer holding ``value`` (float32 unless ``dtype`` or an integer array)."""
        array = np.asarray(value, dtype=dtype)
        if dtype is None and array.dtype.kind == "f":
            array = array.astype(np.float32)
        name = self.reserve(name) if name else self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.array(array, order="C"), name))
        return name

    def i64(self, values: Any, hint: str = "i") -> str:
        return self.const(np.asarray(values, np.int64), hint)

    def f32(self, value: Any, hint: str = "f") -> str:
        return self.const(np.asarray(value, np.float32), hint)

    # -- operator forms -------------------------------------------------------------------

    def reduce(self, op_type: str, x: str, axes: Sequence[int], keepdims: bool = True) -> str:
        """``op_type`` (ReduceSum, ReduceMean, ReduceMax…) over ``axes`` in this opset's form."""
        axes = [int(a) for a in axes]
        if not axes:
            raise ValueError("a reduction over no axes (ONNX would reduce over all of them)")
        if self.opset >= _AXES_AS_INPUT_SINCE.get(op_type, 18):
            return self.op(op_type, [x, self.i64(axes)], keepdims=int(keepdims))
        return self.op(op_type, [x], axes=axes, keepdims=int(keepdims))

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        """Reshape to ``shape`` (one ``-1`` allowed; no 0s: they would copy a dim)."""
        return self.op("Reshape", [x, self.i64(list(shape))])

    def unsqueeze(self, x: str, axes: Sequence[int]) -> str:
        return self.op("Unsqueeze", [x, self.i64(list(axes))])

    def squeeze(self, x: str, axes: Sequence[int]) -> str:
        return self.op("Squeeze", [x, self.i64(list(axes))])

    def slice(self, x: str, starts, ends, axes, steps=None) -> str:
        """``x[starts:ends:steps]`` on ``axes`` (static bounds)."""
        inputs = [x, self.i64(list(starts)), self.i64(list(ends)), self.i64(list(axes))]
        if steps is not None:
            inputs.append(self.i64(list(steps)))
        return self.op("Slice", inputs)

    def cast(self, x: str, to: int) -> str:
        return self.op("Cast", [x], to=to)

    def where(self, cond: str, a: str, b: str) -> str:
        return self.op("Where", [cond, a, b])

    def scalar_i64(self, x: str) -> str:
        """A float value (any shape of one element) as an int64 scalar."""
        return self.cast(self.reshape(x, []), TensorProto.INT64)

    # -- the batch size (dynamic batch) ---------------------------------------------------

    def batch_size(self) -> str:
        """An int64 [1] value holding N, read from a graph input's shape at run time."""
        top = self
        while top.parent is not None:
            top = top.parent
        if top._batch is None:
            if top.batch_source is None:
                raise ValueError("no graph input carries the batch size")
            value, axis = top.batch_source
            shape = top.op("Shape", [value], hint="shape")
            top._batch = top.op("Gather", [shape, top.i64([axis])], hint="batch")
        return top._batch

    def shape_tensor(self, dims: Sequence[int], batch_axis: int | None = None,
                     per_batch: int = 1) -> str:  # fmt: skip
        """An int64 shape value: ``dims``, with axis ``batch_axis`` (if given) holding
        N·``per_batch`` computed at run time."""
        if batch_axis is None:
            return self.i64(list(dims))
        n = self.batch_size()
        if per_batch != 1:
            n = self.op("Mul", [n, self.i64([per_batch])])
        parts = []
        if batch_axis:
            parts.append(self.i64(list(dims[:batch_axis])))
        parts.append(n)
        if batch_axis + 1 < len(dims):
            parts.append(self.i64(list(dims[batch_axis + 1 :])))
        return parts[0] if len(parts) == 1 else self.op("Concat", parts, axis=0)

    # -- loops ----------------------------------------------------------------------------

    def loop(self, trips: str, body: Callable[[Builder, str], str]) -> str:
        """A Loop of ``trips`` (an int64 scalar value) iterations: ``body(b, i)`` emits into
        the body builder ``b`` the value of iteration ``i`` (an int64 scalar); the results are
        stacked along a new first axis. The body may read any value of this graph."""
        b = Builder(self.opset, parent=self)
        i, cond = self.fresh("iter"), self.fresh("cond")
        out = body(b, i)
        again = b.op("Identity", [cond])
        graph = helper.make_graph(
            b.nodes,
            self.fresh("body"),
            [helper.make_tensor_value_info(i, TensorProto.INT64, []),
             helper.make_tensor_value_info(cond, TensorProto.BOOL, [])],
            [helper.make_tensor_value_info(again, TensorProto.BOOL, []),
             helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
            initializer=b.initializers,
        )  # fmt: skip
        return self.op("Loop", [trips, ""], body=graph)
