"""Every flag and argument type the verbs share: Caffe's gflags int32, ``--dialect`` (with
``--layers``: a fork brought by its user, docs/forks.md), ``--define`` and ``--input-shape``,
and the type of the subparsers each verb's ``add`` takes."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from caffe2jax.frontend.errors import CaffeError

# argparse keeps the class of ``add_subparsers()``'s result private: each verb's
# ``add(sub: Subparsers)`` receives that object and calls ``sub.add_parser``.
Subparsers = Any

INT32 = (-(2**31), 2**31 - 1)


def int32(text: str) -> int:
    """An integer flag as Caffe's gflags ``int32`` reads it: out of range is an error (gflags
    prints "failed validation"), not a number wrapped or grown past what Caffe's ints hold."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer: {text[:40]!r}") from None
    if not INT32[0] <= value <= INT32[1]:
        raise argparse.ArgumentTypeError(f"{text[:40]} is out of range ({INT32[0]}..{INT32[1]})")
    return value


def add_dialect(p: argparse.ArgumentParser, what: str) -> None:
    """The ``--dialect`` option: which fork of Caffe's numbering a file was written with (or a
    fork's own caffe.proto), and ``--layers``: the modules registering a fork's layer types."""
    p.add_argument(
        "--dialect",
        metavar="D",
        help=f"{what}: bvlc, ssd, frcnn, rfcn, segnet, enet, pspnet, deeplab-v1, deeplab-v2, "
        "c3d-v1.0, c3d-v1.1, crnn, eric612, darknet2caffe, ceil_mode, ... (join with +), or "
        "the path of a fork's caffe.proto (its fields are read in every net)",
    )
    p.add_argument(
        "--layers",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (a name, or a .py file) first: it registers a fork's layer types "
        "with caffe2jax.register_layer (repeatable)",
    )


def import_layers(name: str) -> None:
    """Import a ``--layers`` module (a dotted name found from the working folder too, or a .py
    file); anything it raises is one CaffeError line."""
    try:
        if name.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(name).stem, name)
            if spec is None or not Path(name).is_file():
                raise ModuleNotFoundError(f"no file {name}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.append(os.getcwd())
            importlib.import_module(name)
    except CaffeError as err:
        raise CaffeError(f"--layers {name}: {err}") from None
    except Exception as err:  # the user's module: whatever it raises, said in one line
        raise CaffeError(f"--layers {name}: {type(err).__name__}: {err}") from None


def prepare_fork(args: argparse.Namespace) -> None:
    """Before a verb runs: ``--dialect x.proto`` read for every net of the process (a solver's
    nets too), then each ``--layers`` module imported."""
    from caffe2jax.frontend.forks import user_proto

    spec = getattr(args, "dialect", None)
    protos = [part for part in (spec or "").split("+") if user_proto.is_proto(part.strip())]
    user_proto.activate(protos[0].strip() if protos else None)
    for name in getattr(args, "layers", None) or ():
        import_layers(name)


def add_define(p: argparse.ArgumentParser) -> None:
    """``--define NAME=VALUE``: fill a template prototxt's ``${NAME}``."""
    p.add_argument(
        "--define",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="fill ${NAME} in a template prototxt, as its scripts do (repeatable)",
    )


def parse_defines(items: list[str]) -> dict[str, str]:
    """``NAME=VALUE`` options as a dict; a CaffeError for a malformed one."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise CaffeError(f"bad --define {item[:80]!r}: use NAME=VALUE")
        out[name] = value
    return out


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
