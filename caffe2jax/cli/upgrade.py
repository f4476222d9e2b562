"""`caffe2jax upgrade IN OUT`: rewrite a V0/V1 net or an old solver in the current format."""

from __future__ import annotations

import argparse

from caffe2jax.cli.args import Subparsers, add_define, add_dialect, parse_defines
from caffe2jax.frontend.errors import PrototxtError
from caffe2jax.frontend.parse import read_net, read_solver
from caffe2jax.frontend.upgrade import upgraded_text
from caffe2jax.runtime.formats.atomic import atomic_write


def add(sub: Subparsers) -> None:
    p = sub.add_parser(
        "upgrade",
        help="upgrade a net or solver prototxt to the current format",
        description="Like Caffe's upgrade_net_proto_text / upgrade_solver_proto_text.",
    )
    p.add_argument("input", help="net or solver prototxt (text or binary net)")
    p.add_argument("output", help="where to write the upgraded prototxt")
    p.add_argument("--solver", action="store_true", help="treat INPUT as a solver")
    p.add_argument("--force", action="store_true", help="overwrite OUTPUT if it exists")
    add_dialect(p, "the fork numbering of a binary INPUT (default: from its own bytes)")
    add_define(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.solver:
        message = read_solver(args.input)
    else:
        try:
            message = read_net(args.input, dialect=args.dialect,
                               defines=parse_defines(args.define))  # fmt: skip
        except PrototxtError as net_error:
            try:
                message = read_solver(args.input)
            except PrototxtError:
                raise net_error from None
    text = upgraded_text(message, args.input)
    atomic_write(args.output, text, overwrite=args.force)
    print(f"Wrote upgraded {type(message).__name__} to {args.output}")
    return 0
