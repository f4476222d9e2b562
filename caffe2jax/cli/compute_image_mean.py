"""``caffe2jax compute_image_mean DB OUT.binaryproto``: Caffe's compute_image_mean tool."""

from __future__ import annotations

import argparse
import logging

from caffe2jax.cli.args import Subparsers
from caffe2jax.runtime.data.records.db import BACKENDS
from caffe2jax.runtime.formats.atomic import refuse_overwrite
from caffe2jax.runtime.tools.imageset import compute_image_mean


def add(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "compute_image_mean",
        help="compute the mean image of a database",
        description="Average every record of DB and write the mean image to OUT as a "
        "BlobProto (.binaryproto), as Caffe's compute_image_mean does.",
    )
    parser.add_argument("db", metavar="DB")
    parser.add_argument("out", metavar="OUT.binaryproto", nargs="?", default=None)
    parser.add_argument("--backend", "-backend", choices=BACKENDS, default="lmdb")
    parser.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.out is not None:
        refuse_overwrite(args.out, args.force)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    mean = compute_image_mean(args.db, args.out, backend=args.backend)
    if args.out is not None:
        print(f"Wrote the {mean.shape} mean of {args.db} to {args.out}")
    return 0
