"""`caffe2jax detect NET WEIGHTS IMAGE...`: one line per detection.

Each line: ``IMAGE LABEL NAME SCORE XMIN YMIN XMAX YMAX`` (box corners in the image's pixels;
NAME is the label's line of ``--labels`` or the label number). The net is an SSD / YOLO
deploy net (DetectionOutput, YoloDetectionOutput, Yolov3DetectionOutput) or a Faster R-CNN /
R-FCN test net (``im_info`` input; decoded as py-faster-rcnn's test.py does); see
:mod:`caffe2jax.runtime.outputs.detections`. The image is resized to the net's input and fed as
``(pixel − mean) · scale`` in BGR order (``--rgb`` swaps to RGB), as OpenCV's
``blobFromImage(image, scale, size, mean, swapRB)`` would.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from caffe2jax.cli.args import Subparsers, add_dialect
from caffe2jax.frontend.errors import DataError


def add(sub: Subparsers) -> None:
    p = sub.add_parser("detect", help="print the detections of a detector net on images")
    p.add_argument("model", help="deploy net prototxt (SSD, YOLO, Faster R-CNN, R-FCN)")
    p.add_argument("weights", help=".caffemodel or .caffemodel.h5")
    p.add_argument("images", nargs="+", help="image files")
    p.add_argument("--mean", default="0,0,0", metavar="B,G,R",
                   help="per-channel mean subtracted (one value or three; default 0)")  # fmt: skip
    p.add_argument("--scale", type=float, default=1.0, help="multiplier after the mean")
    p.add_argument("--rgb", action="store_true", help="feed channels as RGB (default BGR)")
    p.add_argument("--threshold", type=float, default=0.0, help="lowest score printed")
    p.add_argument("--labels", metavar="FILE", help="class names, one per line, label 0 first")
    add_dialect(p, "the fork numbering WEIGHTS was written with (default: from the prototxt)")
    p.set_defaults(func=run)


def _mean(text: str) -> tuple[float, float, float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise DataError(f"--mean must be numbers separated by commas, got {text!r}") from None
    if len(values) not in (1, 3):
        raise DataError(f"--mean takes one value or three (B,G,R), got {len(values)}")
    return tuple(values * 3 if len(values) == 1 else values)


def _names(path: str) -> list[str]:
    """The ``--labels`` file's lines (UTF-8 text)."""
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: --labels must be UTF-8 text ({err.reason} at byte "
                        f"{err.start})") from None  # fmt: skip
    except OSError as err:
        raise DataError(f"{path}: cannot read --labels ({err.strerror})") from None


def _read(path: str) -> np.ndarray:
    import cv2

    from caffe2jax.runtime.data.transform.guards import check_image_size
    from caffe2jax.runtime.data.transform.image_header import header_size

    if not Path(path).is_file():
        raise DataError(f"{path}: could not open or find file")
    with open(path, "rb") as f:
        size = header_size(f.read(1 << 16))
    if size is not None:  # a header declaring 60000 × 60000 is refused before decoding
        check_image_size(size, 3, path)
    try:
        image = cv2.imread(path, cv2.IMREAD_COLOR)
    except cv2.error as err:
        raise DataError(
            f"{path}: OpenCV cannot decode it ({str(err).strip().splitlines()[-1]})"
        ) from None
    if image is None:
        raise DataError(f"{path}: not an image OpenCV can decode")
    return image


def run(args: argparse.Namespace) -> int:
    import caffe2jax
    from caffe2jax.runtime.outputs.detections import detect

    mean = _mean(args.mean)
    names = _names(args.labels) if args.labels else None
    images = [_read(path) for path in args.images]  # every file checked before compiling
    model = caffe2jax.compile(args.model, phase="TEST")
    params, state = caffe2jax.load_weights(args.weights, model, dialect=args.dialect)
    for path, image in zip(args.images, images):
        found = detect(model, params, state, image, mean=mean, scale=args.scale,
                       swap_rb=args.rgb, threshold=args.threshold, names=names)  # fmt: skip
        for d in found:
            print(f"{path} {d.label} {d.name or d.label} {d.score:.4f} {d.xmin:.1f} "
                  f"{d.ymin:.1f} {d.xmax:.1f} {d.ymax:.1f}")  # fmt: skip
    return 0
