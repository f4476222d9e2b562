"""Where each blob holds the batch, for an export whose batch size is dynamic.

caffe2jax compiles a net for fixed input shapes. To make the batch N symbolic, the net is
compiled a second time with every input's first axis doubled; a blob whose shape changes on
exactly one axis, by exactly the factor 2, holds ``per_batch``·N items on that axis; a blob
whose shape does not change does not depend on N. Any other change (two axes, or a size that
is not proportional: a detection output capped at a fixed number of rows) cannot be written
with one symbolic N and is refused, naming the blob and the layer that writes it.
"""

from __future__ import annotations

from collections.abc import Mapping

from caffe2jax.frontend.errors import CaffeError
from caffe2jax.runtime.onnx.registry import OnnxExportError
from caffe2jax.runtime.onnx.site import BatchDim


def batch_dims(model) -> dict[str, BatchDim | None]:
    """For every blob (SSA id) of ``model``: its batch axis, or None if it does not depend
    on the batch size (see the module docstring)."""
    shapes = dict(model.net.shapes)
    batch = _batch_size(model)
    doubled = {name: (2 * s[0], *s[1:]) for name, s in model.inputs.items() if s}
    try:
        other = dict(model.reshape(doubled).net.shapes)
    except CaffeError as err:
        raise OnnxExportError(
            f"--dynamic-batch: the net does not compile for another batch size ({err})"
        ) from None
    writer = {top: layer for layer in model.net.layers for top in layer.tops}
    return {name: _axis(name, shape, other.get(name), batch, writer) for name, shape in
            shapes.items()}  # fmt: skip


def _batch_size(model) -> int:
    sizes = {s[0] for s in model.inputs.values() if s}
    if len(sizes) != 1:
        raise OnnxExportError(
            "--dynamic-batch needs every input to have the same first dim (the batch); got "
            + ", ".join(f"'{k}' {list(v)}" for k, v in model.inputs.items())
        )
    return sizes.pop()


def _axis(name: str, one: tuple, two: tuple | None, batch: int, writer: Mapping) -> BatchDim | None:
    if two is None or tuple(one) == tuple(two):
        return None
    changed = [i for i, (a, b) in enumerate(zip(one, two)) if a != b]
    if len(one) == len(two) and len(changed) == 1:
        i = changed[0]
        if two[i] == 2 * one[i] and one[i] % batch == 0:
            return BatchDim(i, one[i] // batch)
    layer = writer.get(name)
    where = f" (written by layer '{layer.name}', type {layer.type})" if layer else ""
    raise OnnxExportError(
        f"--dynamic-batch: blob '{name}'{where} is {list(one)} at batch {batch} and "
        f"{list(two)} at batch {2 * batch}: not a multiple of one symbolic batch size"
    )
