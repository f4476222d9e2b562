"""``caffe2jax convert_imageset ROOT LISTFILE DB``: Caffe's convert_imageset tool."""

from __future__ import annotations

import argparse
import logging

from caffe2jax.cli.args import Subparsers, int32
from caffe2jax.runtime.data.records.db import BACKENDS
from caffe2jax.runtime.tools.imageset import convert_imageset

TRUE, FALSE = ("1", "true", "yes", "y"), ("0", "false", "no", "n")


def add_flag(parser: argparse.ArgumentParser, name: str, help_text: str) -> None:
    """A boolean option as gflags reads it: ``--name`` alone (the next word stays a
    positional argument: ``--encoded ROOT LIST DB``), ``--name=true|false`` (also 1/0,
    yes/no), ``--noname``, each also with one dash as Caffe's tools take them. The ``=value``
    forms are options of their own (argparse matches a whole option string before it splits
    at ``=``), so no form ever takes the word after it."""
    parser.add_argument(f"--{name}", f"-{name}", action="store_true", default=False,
                        help=f"{help_text} (also --{name}=true|false, --no{name})")  # fmt: skip
    for value in TRUE + FALSE:
        spellings = {value, value.capitalize(), value.upper()}
        options = [f"{dash}{name}={v}" for v in sorted(spellings) for dash in ("--", "-")]
        parser.add_argument(*options, dest=name, action="store_const", const=value in TRUE,
                            help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument(f"--no{name}", f"-no{name}", dest=name, action="store_false",
                        help=argparse.SUPPRESS)  # fmt: skip


def add_storage_flags(parser: argparse.ArgumentParser) -> None:
    """The flags convert_imageset and the SSD fork's convert_annoset share: how images are
    read and stored, the list order and the database backend."""
    add_flag(parser, "gray", "read images as 1-channel gray")
    add_flag(parser, "shuffle", "shuffle the list first")
    add_flag(parser, "encoded", "store the images compressed")
    add_flag(parser, "check_size", "require every image to have the first one's size")
    parser.add_argument("--encode_type", "-encode_type", default="", metavar="EXT",
                        help="png, jpg, ... (default: from each file's extension)")  # fmt: skip
    parser.add_argument("--backend", "-backend", choices=BACKENDS, default="lmdb")
    parser.add_argument("--seed", type=int32, default=None, help="seed of --shuffle")


def add(subparsers: Subparsers) -> None:
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
    add_storage_flags(parser)
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
