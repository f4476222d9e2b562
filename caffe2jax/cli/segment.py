"""`caffe2jax segment --model M --weights W IMAGE...`: a segmentation net's label maps.

Each image is read as Caffe's scripts read it (BGR, resized to the net input's height and
width, ``--mean`` subtracted, times ``--scale``), run through the net, and the argmax over
the channels of the output blob (``--blob``, default the net's last output) is its label
map (:func:`caffe2jax.runtime.outputs.segment.label_map`), at the output's resolution:
printed as the pixels per class, and written as a PNG of class ids with ``--out DIR``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from caffe2jax.cli.args import Subparsers, add_dialect
from caffe2jax.frontend.errors import DataError


def add(sub: Subparsers) -> None:
    p = sub.add_parser("segment", help="label maps (argmax over classes) of a segmentation net")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    p.add_argument("--model", required=True, help="deploy net prototxt")
    p.add_argument("--weights", required=True, help=".caffemodel or .caffemodel.h5")
    p.add_argument("--blob", help="the scores blob (N, classes, H, W) (default: last output)")
    p.add_argument("--input", help="the image input blob (default: the net's first input)")
    p.add_argument("--mean", default="", help="per-channel mean to subtract, e.g. 104,117,123")
    p.add_argument("--scale", type=float, default=1.0, help="multiply after the mean (default 1)")
    p.add_argument("--out", metavar="DIR", help="write DIR/<image name>.png label maps")
    add_dialect(p, "the fork numbering --weights was written with (default: from the prototxt)")
    p.set_defaults(func=run)


def _mean(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise DataError(f"--mean takes numbers separated by commas, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from caffe2jax.pycaffe.net import Net
    from caffe2jax.runtime.outputs import segment

    mean = _mean(args.mean)
    net = Net(args.model, 1, weights=args.weights, dialect=args.dialect)
    try:
        name = args.input or (net.inputs[0] if net.inputs else None)
        if name not in net.blobs:
            raise DataError(f"--input: the net has no input blob {name!r} ({net.inputs})")
        blob = args.blob or net.outputs[-1]
        if blob not in net.blobs:
            raise DataError(f"--blob: the net has no blob {blob!r}")
        out = Path(args.out) if args.out else None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        for image in args.images:
            data = net.blobs[name].data
            data[...] = 0
            data[:1] = segment.prepare_image(image, data.shape, mean, args.scale)
            net.forward()
            labels = segment.label_map(net.blobs[blob].data)[0]
            counts = segment.class_counts(labels)
            where = ""
            if out is not None:
                target = out / f"{Path(image).stem}.png"
                segment.write_label_map(str(target), labels)
                where = f" -> {target}"
            shape = "x".join(str(d) for d in labels.shape)
            print(f"{image}: {shape} label map{where}; pixels per class {counts}")
    finally:
        net.close()
    return 0
