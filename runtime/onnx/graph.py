"""A compiled net as one ONNX graph, built from the Net IR layer by layer.

The layers are walked in the net's order (only those the requested outputs need); each is
converted by its registered converter (:mod:`caffe2jax.runtime.onnx.registry`). Every blob
keeps its name: a blob's last version is the ONNX value of the blob's own name (``conv1`` after
an in-place ReLU is the ReLU's output, as Caffe's ``net.blobs['conv1']`` shows), earlier
versions are named ``<blob>@<writer layer>`` as in caffe2jax's IR. Inputs keep their names and
shapes (the first axis ``N`` with a dynamic batch); outputs are the net's outputs (the blobs no
layer reads) unless others are asked for. Weights are initializers named ``<layer>/<i>`` in
Caffe's blob order (a shared blob once, under its owner).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from caffe2jax.frontend import ir
from caffe2jax.runtime.onnx.batch import batch_dims
from caffe2jax.runtime.onnx.builder import Builder
from caffe2jax.runtime.onnx.registry import OnnxExportError, lookup
from caffe2jax.runtime.onnx.site import BatchDim, Site


def needed_layers(net: ir.Net, outputs: Sequence[str]) -> list[ir.Layer]:
    """The layers (in net order) that the blobs ``outputs`` (SSA ids) depend on."""
    wanted = set(outputs)
    keep = []
    for layer in reversed(net.layers):
        if wanted & set(layer.tops):
            keep.append(layer)
            wanted |= set(layer.bottoms)
    return keep[::-1]


def _output_ids(model, outputs: Sequence[str] | None) -> list[str]:
    net = model.net
    names = list(outputs) if outputs else list(net.outputs)
    unknown = [n for n in names if n not in net.blob_names and n not in net.shapes]
    if unknown:
        raise OnnxExportError(
            f"no blob named {', '.join(repr(n) for n in unknown)} in net '{net.name}' "
            f"(its outputs: {', '.join(net.outputs)})"
        )
    if not names:
        raise OnnxExportError(f"net '{net.name}' has no output blob to export")
    return [net.blob_names.get(n, n) for n in names]


class _Walk:
    """The state of one export: the builder, the ONNX name of each blob, the shared consts."""

    def __init__(self, model, params, state, opset: int, dynamic: bool):
        self.model, self.params, self.state = model, params, state
        self.g = Builder(opset)
        self.batch: dict[str, BatchDim | None] = batch_dims(model) if dynamic else {}
        self.names: dict[str, str] = {}
        self.inputs: list[onnx.ValueInfoProto] = []
        self.consts: dict = {}
        self.writer = {top: layer for layer in model.net.layers for top in layer.tops}
        for user, ssa in model.graph.input_versions.items():
            self.names[ssa] = self.g.reserve(user)
        for ssa in model.net.shapes:
            if ssa not in self.names:
                name = ssa if not self.g.taken(ssa) else f"{ssa}@{self.writer[ssa].name}"
                self.names[ssa] = self.g.reserve(name)

    def value_info(self, ssa: str) -> onnx.ValueInfoProto:
        shape: list[Any] = list(self.model.net.shapes[ssa])
        dim = self.batch.get(ssa)
        if dim is not None:
            shape[dim.axis] = "N" if dim.per_batch == 1 else f"N*{dim.per_batch}"
        return helper.make_tensor_value_info(self.names[ssa], TensorProto.FLOAT, shape)

    def site(self, layer: ir.Layer) -> Site:
        graph, shapes = self.model.graph, self.model.net.shapes
        blobs = graph.layer_blobs(layer, self.params, self.state)
        keys = [graph.shared.get((layer.name, j), (layer.name, j)) for j in range(len(blobs))]
        return Site(
            g=self.g,
            layer=layer,
            bottoms=[self.names[b] for b in layer.bottoms],
            tops=[self.names[t] for t in layer.tops],
            bottom_shapes=[tuple(shapes[b]) for b in layer.bottoms],
            top_shapes=[tuple(shapes[t]) for t in layer.tops],
            blobs=[np.asarray(b, np.float32) for b in blobs],
            blob_keys=keys,
            bottom_batch=[self.batch.get(b) for b in layer.bottoms],
            top_batch=[self.batch.get(t) for t in layer.tops],
            phase=self.model.net.phase,
            producers=[self.writer.get(b) for b in layer.bottoms],
            consts=self.consts,
            writers=self.writer,
        )

    def convert(self, layer: ir.Layer) -> None:
        converter = lookup(layer)
        site = self.site(layer)
        first = len(self.g.nodes)
        with self.g.in_scope(layer.name):
            values = converter(site)
        if len(values) != len(site.tops):
            raise OnnxExportError(f"layer '{layer.name}': converter gave {len(values)} tops")
        for value, top in zip(values, site.tops):
            self._bind(value, top, first)

    def _bind(self, value: str, top: str, first: int) -> None:
        """Make the converter's ``value`` the ONNX value named ``top``: rename it where this
        layer's own node made it, else an Identity (a layer that passes a bottom on)."""
        if value == top:
            return
        made_here = any(value in node.output for node in self.g.nodes[first:])
        shared = any(value == i.name for i in self.g.initializers)
        if made_here and not shared:
            for node in self.g.nodes[first:]:
                node.output[:] = [top if o == value else o for o in node.output]
                node.input[:] = [top if i == value else i for i in node.input]
            return
        self.g.op("Identity", [value], outputs=[top])


