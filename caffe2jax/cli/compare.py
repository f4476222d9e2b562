"""`caffe2jax compare --model M --weights W [--onnx F.onnx] [--opencv]`: one input through
caffe2jax and through the ONNX export (and OpenCV 4's Caffe importer), blob by blob, naming the
first blob that diverges. Exit status 0 when every blob agrees, 2 when one diverges."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from caffe2jax.cli.args import Subparsers, add_dialect, parse_shapes
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.model import Model
from caffe2jax.runtime.data.feeding import source_shapes
from caffe2jax.runtime.formats.weights import load_weights


def add(sub: Subparsers) -> None:
    p = sub.add_parser(
        "compare",
        help="run one input through caffe2jax and the ONNX export, blob by blob",
        description=(
            "Runs one input through caffe2jax and through an ONNX model of the same net "
            "(--onnx, or the export made now), and through OpenCV 4's Caffe importer with "
            "--opencv; prints each blob's max abs / rel difference in the net's order and "
            "names the first blob beyond --tolerance. Exit status 2 when one diverges."
        ),
    )
    p.add_argument("--model", required=True, help="net prototxt")
    p.add_argument("--weights", required=True, help=".caffemodel or .caffemodel.h5")
    p.add_argument("--onnx", help="the ONNX file to check (default: export the net now)")
    p.add_argument("--opencv", action="store_true", help="also compare with OpenCV 4's importer")
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="BLOB=FILE.npy",
        help="an input blob's values (default: uniform [0, 1) from --seed)",
    )
    p.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="BLOB=D0,D1,...",
        help="shape of an input blob (repeatable)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=1e-4,
        help="largest difference relative to each blob's largest magnitude (1e-4)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random input")
    p.add_argument("--all", action="store_true", help="print every blob, not only the first "
                   "divergence and the outputs")  # fmt: skip
    add_dialect(p, "the fork numbering --weights was written with (default: from the prototxt)")
    p.set_defaults(func=run)


def _inputs(items: list[str], model, seed: int) -> dict[str, np.ndarray]:
    given = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or name not in model.inputs:
            raise CaffeError(f"bad --input {item[:80]!r}: use BLOB=FILE.npy with BLOB one of "
                             f"{', '.join(model.inputs)}")  # fmt: skip
        value = np.load(path)
        if tuple(value.shape) != tuple(model.inputs[name]):
            raise CaffeError(f"--input {name}: {path} holds {list(value.shape)}, the net takes "
                             f"{list(model.inputs[name])} (give --input-shape)")  # fmt: skip
        given[name] = value.astype(np.float32)
    rng = np.random.default_rng(seed)
    for name, shape in model.inputs.items():
        if name not in given:
            given[name] = rng.uniform(0, 1, shape).astype(np.float32)
    return given


def _print(report, show_all: bool, outputs) -> None:
    bad = report.first_divergence
    for entry in report.blobs:
        if show_all or entry is bad or entry.blob in outputs:
            print(f"  {entry.line()}")
    print(report.summary())


def run(args: argparse.Namespace) -> int:
    from caffe2jax.runtime.onnx.compare import compare_onnx, compare_opencv

    shapes = parse_shapes(args.input_shape)
    net = load_net(args.model, "TEST")  # the net `export` writes: its TEST phase
    given, _ = source_shapes(net, Path(args.model).parent)  # data layers: from their sources
    model = Model(net, {**given, **shapes} or None)
    params, state = load_weights(args.weights, model, dialect=args.dialect)
    inputs = _inputs(args.input, model, args.seed)
    proto = None
    if args.onnx:
        import onnx

        try:
            proto = onnx.load(args.onnx)
        except (OSError, ValueError, onnx.onnx_cpp2py_export.checker.ValidationError) as err:
            raise CaffeError(f"{args.onnx}: not an ONNX model ({err})") from None
    reports = [compare_onnx(model, params, state, inputs, proto, tolerance=args.tolerance)]
    if args.opencv:
        reports.append(compare_opencv(model, params, state, inputs, args.model,
                                      tolerance=args.tolerance))  # fmt: skip
    outputs = {model.net.blob_names[o] for o in model.outputs}
    for report in reports:
        _print(report, args.all, outputs)
    return 2 if any(r.first_divergence for r in reports) else 0
