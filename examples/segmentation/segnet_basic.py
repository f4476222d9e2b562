#!/usr/bin/env python
"""SegNet-basic from SegNet-Tutorial's own train prototxt, end to end through the CLI.

    python examples/segmentation/segnet_basic.py WORKDIR [--iters 400] [--batch 4]

1. ``make_segmentation.py``: a synthetic set (4 classes, 48 train / 12 test images of
   72×96, CamVid's 360×480 / 5, so that the net's ``pad_out_h`` upsampling fits).
2. The train prototxt ``../shared/forks/models/segnet_basic_train.prototxt`` rewritten only
   where SegNet's tutorial tells users to (the list path, the batch size) and for the class
   count (the classifier's ``num_output``, ``class_weighting`` from the set's median
   frequencies); the solver has SegNet-Tutorial's segnet_basic_solver.prototxt values
   (base_lr 0.1, momentum 0.9, weight_decay 0.0005, lr_policy step with gamma 1, i.e. fixed).
3. ``caffe2jax train --solver``; then ``caffe2jax train --snapshot`` from the half-way
   snapshot to the end, whose weights must equal the straight run's bit for bit.
4. ``caffe2jax compute_bn_stats`` (weights and inference prototxt), then ``caffe2jax segment``
   on the test images; pixel accuracy and mean IoU against the test labels are printed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TRAIN_PROTOTXT = ROOT.parent / "shared" / "forks" / "models" / "segnet_basic_train.prototxt"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_segmentation  # noqa: E402


def train_prototxt(text: str, source: Path, batch: int, weights: list[float]) -> str:
    """The tutorial's train net with the list, batch size and class count changed."""
    text, n = re.subn(r'source: "[^"]*"', f'source: "{source}"', text, count=1)
    text, m = re.subn(r"batch_size: \d+", f"batch_size: {batch}", text, count=1)
    text, k = re.subn(r"num_output: 11\b", f"num_output: {len(weights)}", text)
    lines = "".join(f"    class_weighting: {w:.4f}\n" for w in weights)
    text, j = re.subn(r"(    class_weighting: [\d.]+\n)+", lines, text)
    if (n, m, k, j) != (1, 1, 1, 1):
        raise SystemExit(f"{TRAIN_PROTOTXT}: not the expected SegNet-basic text ({n, m, k, j})")
    return text


def solver_prototxt(net: Path, prefix: Path, max_iter: int, snapshot: int) -> str:
    """SegNet-Tutorial Models/segnet_basic_solver.prototxt with the paths and lengths set."""
    return (f'net: "{net}"\ntest_initialization: false\ntest_iter: 1\n'
            "test_interval: 10000000\nbase_lr: 0.1\nlr_policy: \"step\"\ngamma: 1.0\n"
            "stepsize: 10000000\ndisplay: 20\nmomentum: 0.9\n"
            f"max_iter: {max_iter}\nweight_decay: 0.0005\nsnapshot: {snapshot}\n"
            f'snapshot_prefix: "{prefix}"\nrandom_seed: 1\n')  # fmt: skip


def cli(*args: str) -> str:
    """Run ``caffe2jax ARGS`` as a user would; its output, or exit with its error."""
    run = subprocess.run([sys.executable, "-m", "caffe2jax", *args], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    if run.returncode:
        raise SystemExit(f"caffe2jax {args[0]} failed:\n{run.stdout[-2000:]}{run.stderr[-3000:]}")
    return run.stdout + run.stderr


def scores(pairs: list[tuple[Path, Path]], predicted: Path, classes: int) -> dict[str, float]:
    """Pixel accuracy and mean IoU of ``predicted/<name>.png`` against the label maps."""
    confusion = np.zeros((classes, classes), np.int64)
    for image, label in pairs:
        truth = cv2.imread(str(label), cv2.IMREAD_GRAYSCALE).astype(np.int64)
        guess = cv2.imread(str(predicted / f"{image.stem}.png"), cv2.IMREAD_UNCHANGED)
        confusion += np.bincount(truth.ravel() * classes + guess.astype(np.int64).ravel(),
                                 minlength=classes * classes).reshape(classes, classes)  # fmt: skip
    inter = np.diag(confusion)
    union = confusion.sum(0) + confusion.sum(1) - inter
    majority = confusion.sum(1).max() / confusion.sum()
    return {"pixel_accuracy": inter.sum() / confusion.sum(),
            "mean_iou": float(np.mean(inter / np.maximum(union, 1))),
            "majority_class_share": float(majority)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work", type=Path)
    p.add_argument("--iters", type=int, default=400)
    p.add_argument("--batch", type=int, default=4)
    a = p.parse_args()
    work = a.work.resolve()
    data = make_segmentation.build(work / "data", 48, 12, 72, 96)
    weights = [float(w) for w in (data / "class_weighting.txt").read_text().split()]
    net = work / "segnet_basic_train.prototxt"
    net.write_text(train_prototxt(TRAIN_PROTOTXT.read_text(), data / "train.txt", a.batch,
                                  weights))  # fmt: skip
    half = a.iters // 2
    for name, prefix in (("solver", work / "snap" / "segnet_basic"),
                         ("resume", work / "resume" / "segnet_basic")):  # fmt: skip
        prefix.parent.mkdir(parents=True, exist_ok=True)
        (work / f"{name}.prototxt").write_text(solver_prototxt(net, prefix, a.iters, half))
    log = cli("train", "--solver", str(work / "solver.prototxt"), "--force",
              "--log", str(work / "train.log"))  # fmt: skip
    print("\n".join(line for line in log.splitlines() if ", loss = " in line))
    state = work / "snap" / f"segnet_basic_iter_{half}.solverstate"
    cli("train", "--solver", str(work / "resume.prototxt"), "--snapshot", str(state), "--force",
        "--log", str(work / "resume.log"))  # fmt: skip
    final = f"segnet_basic_iter_{a.iters}.caffemodel"
    same = (work / "snap" / final).read_bytes() == (work / "resume" / final).read_bytes()
    print(f"resumed from iteration {half}: final weights identical to the straight run: {same}")
    folded, deploy = work / "segnet_basic_inference.caffemodel", work / "inference.prototxt"
    print(cli("compute_bn_stats", str(net), str(work / "snap" / final), str(folded),
              "--inference-prototxt", str(deploy), "--force").splitlines()[-2])  # fmt: skip
    pairs = [tuple(Path(t) for t in line.split())
             for line in (data / "test.txt").read_text().splitlines()]  # fmt: skip
    cli("segment", "--model", str(deploy), "--weights", str(folded), "--blob", "prob",
        "--out", str(work / "predicted"), *(str(img) for img, _ in pairs))  # fmt: skip
    result = scores(pairs, work / "predicted", len(weights))
    print(" ".join(f"{k} {v:.4f}" for k, v in result.items()))
    if not same:
        raise SystemExit("resuming did not reproduce the straight run")


if __name__ == "__main__":
    main()
