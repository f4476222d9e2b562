"""`caffe2jax export --model M --weights W --out F`: the TEST forward as serialized StableHLO."""

from __future__ import annotations

import argparse

from caffe2jax.cli.args import Subparsers, add_dialect, parse_shapes
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.runtime.formats.atomic import refuse_overwrite
from caffe2jax.runtime.formats.export import describe, export_forward, save_exported
from caffe2jax.runtime.formats.weights import load_weights


def add(sub: Subparsers) -> None:
    p = sub.add_parser(
        "export",
        help="export a net's forward pass with its weights as a jax.export module",
        description=(
            "Writes jax.export's serialized StableHLO of inputs -> outputs (the TEST phase by "
            "default). Load it with jax.export.deserialize(bytearray(data)).call({...})."
        ),
    )
    p.add_argument("--model", required=True, help="net prototxt (a deploy net)")
    p.add_argument("--weights", required=True, help=".caffemodel or .caffemodel.h5")
    p.add_argument("--out", required=True, help="file to write")
    p.add_argument("--phase", default="TEST", choices=["TRAIN", "TEST"])
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="BLOB=D0,D1,...",
        help="shape of an input blob, e.g. data=1,3,224,224 (repeatable)",
    )
    p.add_argument(
        "--platform",
        action="append",
        default=[],
        help="lower for this platform (cpu, cuda, rocm, tpu; repeatable; default: this one)",
    )
    add_dialect(p, "the fork numbering --weights was written with (default: from the prototxt)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    refuse_overwrite(args.out, args.force)
    try:
        shapes = parse_shapes(args.input_shape)
    except ValueError:
        raise CaffeError(f"bad --input-shape {args.input_shape}: use BLOB=D0,D1,...") from None
    model = compile_net(args.model, phase=args.phase, input_shapes=shapes or None)
    params, state = load_weights(args.weights, model, dialect=args.dialect)
    exported = export_forward(model, params, state, platforms=args.platform or None)
    path = save_exported(args.out, exported, overwrite=args.force)
    info = describe(exported)
    print(
        f"Wrote {path}: inputs {info['inputs']} -> outputs {info['outputs']} "
        f"for {', '.join(info['platforms'])}"
    )
    return 0
