"""`caffe2jax summary NET [--phase]`: the net as Caffe's Net::Init logs it."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from caffe2jax.cli.args import int32
from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import CaffeError, DataError, InputShapeError
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.model import Model
from caffe2jax.runtime.data.feeding import open_source


def add(sub: argparse._SubParsersAction) -> None:
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
    p.set_defaults(func=run)


def parse_shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    """``BLOB=D0,D1,...`` options as shapes (non-negative dims); a CaffeError otherwise."""
    shapes = {}
    for item in items:
        name, _, dims = item.partition("=")
        try:
            shape = tuple(int(d) for d in dims.split(",") if d)
        except ValueError:
            shape = (-1,)
        if not name or any(d < 0 for d in shape):
            raise CaffeError(f"bad --input-shape {item[:80]!r}: use BLOB=D0,D1,... (dims >= 0)")
        shapes[name] = shape
    return shapes


def summary_lines(net: ir.Net) -> list[str]:
    """Caffe's Net::Init log lines (without glog prefixes) for an IR net with shapes."""
    lines = [f"Initializing net '{net.name}' (phase {net.phase})"]
    memory = 0
    for layer in net.layers:
        lines.append(f"Creating Layer {layer.name}")
        lines += [f"{layer.name} <- {b}" for b in layer.bottom_names]
        lines += [f"{layer.name} -> {t}" for t in layer.top_names]
        lines.append(f"Setting up {layer.name}")
        for top, weight in zip(layer.tops, layer.loss_weights):
            shape = net.shapes.get(top)
            if shape is None:
                lines.append("Top shape: (from the data source)")
                continue
            count = math.prod(shape)
            memory += count
            dims = " ".join(str(d) for d in shape)
            lines.append(f"Top shape: {dims} ({count})")
            if weight:
                lines.append(f"    with loss weight {weight:g}")
        lines.append(f"Memory required for data: {memory * 4}")
    for layer in reversed(net.layers):
        backward = net.backward.get(layer.name)
        if backward is not None:
            does = "needs" if backward.layer else "does not need"
            lines.append(f"{layer.name} {does} backward computation.")
    lines += [f"This network produces output {name}" for name in net.outputs]
    lines.append("Network initialization done.")
    return lines


def source_shapes(net: ir.Net, base_dir: Path) -> tuple[dict, str]:
    """Shapes the net's data layers declare by reading their sources, as Caffe does at setup;
    ``({}, reason)`` when a source cannot be opened here. No prefetching starts (a huge
    declared batch is reported by the size check, never read)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in net.layers:
        try:
            source = open_source(layer, net.phase, base_dir)
        except DataError as err:
            return {}, str(err)
        if source is None:
            continue
        try:
            shapes.update(zip(layer.top_names, source.top_shapes()))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
    return shapes, ""


def run(args: argparse.Namespace) -> int:
    net = load_net(args.model, args.phase, args.level, args.stage)
    shapes, reason = source_shapes(net, Path(args.model).parent)
    shapes.update(parse_shapes(args.input_shape))
    try:
        net = Model(net, shapes).net
    except InputShapeError as err:  # a data source we cannot open here: show the structure
        print(f"(no shapes: {reason or err}; give --input-shape BLOB=D0,D1,...)")
    print("\n".join(summary_lines(net)))
    return 0
