"""`caffe2jax convert-weights IN OUT [--model NET]`: binary caffemodel ↔ Caffe HDF5 weights."""

from __future__ import annotations

import argparse
from pathlib import Path

from caffe2jax.cli.args import Subparsers, add_dialect
from caffe2jax.frontend.errors import WeightsError
from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.runtime.formats.convert import convert_weights
from caffe2jax.runtime.formats.weights import format_for


def add(sub: Subparsers) -> None:
    p = sub.add_parser(
        "convert-weights",
        help="convert weights between binary .caffemodel and HDF5 .caffemodel.h5",
        description=(
            "OUT's format follows its name (.h5/.hdf5: Caffe's HDF5, else binary NetParameter); "
            "IN's is read from its bytes. With --model the output is what Caffe writes for "
            "that net; without, the file's layers, names and blob shapes are copied as stored."
        ),
    )
    p.add_argument("input", help="weights to read (.caffemodel or .caffemodel.h5)")
    p.add_argument("output", help="weights to write")
    p.add_argument("--model", help="net prototxt the weights belong to")
    p.add_argument("--phase", default="TEST", choices=["TRAIN", "TEST"], help="with --model")
    p.add_argument("--force", action="store_true", help="overwrite OUTPUT if it exists")
    add_dialect(p, "the fork numbering INPUT was written with (default: from --model, else "
                "from INPUT's own bytes)")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    output = Path(args.output)
    if output.exists() and not args.force:
        raise WeightsError(f"{output} already exists; pass --force to overwrite it")
    model = compile_net(args.model, phase=args.phase) if args.model else None
    convert_weights(args.input, output, model, dialect=args.dialect)
    fmt = format_for(output, None)
    print(f"Wrote {fmt} weights to {output}")
    return 0
