"""`caffe2jax draw NET OUT [--phase] [--rankdir]`: the net as a Graphviz graph, like Caffe's
draw_net.py (layers as boxes, blobs as ovals, in-place layers drawn on their blob).

OUT ending in ``.dot`` gets the Graphviz source; ``.png``/``.svg``/``.pdf`` are rendered with
Graphviz's ``dot`` program, which must be installed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

from caffe2jax import ir
from caffe2jax.errors import CaffeError
from caffe2jax.fileio import atomic_path, atomic_write
from caffe2jax.frontend.pipeline import load_net

LAYER_STYLE = 'shape=record, style=filled, fillcolor="#6495ED"'
BLOB_STYLE = 'shape=octagon, style=filled, fillcolor="#E0E0E0"'


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("draw", help="draw a net as a Graphviz graph (.dot, .png, .svg, .pdf)")
    p.add_argument("model", help="net prototxt")
    p.add_argument("out", help="output file")
    p.add_argument("--phase", default="TRAIN", choices=["TRAIN", "TEST"])
    p.add_argument("--rankdir", default="LR", choices=["LR", "TB", "BT", "RL"])
    p.set_defaults(func=run)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(net: ir.Net, rankdir: str = "LR") -> str:
    """Graphviz source: a box per layer (name and type), an octagon per user blob name."""
    lines = [f"digraph {_quote(net.name or 'net')} {{", f"  rankdir={rankdir};"]
    blobs = {user for layer in net.layers for user in (*layer.bottom_names, *layer.top_names)}
    for blob in sorted(blobs):
        lines.append(f"  {_quote('blob:' + blob)} [label={_quote(blob)}, {BLOB_STYLE}];")
    for layer in net.layers:
        node = _quote("layer:" + layer.name)
        label = _quote(f"{{{layer.param.name}|{layer.type}}}")
        lines.append(f"  {node} [label={label}, {LAYER_STYLE}];")
        for bottom in layer.bottom_names:
            lines.append(f"  {_quote('blob:' + bottom)} -> {node};")
        for top in layer.top_names:
            lines.append(f"  {node} -> {_quote('blob:' + top)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    dot = to_dot(load_net(args.model, args.phase), args.rankdir)
    out = Path(args.out)
    kind = out.suffix.lstrip(".").lower()
    if kind in ("dot", "gv"):
        atomic_write(out, dot)
    elif kind in ("png", "svg", "pdf"):
        program = shutil.which("dot")
        if program is None:
            raise CaffeError(f"rendering .{kind} needs Graphviz's 'dot' program; write a .dot file")
        with atomic_path(out) as tmp:
            subprocess.run([program, f"-T{kind}", "-o", str(tmp)], input=dot.encode(), check=True)
    else:
        raise CaffeError(f"{out}: unknown output type; use .dot, .png, .svg or .pdf")
    print(f"Drawing net to {out}")
    return 0
