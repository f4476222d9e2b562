"""A compiled Caffe net written as ONNX: ``export_onnx(model, params, state, path)``.

Each Caffe layer is mapped to ONNX operators from its semantics (one converter per type and
fork form, :mod:`caffe2jax.runtime.onnx.registry`; ``layers/`` for BVLC's families, ``forks/``
for the forks'), never by tracing the JAX program; the weights are the model's own, as
initializers in Caffe's blob order. Blobs keep their names. A layer with no ONNX form is
refused in one line naming it, and nothing is written. docs/onnx.md has the layer table.

``onnx`` builds and checks the graph; ``onnxruntime`` runs it (the ``[onnx]`` extra).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from caffe2jax.frontend.errors import CaffeError
from caffe2jax.runtime.formats.atomic import atomic_write
from caffe2jax.runtime.onnx.registry import OnnxExportError, supported

#: The opset written unless another is asked for: onnxruntime (1.17 on) and OpenCV 5's ONNX
#: importer both load it (docs/onnx.md).
DEFAULT_OPSET = 17
#: The oldest opset the converters write (Softmax on one axis, Split/Squeeze taking inputs).
MIN_OPSET = 13

__all__ = ["DEFAULT_OPSET", "MIN_OPSET", "OnnxExportError", "export_onnx", "save_onnx",
           "supported", "to_onnx"]  # fmt: skip


def _require_onnx():
    try:
        import onnx
    except ImportError:
        raise CaffeError(
            "ONNX export needs the onnx package: pip install 'caffe2jax[onnx]'"
        ) from None
    return onnx


def check_opset(opset: int) -> int:
    """``opset`` if the converters can write it (MIN_OPSET .. the onnx package's newest)."""
    onnx = _require_onnx()
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= int(opset) <= newest:
        raise OnnxExportError(f"opset {opset} is not supported: use {MIN_OPSET} to {newest}")
    return int(opset)


def to_onnx(model, params, state, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
            opset: int = DEFAULT_OPSET, dynamic_batch: bool = False,
            outputs: Sequence[str] | None = None):  # fmt: skip
    """The checked ``onnx.ModelProto`` of ``model``'s TEST forward (see :func:`export_onnx`)."""
    onnx = _require_onnx()
    from caffe2jax.runtime.onnx.graph import build_graph

    opset = check_opset(opset)
    if input_shapes:
        model = model.reshape(input_shapes)
    proto = build_graph(model, params, state, opset=opset, dynamic_batch=dynamic_batch,
                        outputs=outputs)  # fmt: skip
    if sum(len(t.raw_data) for t in proto.graph.initializer) >= 2**31 - 2**24:
        raise OnnxExportError(
            f"net '{model.net.name}': its weights make the ONNX file larger than protobuf's 2 GB"
        )
    onnx.checker.check_model(proto, full_check=True)
    return proto


def export_onnx(model, params, state, path: str | os.PathLike, *,
                input_shapes: Mapping[str, Sequence[int]] | None = None,
                opset: int = DEFAULT_OPSET, dynamic_batch: bool = False,
                outputs: Sequence[str] | None = None, overwrite: bool = True) -> Path:  # fmt: skip
    """Write ``model``'s TEST forward with these weights as an ONNX file at ``path``.

    ``input_shapes`` reshapes the net first (``{blob: shape}``); ``dynamic_batch`` makes the
    first axis of every input (and what follows it) a symbolic ``N``; ``outputs`` names the
    blobs to export (default: the net's outputs; the layers they do not need are left out).
    The file is checked with ``onnx.checker.check_model(full_check=True)`` and written
    atomically; a net with a layer that has no ONNX form raises :class:`OnnxExportError`
    naming it (file:line, layer, type) and writes nothing.
    """
    proto = to_onnx(model, params, state, input_shapes=input_shapes, opset=opset,
                    dynamic_batch=dynamic_batch, outputs=outputs)  # fmt: skip
    return save_onnx(path, proto, overwrite=overwrite)


def save_onnx(path: str | os.PathLike, proto, *, overwrite: bool = True) -> Path:
    """Write an ``onnx.ModelProto`` atomically (an existing file only if ``overwrite``)."""
    return atomic_write(path, proto.SerializeToString(), overwrite=overwrite)
