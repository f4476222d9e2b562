#!/usr/bin/env python
"""A small synthetic segmentation set in SegNet's CamVid layout (image / label PNG pairs).

    python examples/segmentation/make_segmentation.py OUT \
        [--train 48 --test 12 --height 64 --width 80]

Each image is a noisy, smoothly shaded background (class 0) with 2 to 4 shapes drawn on it:
discs (class 1), rectangles (class 2) and triangles (class 3), each class in its own hue with
random brightness and per-pixel noise, so that a pixel's class follows from its colour and
neighbourhood but not from its colour alone. Writes ``OUT/train/*.png``, ``OUT/trainannot/
*.png`` (gray PNGs of class ids), the same for ``test``, and the lists ``train.txt`` and
``test.txt`` with absolute ``image label`` paths per line (as CamVid's lists), plus
``class_weighting.txt``: SegNet's median-frequency weights of the training labels
(``median(f)/f_c``, ``f_c`` = pixels of class c / pixels of the images holding class c).
Fixed seed: the same files each run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import cv2
import numpy as np

CLASSES = 4  # background, disc, rectangle, triangle
HUES = np.array([[0, 0, 0], [60, 60, 200], [60, 190, 70], [200, 90, 50]], np.float32)  # BGR


def _shape_mask(rng: np.random.Generator, kind: int, h: int, w: int) -> np.ndarray:
    mask = np.zeros((h, w), np.uint8)
    size = int(rng.integers(min(h, w) // 6, min(h, w) // 3))
    cy, cx = int(rng.integers(size, h - size)), int(rng.integers(size, w - size))
    if kind == 1:
        cv2.circle(mask, (cx, cy), size, 1, -1)
    elif kind == 2:
        dy, dx = size, int(size * rng.uniform(0.6, 1.4))
        cv2.rectangle(mask, (cx - dx, cy - dy), (cx + dx, cy + dy), 1, -1)
    else:
        angle = rng.uniform(0, 2 * np.pi)
        pts = [(cx + size * np.cos(angle + k * 2.094), cy + size * np.sin(angle + k * 2.094))
               for k in range(3)]  # fmt: skip
        cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], 1)
    return mask.astype(bool)


def make_pair(rng: np.random.Generator, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """One (H, W, 3) uint8 BGR image and its (H, W) uint8 label map."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    tilt = rng.uniform(-1, 1, 3)
    base = rng.uniform(70, 170, 3)[None, None] + 40 * np.sin(
        (yy[..., None] * tilt[0] + xx[..., None] * tilt[1]) / 9 + tilt[2] * np.arange(3)
    )
    image = base.astype(np.float32)
    label = np.zeros((h, w), np.uint8)
    for _ in range(int(rng.integers(2, 5))):
        kind = int(rng.integers(1, CLASSES))
        mask = _shape_mask(rng, kind, h, w)
        image[mask] = HUES[kind] * rng.uniform(0.75, 1.25)
        label[mask] = kind
    image += rng.normal(0, 25, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8), label


def class_weighting(labels: list[np.ndarray], classes: int = CLASSES) -> np.ndarray:
    """SegNet's median frequency balancing over ``labels``."""
    pixels = np.zeros(classes)
    present = np.zeros(classes)
    for label in labels:
        counts = np.bincount(label.ravel(), minlength=classes)[:classes]
        pixels += counts
        present += (counts > 0) * label.size
    freq = pixels / np.maximum(present, 1)
    return np.median(freq) / np.maximum(freq, 1e-12)


def build(out: Path, train: int, test: int, height: int, width: int, seed: int = 7) -> Path:
    """Write the set under ``out``; returns ``out``."""
    rng = np.random.default_rng(seed)
    train_labels = []
    for subset, count in (("train", train), ("test", test)):
        (out / subset).mkdir(parents=True, exist_ok=True)
        (out / f"{subset}annot").mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(count):
            image, label = make_pair(rng, height, width)
            img, lab = out / subset / f"{i:04d}.png", out / f"{subset}annot" / f"{i:04d}.png"
            cv2.imwrite(str(img), image)
            cv2.imwrite(str(lab), label)
            lines.append(f"{img.resolve()} {lab.resolve()}\n")
            if subset == "train":
                train_labels.append(label)
        (out / f"{subset}.txt").write_text("".join(lines))
    weights = class_weighting(train_labels)
    (out / "class_weighting.txt").write_text(" ".join(f"{w:.4f}" for w in weights) + "\n")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--train", type=int, default=48)
    p.add_argument("--test", type=int, default=12)
    p.add_argument("--height", type=int, default=64)
    p.add_argument("--width", type=int, default=80)
    a = p.parse_args()
    build(a.out, a.train, a.test, a.height, a.width)
    print(f"wrote {a.train} + {a.test} pairs under {a.out}")


if __name__ == "__main__":
    main()
