#!/usr/bin/env python
"""Build examples/digits/: scikit-learn's 8×8 handwritten digits as Caffe LMDBs.

    python scripts/make_digits.py               # writes examples/digits/digits_{train,test}_lmdb
    python scripts/make_digits.py --images DIR  # also keep the PNGs and list files in DIR

The 1797 images (pixel values 0..16, stored unchanged in 8-bit gray PNGs) are split with a
fixed seed into 1437 training and 360 test images, stratified by digit. The PNGs and
``train.txt``/``test.txt`` lists go through caffe2jax's own ``convert_imageset`` (gray, raw
Datum records), and ``compute_image_mean`` writes the training mean to
``digits_mean.binaryproto``. The outputs are replaced if present.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from caffe2jax.runtime.tools.imageset import compute_image_mean, convert_imageset

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "examples" / "digits"
SEED = 1701
N_TEST = 360


def split(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the training and test images: a stratified split with a fixed seed."""
    train, test = train_test_split(
        np.arange(len(labels)), test_size=N_TEST, stratify=labels, random_state=SEED
    )
    return np.asarray(train), np.asarray(test)


def write_images(folder: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """One PNG per image and the lists ``train.txt`` and ``test.txt`` under ``folder``."""
    train, test = split(labels)
    for subset, members in (("train", train), ("test", test)):
        (folder / subset).mkdir(parents=True, exist_ok=True)
        lines = []
        for index in members:
            name = f"{subset}/{index:04d}.png"
            Image.fromarray(images[index].astype(np.uint8), mode="L").save(folder / name)
            lines.append(f"{name} {labels[index]}\n")
        (folder / f"{subset}.txt").write_text("".join(lines))


def build(images_dir: Path) -> None:
    digits = load_digits()
    write_images(images_dir, digits.images, digits.target)
    for subset in ("train", "test"):
        db = OUT / f"digits_{subset}_lmdb"
        if db.exists():
            shutil.rmtree(db)
        count = convert_imageset(f"{images_dir}/", images_dir / f"{subset}.txt", db, gray=True)
        print(f"{db.relative_to(ROOT)}: {count} records")
    mean = compute_image_mean(OUT / "digits_train_lmdb", OUT / "digits_mean.binaryproto")
    print(f"digits_mean.binaryproto: shape {mean.shape}, overall mean {mean.mean():.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, help="keep the PNGs and lists in this folder")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.images:
        build(args.images)
        return
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))


if __name__ == "__main__":
    main()
