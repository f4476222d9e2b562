"""``caffe2jax convert_annoset ROOT LISTFILE DB``: SSD's convert_annoset tool (weiliu89/caffe,
tools/convert_annoset.cpp), writing AnnotatedDatum records."""

from __future__ import annotations

import argparse
import logging

from caffe2jax.cli.args import Subparsers, int32
from caffe2jax.cli.convert_imageset import add_flag, add_storage_flags
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.tools.annoset import LABEL_TYPES, convert_annoset


def add(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "convert_annoset",
        help="convert images and box annotations to an LMDB/LevelDB of AnnotatedDatum records",
        description="Convert the 'image_path annotation_path' pairs of LISTFILE (both read from "
        "ROOT + path, so give ROOT a trailing /) into a new database DB of AnnotatedDatum "
        "records, as SSD's convert_annoset does: VOC-style XML (names mapped to labels by "
        "--label_map_file) or txt ('label xmin ymin xmax ymax' per line, pixels). DB must not "
        "exist.",
    )
    parser.add_argument("root", metavar="ROOT")
    parser.add_argument("listfile", metavar="LISTFILE")
    parser.add_argument("db", metavar="DB")
    parser.add_argument("--anno_type", "-anno_type", default="detection",
                        help="detection (the only type supported)")  # fmt: skip
    parser.add_argument("--label_type", "-label_type", default="xml", choices=LABEL_TYPES)
    parser.add_argument("--label_map_file", "-label_map_file", default="", metavar="FILE",
                        help="LabelMap prototxt (needed for xml)")  # fmt: skip
    add_flag(parser, "check_label", "refuse a label map that names a class twice")
    sizes = (("resize_height", "resize images to this height (with resize_width)"),
             ("resize_width", "resize images to this width (with resize_height)"),
             ("min_dim", "scale images up so their short side is at least N"),
             ("max_dim", "scale images down so their long side is at most N"))  # fmt: skip
    for name, what in sizes:
        parser.add_argument(f"--{name}", f"-{name}", type=int32, default=0, metavar="N",
                            help=what)  # fmt: skip
    add_storage_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.anno_type != "detection":
        raise DataError(f"--anno_type={args.anno_type} is not supported (detection; for "
                        "classification lists use convert_imageset)")  # fmt: skip
    count = convert_annoset(
        args.root,
        args.listfile,
        args.db,
        label_type=args.label_type,
        label_map_file=args.label_map_file,
        check_label=args.check_label,
        resize_height=max(0, args.resize_height),
        resize_width=max(0, args.resize_width),
        min_dim=max(0, args.min_dim),
        max_dim=max(0, args.max_dim),
        gray=args.gray,
        shuffle=args.shuffle,
        encoded=args.encoded or bool(args.encode_type),
        encode_type=args.encode_type,
        backend=args.backend,
        check_size=args.check_size,
        seed=args.seed,
    )
    print(f"Wrote {count} records to {args.db}")
    return 0
