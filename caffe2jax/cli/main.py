"""The `caffe2jax` command line, shaped like Caffe's `caffe` tool.

Each subcommand lives in ``caffe2jax/cli/<name>.py`` with ``add(subparsers)``. User
errors (:class:`caffe2jax.frontend.errors.CaffeError`, missing files) print one line and exit 1.

Before any command runs, :func:`configure_jax` applies ``--no-compile-cache`` to JAX's
persistent compilation cache (:mod:`caffe2jax.runtime.host.compile_cache`, on by default for every
entry point) and sets the XLA:CPU options the benchmarks show pay (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from caffe2jax import __version__
from caffe2jax.cli import COMMANDS
from caffe2jax.cli.args import prepare_fork
from caffe2jax.frontend.errors import CaffeError, one_line
from caffe2jax.runtime.host import compile_cache as compile_cache_module
from caffe2jax.runtime.host.compile_cache import CACHE_DIR_ENV, NO_CACHE_ENV, cache_dir  # noqa: F401

# XLA:CPU options measured to pay (docs/performance.md); appended after the user's own
# XLA_FLAGS only where the user did not set the same flag.
CPU_FLAGS: dict[str, str] = {}


def configure_jax(compile_cache: bool = True) -> Path | None:
    """Set XLA:CPU flags (before JAX starts its backend) and the persistent compilation cache
    (:mod:`caffe2jax.runtime.host.compile_cache`: on unless ``compile_cache`` is false or
    ``$CAFFE2JAX_NO_COMPILE_CACHE`` is set). Returns the cache folder in use, or None."""
    flags = os.environ.get("XLA_FLAGS", "")
    extra = [f"--{k}={v}" for k, v in CPU_FLAGS.items() if f"--{k}" not in flags]
    if extra:
        os.environ["XLA_FLAGS"] = " ".join([flags, *extra]).strip()
    return compile_cache_module.enable(compile_cache)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="caffe2jax",
        description="Compile and run Caffe nets and solvers with JAX/XLA.",
    )
    parser.add_argument("--version", action="version", version=f"caffe2jax {__version__}")
    parser.add_argument(
        "--no-compile-cache",
        action="store_true",
        help=f"do not read or write the persistent compilation cache (also: {NO_CACHE_ENV}=1; "
        f"the cache lives in ${CACHE_DIR_ENV} or ~/.cache/caffe2jax/xla)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"caffe2jax.cli.{name}").add(sub)
    return parser


def caffe_for_python_layers() -> None:
    """Python layers' modules ``import caffe`` as they do under Caffe's own tools: where no
    other ``caffe`` is importable, caffe2jax is it (:func:`caffe2jax.install_as_caffe`)."""
    import importlib.util

    import caffe2jax

    if "caffe" not in sys.modules and importlib.util.find_spec("caffe") is None:
        caffe2jax.install_as_caffe()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    configure_jax(compile_cache=not args.no_compile_cache)
    caffe_for_python_layers()
    try:
        prepare_fork(args)
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
    except Exception as err:  # memory exhausted past the checks: one line, the limit named
        if not _out_of_memory(err):
            raise
        from caffe2jax.runtime.host.memory import memory_budget

        what = one_line(str(err).splitlines()[0] if str(err) else type(err).__name__, 100)
        print(f"caffe2jax {args.command}: error: out of memory ({what}); "
              f"{memory_budget().describe()}; lower batch_size", file=sys.stderr)  # fmt: skip
        return 1


def _out_of_memory(err: BaseException) -> bool:
    """A MemoryError, or XLA's RESOURCE_EXHAUSTED (an allocation the device refused)."""
    return isinstance(err, MemoryError) or "RESOURCE_EXHAUSTED" in str(err)[:200]


if __name__ == "__main__":
    sys.exit(main())
