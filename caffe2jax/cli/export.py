"""`caffe2jax export --model M --weights W --out F`: the TEST forward as ONNX (``F.onnx``) or as
serialized StableHLO (any other name), the format from the extension or ``--format``."""

from __future__ import annotations

import argparse
from pathlib import Path

from caffe2jax.cli.args import Subparsers, add_dialect, parse_shapes
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.model import Model
from caffe2jax.runtime.data.feeding import source_shapes
from caffe2jax.runtime.formats.atomic import refuse_overwrite
from caffe2jax.runtime.formats.export import describe, export_forward, save_exported
from caffe2jax.runtime.formats.weights import load_weights

#: ``--opset``'s default (caffe2jax.runtime.onnx.DEFAULT_OPSET, kept here so that the CLI
#: starts without importing onnx)
ONNX_OPSET = 17


def add(sub: Subparsers) -> None:
    p = sub.add_parser(
        "export",
        help="export a net's forward pass with its weights as ONNX or a jax.export module",
        description=(
            "Writes the net's forward (the TEST phase by default) with its weights: as ONNX "
            "when --out ends in .onnx (or --format onnx; each Caffe layer mapped to ONNX "
            "operators, blobs keeping their names; docs/onnx.md), else as jax.export's "
            "serialized StableHLO (load it with jax.export.deserialize(bytearray(data)))."
        ),
    )
    p.add_argument("--model", required=True, help="net prototxt (a deploy net)")
    p.add_argument("--weights", required=True, help=".caffemodel or .caffemodel.h5")
    p.add_argument("--out", required=True, help="file to write")
    p.add_argument(
        "--format",
        choices=["onnx", "stablehlo"],
        help="what to write (default: onnx for a .onnx file, else stablehlo)",
    )
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
        "--opset", type=int, default=ONNX_OPSET, help=f"ONNX opset to write (default {ONNX_OPSET})"
    )
    p.add_argument(
        "--dynamic-batch",
        action="store_true",
        help="ONNX: make the first axis of every input a symbolic batch size N",
    )
    p.add_argument(
        "--output",
        action="append",
        default=[],
        metavar="BLOB",
        help="ONNX: export these blobs (repeatable; default: the net's outputs)",
    )
    p.add_argument(
        "--platform",
        action="append",
        default=[],
        help="StableHLO: lower for this platform (cpu, cuda, rocm, tpu; repeatable)",
    )
    add_dialect(p, "the fork numbering --weights was written with (default: from the prototxt)")
    p.set_defaults(func=run)


def output_format(args: argparse.Namespace) -> str:
    """``--format``, else from the extension of ``--out``."""
    if args.format:
        return args.format
    return "onnx" if Path(args.out).suffix.lower() == ".onnx" else "stablehlo"


def run(args: argparse.Namespace) -> int:
    refuse_overwrite(args.out, args.force)
    shapes = parse_shapes(args.input_shape)
    fmt = output_format(args)
    if fmt == "onnx" and args.platform:
        raise CaffeError("--platform is for --format stablehlo; an ONNX file runs anywhere")
    if fmt == "stablehlo" and (args.dynamic_batch or args.output):
        raise CaffeError("--dynamic-batch and --output are for --format onnx")
    net = load_net(args.model, args.phase)
    given, _ = source_shapes(net, Path(args.model).parent)  # data layers: from their sources
    model = Model(net, {**given, **shapes} or None)
    params, state = load_weights(args.weights, model, dialect=args.dialect)
    if fmt == "onnx":
        return _onnx(args, model, params, state)
    exported = export_forward(model, params, state, platforms=args.platform or None)
    path = save_exported(args.out, exported, overwrite=args.force)
    info = describe(exported)
    print(
        f"Wrote {path}: inputs {info['inputs']} -> outputs {info['outputs']} "
        f"for {', '.join(info['platforms'])}"
    )
    return 0


def _onnx(args: argparse.Namespace, model, params, state) -> int:
    from caffe2jax.runtime.onnx import save_onnx, to_onnx

    proto = to_onnx(model, params, state, opset=args.opset, dynamic_batch=args.dynamic_batch,
                    outputs=args.output or None)  # fmt: skip
    path = save_onnx(args.out, proto, overwrite=args.force)
    dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
    inputs = {v.name: dims(v) for v in proto.graph.input}
    outputs = {v.name: dims(v) for v in proto.graph.output}
    print(f"Wrote {path}: ONNX opset {args.opset}, inputs {inputs} -> outputs {outputs}")
    return 0
