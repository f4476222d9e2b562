#!/usr/bin/env python
"""A synthetic box data set for training detectors: shapes on a noisy background, with their
boxes, written the two ways detectors' recipes read them.

    python examples/detection/synthetic_boxes.py lmdb OUT_LMDB [--count 48] [--size 128]
    python examples/detection/synthetic_boxes.py voc OUT [--train 64] [--test 32] [--size 150]

* ``lmdb`` (:func:`make_boxes`): an AnnotatedDatum LMDB of raw images, as py-faster-rcnn's
  and py-R-FCN's recipes read it here (RoIDataLayer);
* ``voc`` (:func:`make_dataset`): VOC's layout, as SSD's recipes start from it —
  ``JPEGImages/{train,test}_NNNN.png``, ``Annotations/*.xml`` (size, objects with name,
  difficult 0 and VOC's 1-based inclusive bndbox), ``train.txt``/``test.txt`` (``image
  annotation`` pairs) and ``labelmap.prototxt`` (background 0, then the classes), and, with
  the LMDBs (the default), ``train_lmdb``/``test_lmdb`` through caffe2jax's own
  ``convert_annoset`` (encoded PNG records).

Each image (``size``×``size``, BGR, uint8, stored raw) has 1–3 non-overlapping objects of 3
classes: 1 a filled rectangle, 2 a filled ellipse, 3 a filled triangle, each 28–72 % of the
image side, in a random colour on a background of per-pixel noise around a random grey. Boxes
are stored as convert_annoset stores a VOC XML box: the 1-based pixel bounds divided by the
image size (a 0-based pixel box [x1, y1, x2, y2] becomes [(x1+1)/W, (y1+1)/H, (x2+1)/W,
(y2+1)/H]), both ways. The same seed gives the same images; ``make_boxes`` also returns the
0-based pixel boxes and labels, for evaluation.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import cv2
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


def label_map_text() -> str:
    """The LabelMap prototxt: background 0, then :data:`CLASSES` from 1."""
    items = [("none_of_the_above", 0, "background")]
    items += [(name, i + 1, name) for i, name in enumerate(CLASSES)]
    return "".join(f'item {{\n  name: "{n}"\n  label: {lbl}\n  display_name: "{d}"\n}}\n'
                   for n, lbl, d in items)  # fmt: skip


def voc_xml(name: str, size: int, boxes: np.ndarray, labels: np.ndarray) -> str:
    """The VOC annotation of one image: 0-based pixel boxes written 1-based, as VOC's are."""
    parts = [f"<annotation>\n  <filename>{name}</filename>\n  <size><width>{size}</width>"
             f"<height>{size}</height><depth>3</depth></size>\n"]  # fmt: skip
    for (x1, y1, x2, y2), label in zip(boxes.astype(int) + 1, labels):
        parts.append(f"  <object><name>{CLASSES[label - 1]}</name><difficult>0</difficult>"
                     f"<bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin><xmax>{x2}</xmax>"
                     f"<ymax>{y2}</ymax></bndbox></object>\n")  # fmt: skip
    return "".join(parts) + "</annotation>\n"


def _write_subset(out: Path, subset: str, count: int, size: int, rng) -> Path:
    lines = []
    for i in range(count):
        stem = f"{subset}_{i:04d}"
        chw, boxes, labels = make_image(rng, size)
        cv2.imwrite(str(out / "JPEGImages" / f"{stem}.png"), chw.transpose(1, 2, 0))
        (out / "Annotations" / f"{stem}.xml").write_text(voc_xml(stem, size, boxes, labels))
        lines.append(f"JPEGImages/{stem}.png Annotations/{stem}.xml\n")
    listing = out / f"{subset}.txt"
    listing.write_text("".join(lines))
    return listing


def make_dataset(out: Path, *, train: int = 64, test: int = 32, size: int = 150,
                 seed: int = 7, lmdb: bool = True) -> dict[str, Path]:  # fmt: skip
    """Write the VOC layout under ``out`` (module docstring); returns its files by name:
    ``labelmap``, ``train_list``, ``test_list`` and, with ``lmdb``, ``train_lmdb``/
    ``test_lmdb``. The train images come first from the seed's generator, then the test."""
    rng = np.random.default_rng(seed)
    (out / "JPEGImages").mkdir(parents=True, exist_ok=True)
    (out / "Annotations").mkdir(parents=True, exist_ok=True)
    files = {"labelmap": out / "labelmap.prototxt"}
    files["labelmap"].write_text(label_map_text())
    for subset, count in (("train", train), ("test", test)):
        files[f"{subset}_list"] = _write_subset(out, subset, count, size, rng)
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    lmdb = sub.add_parser("lmdb", help="an AnnotatedDatum LMDB (Faster R-CNN, R-FCN)")
    lmdb.add_argument("out")
    lmdb.add_argument("--count", type=int, default=48)
    lmdb.add_argument("--size", type=int, default=128)
    lmdb.add_argument("--seed", type=int, default=0)
    voc = sub.add_parser("voc", help="VOC's layout, label map and LMDBs (SSD)")
    voc.add_argument("out", type=Path)
    voc.add_argument("--train", type=int, default=64)
    voc.add_argument("--test", type=int, default=32)
    voc.add_argument("--size", type=int, default=150)
    voc.add_argument("--seed", type=int, default=7)
    voc.add_argument("--no-lmdb", dest="lmdb", action="store_false")
    args = parser.parse_args()
    if args.kind == "lmdb":
        make_boxes(args.out, args.count, args.size, args.seed)
        return
    files = make_dataset(args.out, train=args.train, test=args.test, size=args.size,
                         seed=args.seed, lmdb=args.lmdb)  # fmt: skip
    for name, path in files.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
