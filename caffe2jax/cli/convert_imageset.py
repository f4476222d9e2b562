"""``caffe2jax convert_imageset ROOT LISTFILE DB``: Caffe's convert_imageset tool."""

from __future__ import annotations

import argparse
import logging

from caffe2jax.cli.args import int32
from caffe2jax.runtime.data.db import BACKENDS
from caffe2jax.runtime.data.tools import convert_imageset

TRUE, FALSE = ("1", "true", "yes", "y"), ("0", "false", "no", "n")


def parse_bool(text: str) -> bool:
    """A gflags-style boolean value (``--gray=true``)."""
    if text.lower() in TRUE:
        return True
    if text.lower() in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def add_flag(parser: argparse.ArgumentParser, name: str, help_text: str) -> None:
    """A boolean option given as ``--name``, ``--name=true|false`` or Caffe's ``-name``."""
    parser.add_argument(
        f"--{name}", f"-{name}", nargs="?", const=True, default=False, type=parse_bool,
        help=help_text,
    )  # fmt: skip


def add(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert_imageset",
        help="convert a list of images to an LMDB/LevelDB of Datum records",
        description="Convert the images listed in LISTFILE ('path label' lines; each image is "
        "read from ROOT + path, so give ROOT a trailing /) into a new database DB of Datum "
        "records, as Caffe's convert_imageset does. DB must not exist.",
    )
    parser.add_argument("root", metavar="ROOT")
    parser.add_argument("listfile", metavar="LISTFILE")
    parser.add_argument("db", metavar="DB")
    for name in ("resize_height", "resize_width"):
        parser.add_argument(f"--{name}", f"-{name}", type=int32, default=0, metavar="N",
                            help="resize images to this size (both must be set)")  # fmt: skip
    add_flag(parser, "gray", "read images as 1-channel gray")
    add_flag(parser, "shuffle", "shuffle the list first")
    add_flag(parser, "encoded", "store the images compressed")
    add_flag(parser, "check_size", "require every image to have the first one's size")
    parser.add_argument("--encode_type", "-encode_type", default="", metavar="EXT",
                        help="png, jpg, ... (default: from each file's extension)")  # fmt: skip
    parser.add_argument("--backend", "-backend", choices=BACKENDS, default="lmdb")
    parser.add_argument("--seed", type=int, default=None, help="seed of --shuffle")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    count = convert_imageset(
        args.root,
        args.listfile,
        args.db,
        resize_height=args.resize_height,
        resize_width=args.resize_width,
        gray=args.gray,
        shuffle=args.shuffle,
        encoded=args.encoded,
        encode_type=args.encode_type,
        backend=args.backend,
        check_size=args.check_size,
        seed=args.seed,
    )
    print(f"Wrote {count} records to {args.db}")
    return 0
