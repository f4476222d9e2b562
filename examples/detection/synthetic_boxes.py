#!/usr/bin/env python
"""A synthetic box data set for training detectors: shapes on a noisy background, written as an
AnnotatedDatum LMDB (the records ``caffe2jax convert_annoset`` writes).

    python scripts/frcnn_boxes.py OUT_LMDB [--count 48] [--size 128] [--seed 0]

Each image (``size``×``size``, BGR, uint8, stored raw) has 1–3 non-overlapping objects of 3
classes: 1 a filled rectangle, 2 a filled ellipse, 3 a filled triangle, each 28–72 % of the
image side, in a random colour on a background of per-pixel noise around a random grey. Boxes
are stored as convert_annoset stores a VOC XML box: the 1-based pixel bounds divided by the
image size (a 0-based pixel box [x1, y1, x2, y2] becomes [(x1+1)/W, (y1+1)/H, (x2+1)/W,
(y2+1)/H]). ``make_boxes`` also returns the 0-based pixel boxes and labels, for evaluation.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from caffe2jax.runtime.data.records.annotated_datum import Boxes, annotated_datum
from caffe2jax.runtime.data.records.datum import array_to_datum
from caffe2jax.runtime.data.records.db import Writer

CLASSES = ("rectangle", "ellipse", "triangle")


def _mask(kind: int, h: int, w: int, box: tuple[int, int, int, int]) -> np.ndarray:
    x1, y1, x2, y2 = box
    yy, xx = np.mgrid[0:h, 0:w]
    inside = (xx >= x1) & (xx <= x2) & (yy >= y1) & (yy <= y2)
    if kind == 1:
        return inside
    cx, cy, rx, ry = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2 + 0.5, (y2 - y1) / 2 + 0.5
    if kind == 2:
        return ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2 <= 1
    # triangle: apex at the top centre, base along the bottom edge
    half = (yy - y1 + 0.5) / (y2 - y1 + 1) * rx
    return inside & (np.abs(xx - cx) <= half + 0.5)


def _place(rng: np.random.Generator, size: int, boxes: list) -> tuple[int, int, int, int] | None:
    for _ in range(50):
        bw, bh = (int(v) for v in rng.uniform(0.28, 0.72, 2) * size)
        x1, y1 = int(rng.integers(0, size - bw)), int(rng.integers(0, size - bh))
        box = (x1, y1, x1 + bw - 1, y1 + bh - 1)
        if all(box[0] > b[2] + 2 or box[2] < b[0] - 2 or box[1] > b[3] + 2 or box[3] < b[1] - 2
               for b in boxes):  # fmt: skip
            return box
    return None


def make_image(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One image (3, size, size) uint8 BGR, its 0-based pixel boxes (K, 4), labels (K,)."""
    grey = rng.uniform(60, 190)
    img = np.clip(rng.normal(grey, 25, (size, size, 3)), 0, 255)
    boxes, labels = [], []
    for _ in range(int(rng.integers(1, 4))):
        box = _place(rng, size, boxes)
        if box is None:
            break
        kind = int(rng.integers(1, 4))
        colour = rng.uniform(0, 255, 3)
        while np.abs(colour.mean() - grey) < 50:
            colour = rng.uniform(0, 255, 3)
        img[_mask(kind, size, size, box)] = colour
        boxes.append(box)
        labels.append(kind)
    chw = img.astype(np.uint8).transpose(2, 0, 1)
    return chw, np.asarray(boxes, np.float64), np.asarray(labels, np.int32)


def make_boxes(path: str | Path, count: int = 48, size: int = 128, seed: int = 0) -> list:
    """Write ``count`` images to a new AnnotatedDatum LMDB at ``path``; returns the ground
    truth [(pixel boxes (K, 4), labels (K,)), ...] in record order."""
    rng = np.random.default_rng(seed)
    truth = []
    with Writer(path) as db:
        for i in range(count):
            chw, boxes, labels = make_image(rng, size)
            norm = (boxes + 1) / size
            record = annotated_datum(array_to_datum(chw), Boxes.of(norm, labels))
            db.put(f"{i:08d}", record.SerializeToString())
            truth.append((boxes, labels))
    return truth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--count", type=int, default=48)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    make_boxes(args.out, args.count, args.size, args.seed)


if __name__ == "__main__":
    main()
