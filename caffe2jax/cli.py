"""The `caffe2jax` command line, shaped like Caffe's `caffe` tool.

Each subcommand lives in ``caffe2jax/commands/<name>.py`` with ``add(subparsers)``. User
errors (:class:`caffe2jax.frontend.errors.CaffeError`, missing files) print one line and exit 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from caffe2jax import __version__
from caffe2jax.commands import COMMANDS
from caffe2jax.frontend.errors import CaffeError, one_line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="caffe2jax",
        description="Compile and run Caffe nets and solvers with JAX/XLA.",
    )
    parser.add_argument("--version", action="version", version=f"caffe2jax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"caffe2jax.commands.{name}").add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except CaffeError as err:
        print(f"caffe2jax {args.command}: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # a file the user named cannot be read or written
        what = one_line(f"{err.strerror or err}: {err.filename or ''}")
        print(f"caffe2jax {args.command}: error: {what}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"caffe2jax {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
