"""Draw a detector net's detections on an image.

    python examples/detection/draw_detections.py NET.prototxt WEIGHTS.caffemodel IMAGE OUT.png \
        [--mean 127.5 --scale 0.007843 --labels names.txt --threshold 0.5]

Works with SSD (DetectionOutput), YOLO (eric612's YoloDetectionOutput / Yolov3DetectionOutput)
and Faster R-CNN / R-FCN test nets: caffe2jax.detect runs the net and returns the detections
(class, score, box in the image's pixels), printed one per line and drawn with OpenCV.
``--random-weights`` draws with the net's own fillers instead of a .caffemodel (to try a
prototxt before its weights are at hand; pass ``-`` as WEIGHTS).
"""

from __future__ import annotations

import argparse
import sys

import cv2
import numpy as np

import caffe2jax


def colour(label: int) -> tuple[int, int, int]:
    """A fixed BGR colour per label."""
    rng = np.random.default_rng(label)
    return tuple(int(c) for c in rng.integers(64, 256, 3))


def draw(image: np.ndarray, detections) -> np.ndarray:
    """A copy of ``image`` with each detection's box (clipped to the image) and caption."""
    out = image.copy()
    h, w = out.shape[:2]
    for d in detections:
        x1, y1 = int(np.clip(d.xmin, 0, w - 1)), int(np.clip(d.ymin, 0, h - 1))
        x2, y2 = int(np.clip(d.xmax, 0, w - 1)), int(np.clip(d.ymax, 0, h - 1))
        c = colour(d.label)
        cv2.rectangle(out, (x1, y1), (x2, y2), c, 2)
        caption = f"{d.name or d.label} {d.score:.2f}"
        cv2.putText(out, caption, (x1, max(y1 - 3, 10)), cv2.FONT_HERSHEY_SIMPLEX, 0.4, c, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("net")
    p.add_argument("weights", help="a .caffemodel, or - with --random-weights")
    p.add_argument("image")
    p.add_argument("out", help="where to write the drawn image (PNG, JPEG…)")
    p.add_argument("--mean", type=float, nargs="+", default=[0.0], help="B G R or one value")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--rgb", action="store_true", help="feed RGB instead of BGR")
    p.add_argument("--threshold", type=float, default=0.5)
    p.add_argument("--labels", help="class names, one per line, label 0 first")
    p.add_argument("--random-weights", action="store_true")
    args = p.parse_args(argv)

    image = cv2.imread(args.image, cv2.IMREAD_COLOR)
    if image is None:
        print(f"draw_detections: cannot read image {args.image}", file=sys.stderr)
        return 1
    model = caffe2jax.compile(args.net, phase="TEST")
    if args.random_weights:
        params, state = model.init(0)
    else:
        params, state = caffe2jax.load_weights(args.weights, model)
    names = open(args.labels).read().splitlines() if args.labels else None
    mean = args.mean * 3 if len(args.mean) == 1 else args.mean
    found = caffe2jax.detect(model, params, state, image, mean=mean, scale=args.scale,
                             swap_rb=args.rgb, threshold=args.threshold, names=names)  # fmt: skip
    for d in found:
        print(d)
    if not cv2.imwrite(args.out, draw(image, found)):
        print(f"draw_detections: cannot write {args.out}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