def _read(nodes) -> set[str]:
    """Every value name the nodes read, in their subgraphs (Loop bodies) too."""
    names = set()
    for node in nodes:
        names.update(node.input)
        for attr in node.attribute:
            if attr.HasField("g"):
                names |= _read(attr.g.node)
    return names


def build_graph(model, params, state, *, opset: int, dynamic_batch: bool = False,
                outputs: Sequence[str] | None = None) -> onnx.ModelProto:  # fmt: skip
    """The ONNX model of ``model``'s forward with these weights (see the module docstring)."""
    if model.net.phase != ir.TEST:
        raise OnnxExportError(
            f"net '{model.net.name}' is compiled for phase {model.net.phase}: export a TEST net"
        )
    out_ids = _output_ids(model, outputs)
    walk = _Walk(model, params, state, opset, dynamic_batch)
    for ssa in model.graph.input_versions.values():
        walk.inputs.append(walk.value_info(ssa))
        if walk.g.batch_source is None and walk.batch.get(ssa) is not None:
            walk.g.batch_source = (walk.names[ssa], walk.batch[ssa].axis)
    for layer in needed_layers(model.net, out_ids):
        walk.convert(layer)
    used = _read(walk.g.nodes) | {walk.names[o] for o in out_ids}
    inputs = [v for v in walk.inputs if v.name in used]
    graph = helper.make_graph(
        walk.g.nodes,
        model.net.name or "caffe2jax",
        inputs,
        [walk.value_info(o) for o in out_ids],
        initializer=walk.g.initializers,
    )
    opsets = [helper.make_opsetid("", opset)]
    proto = helper.make_model(graph, opset_imports=opsets, producer_name="caffe2jax")
    proto.ir_version = helper.find_min_ir_version_for(opsets)
    return proto


def blob_names(model, proto: onnx.ModelProto) -> dict[str, str]:
    """SSA id → ONNX value name of every blob of ``model`` that ``proto`` computes (the
    naming of :class:`_Walk`: inputs by their user name, a last version clashing with an
    input's name as ``<blob>@<writer>``)."""
    made = {o for node in proto.graph.node for o in node.output}
    made |= {i.name for i in proto.graph.input}
    inputs = {ssa: user for user, ssa in model.graph.input_versions.items()}
    writer = {top: layer.name for layer in model.net.layers for top in layer.tops}
    out = {}
    for ssa in model.net.shapes:
        name = inputs.get(ssa, ssa)
        if ssa not in inputs and name in inputs.values():
            name = f"{ssa}@{writer[ssa]}"
        if name in made:
            out[ssa] = name
    return out
