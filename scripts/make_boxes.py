#!/usr/bin/env python
"""Build a synthetic detection data set: shapes with known boxes, as SSD's tools expect them.

    python scripts/make_boxes.py OUT                  # 64 train + 32 test 150×150 images
    python scripts/make_boxes.py OUT --train 256 --size 160

Each image is a noisy gray-green background with 1 to 3 filled shapes of three classes, each
class its own colour family: ``rectangle`` (red), ``circle`` (green-blue), ``triangle``
(yellow); a shape's side is 22 % to 55 % of the image, and shapes overlap each other by at
most 10 % of their boxes' IoU. Written under OUT:

* ``JPEGImages/{train,test}_NNNN.png``, ``Annotations/*.xml`` (VOC: size, objects with name,
  difficult 0, integer bndbox, the shape's tight box);
* ``train.txt``/``test.txt`` (``image annotation`` pairs, as convert_annoset reads them) and
  ``labelmap.prototxt`` (background 0, then the three classes);
* with ``--lmdb`` (the default), ``train_lmdb``/``test_lmdb`` through caffe2jax's own
  ``convert_annoset`` (encoded PNG records).

The same seed gives the same files.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import cv2
import numpy as np

CLASSES = ("rectangle", "circle", "triangle")
COLOURS = ((40, 40, 220), (200, 160, 30), (30, 210, 230))  # BGR: red, teal, yellow


def label_map_text() -> str:
    """The LabelMap prototxt: background 0, then :data:`CLASSES` from 1."""
    items = [("none_of_the_above", 0, "background")]
    items += [(name, i + 1, name) for i, name in enumerate(CLASSES)]
    return "".join(f'item {{\n  name: "{n}"\n  label: {lbl}\n  display_name: "{d}"\n}}\n'
                   for n, lbl, d in items)  # fmt: skip


def _iou(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    iw = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / area if area else 0.0


def _draw(image: np.ndarray, cls: int, box: tuple[int, ...], rng: np.random.Generator) -> None:
    x0, y0, x1, y1 = box
    colour = tuple(int(np.clip(c + rng.integers(-25, 26), 0, 255)) for c in COLOURS[cls])
    if cls == 0:
        cv2.rectangle(image, (x0, y0), (x1 - 1, y1 - 1), colour, thickness=-1)
    elif cls == 1:
        centre = ((x0 + x1) / 2, (y0 + y1) / 2)
        cv2.ellipse(image, (centre, (x1 - x0 - 1, y1 - y0 - 1), 0), colour, thickness=-1)
    else:
        points = np.array([[(x0 + x1) // 2, y0], [x0, y1 - 1], [x1 - 1, y1 - 1]], np.int32)
        cv2.fillPoly(image, [points], colour)


def make_image(size: int, rng: np.random.Generator) -> tuple[np.ndarray, list[tuple]]:
    """One BGR image (H×W×3 uint8) and its objects ``(class, (xmin, ymin, xmax, ymax))``,
    boxes in pixels with exclusive max (the VOC file stores them as they are)."""
    base = rng.integers(60, 140, 3)
    image = np.clip(base + rng.normal(0, 18, (size, size, 3)), 0, 255).astype(np.uint8)
    objects: list[tuple] = []
    for _ in range(int(rng.integers(1, 4))):
        for _try in range(20):
            w = int(size * rng.uniform(0.22, 0.55))
            h = int(np.clip(w * rng.uniform(0.7, 1.4), size * 0.2, size * 0.6))
            x0, y0 = int(rng.integers(0, size - w + 1)), int(rng.integers(0, size - h + 1))
            box = (x0, y0, x0 + w, y0 + h)
            if all(_iou(box, other) <= 0.1 for _, other in objects):
                cls = int(rng.integers(0, len(CLASSES)))
                _draw(image, cls, box, rng)
                objects.append((cls, box))
                break
    return image, objects


def voc_xml(name: str, size: int, objects: list[tuple]) -> str:
    """The VOC annotation of one image."""
    parts = [f"<annotation>\n  <filename>{name}</filename>\n  <size><width>{size}</width>"
             f"<height>{size}</height><depth>3</depth></size>\n"]  # fmt: skip
    for cls, (x0, y0, x1, y1) in objects:
        parts.append(f"  <object><name>{CLASSES[cls]}</name><difficult>0</difficult><bndbox>"
                     f"<xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax><ymax>{y1}</ymax>"
                     "</bndbox></object>\n")  # fmt: skip
    return "".join(parts) + "</annotation>\n"


def make_dataset(out: Path, *, train: int = 64, test: int = 32, size: int = 150,
                 seed: int = 7, lmdb: bool = True) -> dict[str, Path]:  # fmt: skip
    """Write the data set under ``out`` (see the module doc); returns its files by name:
    ``labelmap``, ``train_list``, ``test_list`` and, with ``lmdb``, ``train_lmdb``/
    ``test_lmdb``."""
    rng = np.random.default_rng(seed)
    (out / "JPEGImages").mkdir(parents=True, exist_ok=True)
    (out / "Annotations").mkdir(parents=True, exist_ok=True)
    files = {"labelmap": out / "labelmap.prototxt"}
    files["labelmap"].write_text(label_map_text())
    for subset, count in (("train", train), ("test", test)):
        lines = []
        for i in range(count):
            stem = f"{subset}_{i:04d}"
            image, objects = make_image(size, rng)
            cv2.imwrite(str(out / "JPEGImages" / f"{stem}.png"), image)
            (out / "Annotations" / f"{stem}.xml").write_text(voc_xml(stem, size, objects))
            lines.append(f"JPEGImages/{stem}.png Annotations/{stem}.xml\n")
        files[f"{subset}_list"] = out / f"{subset}.txt"
        files[f"{subset}_list"].write_text("".join(lines))
    if lmdb:
        from caffe2jax.runtime.tools.annoset import convert_annoset

        for subset in ("train", "test"):
            db = files[f"{subset}_lmdb"] = out / f"{subset}_lmdb"
            if db.exists():
                shutil.rmtree(db)
            convert_annoset(f"{out}/", files[f"{subset}_list"], db, label_type="xml",
                            label_map_file=files["labelmap"], encoded=True)  # fmt: skip
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, default=64)
    parser.add_argument("--test", type=int, default=32)
    parser.add_argument("--size", type=int, default=150)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-lmdb", dest="lmdb", action="store_false")
    args = parser.parse_args()
    files = make_dataset(args.out, train=args.train, test=args.test, size=args.size,
                         seed=args.seed, lmdb=args.lmdb)  # fmt: skip
    for name, path in files.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
