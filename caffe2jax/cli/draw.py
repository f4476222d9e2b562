"""`caffe2jax draw NET OUT [--rankdir] [--phase] [--display_lrm] [--force]`: Caffe's
draw_net.py. The extension of OUT picks the format: ``.dot``/``.gv`` write the Graphviz source
(pydot only), ``.png``/``.svg``/``.pdf`` render it with Graphviz's ``dot`` program. An
existing OUT is kept unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from caffe2jax.cli.args import Subparsers
from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.frontend.pipeline import load_param
from caffe2jax.pycaffe import draw

FORMATS = ("dot", "gv", "png", "svg", "pdf")


def add(sub: Subparsers) -> None:
    p = sub.add_parser("draw", help="draw a net as a graph (.png, .svg, .pdf, or .dot source)")
    p.add_argument("model", help="net prototxt")
    p.add_argument("out", help="output file; its extension picks the format")
    p.add_argument("--rankdir", default="LR", choices=["LR", "TB", "BT", "RL"],
                   help="direction of the graph layout (default LR)")  # fmt: skip
    p.add_argument("--phase", default="ALL", choices=["TRAIN", "TEST", "ALL"],
                   help="draw the layers of one phase (default ALL layers)")  # fmt: skip
    p.add_argument("--display_lrm", action="store_true",
                   help="show the learning-rate multipliers of each layer")  # fmt: skip
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    kind = out.suffix.lstrip(".").lower()
    if kind not in FORMATS:
        raise CaffeError(f"{out}: unknown output type; use .png, .svg, .pdf or .dot")
    if out.exists() and not args.force:
        raise CaffeError(f"{out} already exists; not overwriting it (use --force)")
    net = load_param(args.model)
    phase = None if args.phase == "ALL" else getattr(caffe_pb2, args.phase)
    print(f"Drawing net to {out}")
    draw.draw_net_to_file(net, out, args.rankdir, phase, args.display_lrm, overwrite=args.force)
    return 0
