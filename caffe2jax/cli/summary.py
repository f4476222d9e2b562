"""`caffe2jax summary NET [--phase]`: the net as Caffe's Net::Init logs it.

Fork nets with layers caffe2jax does not lower yet are listed too: every layer, its bottoms and
tops, the shapes that can be known without the net's data (see :mod:`.summary_shapes`), and
why a layer cannot run yet.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from pathlib import Path

from caffe2jax.cli.args import (
    Subparsers,
    add_define,
    add_dialect,
    int32,
    parse_defines,
    parse_shapes,
)
from caffe2jax.cli.summary_shapes import Shape, partial_shapes
from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import InputShapeError, NetError
from caffe2jax.frontend.forks.dialect import get
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.model import Model
from caffe2jax.lowering.python_layer import registered_python_layers
from caffe2jax.lowering.registry import lookup, type_problem
from caffe2jax.runtime.data.feeding import source_shapes


def add(sub: Subparsers) -> None:
    p = sub.add_parser("summary", help="print a net's layers, blobs and shapes like Caffe's log")
    p.add_argument("model", help="net prototxt")
    p.add_argument("--phase", default="TEST", choices=["TRAIN", "TEST"])
    p.add_argument("--level", type=int32, default=0)
    p.add_argument("--stage", action="append", default=[], help="a NetState stage (repeatable)")
    p.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="BLOB=D0,D1,...",
        help="shape of an input blob whose data source is not at hand (repeatable)",
    )
    add_dialect(p, "how the net's fork layers are read (default: from the prototxt)")
    add_define(p)
    p.set_defaults(func=run)


def _top_line(shape: Shape | None, source: bool) -> tuple[str, int]:
    """A "Top shape:" line and the count it adds to the memory total."""
    if shape is None:
        return "Top shape: " + ("(from the data source)" if source else "(not known)"), 0
    if None in shape:
        dims = " ".join("?" if d is None else str(d) for d in shape)
        return f"Top shape: {dims} (? from the data source)", 0
    count = math.prod(shape)
    return f"Top shape: {' '.join(str(d) for d in shape)} ({count})", count


def summary_lines(
    net: ir.Net, shapes: dict | None = None, notes: dict[str, str] | None = None
) -> list[str]:
    """Caffe's Net::Init log lines (without glog prefixes) for an IR net with shapes (or the
    partial ``shapes`` by SSA id and per-layer ``notes`` of a net that cannot compile)."""
    shapes = net.shapes if shapes is None else shapes
    lines = [f"Initializing net '{net.name}' (phase {net.phase})"]
    memory = 0
    for layer in net.layers:
        lines.append(f"Creating Layer {layer.name}")
        lines += [f"{layer.name} <- {b}" for b in layer.bottom_names]
        lines += [f"{layer.name} -> {t}" for t in layer.top_names]
        lines.append(f"Setting up {layer.name}")
        if notes and layer.name in notes:
            lines.append(f"    ({notes[layer.name]})")
        for top, weight in zip(layer.tops, layer.loss_weights):
            line, count = _top_line(shapes.get(top), not layer.bottoms)
            memory += count
            lines.append(line)
            if weight:
                lines.append(f"    with loss weight {weight:g}")
        lines.append(f"Memory required for data: {memory * 4}")
    for layer in reversed(net.layers):
        backward = net.backward.get(layer.name)
        if backward is not None:
            does = "needs" if backward.layer else "does not need"
            lines.append(f"{layer.name} {does} backward computation.")
    outputs = sorted(net.outputs, key=str.encode)  # Net::Init's std::set<string>: by name
    lines += [f"This network produces output {name}" for name in outputs]
    lines.append("Network initialization done.")
    return lines


def run(args: argparse.Namespace) -> int:
    net = load_net(args.model, args.phase, args.level, args.stage, dialect=args.dialect,
                   defines=parse_defines(args.define), layer_types=type_problem)  # fmt: skip
    if net.dialect != "bvlc":
        print(f"(dialect {net.dialect}: {get(net.dialect).name})")
    shapes, reason = source_shapes(net, Path(args.model).parent)
    shapes.update(parse_shapes(args.input_shape))
    missing = _unsupported(net)
    if missing:  # layers caffe2jax cannot run yet: show what is known
        print(f"(not every shape: {missing})")
    else:
        try:
            net = Model(net, shapes).net
        except InputShapeError as err:  # a data source we cannot open here
            print(f"(not every shape: {reason or err}; give --input-shape BLOB=D0,D1,...)")
        else:
            print("\n".join(summary_lines(net)))
            return 0
    known, notes = partial_shapes(net, shapes)
    print("\n".join(summary_lines(net, known, notes)))
    return 0


def _missing_module(layer: ir.Layer) -> str:
    """For a class-style Python layer whose module is not on sys.path: why it cannot run."""
    p = layer.param.python_param
    if layer.type != "Python" or f"{p.module}.{p.layer}" in registered_python_layers():
        return ""
    try:
        found = importlib.util.find_spec(p.module) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return ""
    return (f"{layer.where}layer '{layer.name}' (type Python): module '{p.module}' is not on "
            "sys.path")  # fmt: skip


def _unsupported(net: ir.Net) -> str:
    """The first layer whose type caffe2jax does not lower, as its compile error says it (or
    a Python layer whose module is not on sys.path)."""
    for layer in net.layers:
        missing = _missing_module(layer)
        if missing:
            return missing
        try:
            lowering = lookup(layer)
            if lowering.source:  # a data layer may refuse a form (SSD's VideoData)
                lowering.fn(layer)
        except NetError as err:
            return f"{layer.where}{err}"
    return ""
