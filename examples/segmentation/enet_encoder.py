#!/usr/bin/env python
"""ENet's encoder from its own train prototxt (SpatialDropout Python layers included), trained a
few iterations through the CLI on the synthetic segmentation set.

    python examples/segmentation/enet_encoder.py WORKDIR [--iters 60]

The train net ``../shared/forks/models/enet_encoder_train.prototxt`` is rewritten only in its
list path, batch size, image size (``new_height``/``new_width`` 64×128, ENet's 512×1024 / 8;
``label_divide_factor`` 8 gives 8×16 label maps) and class count (the last deconvolution's
``num_output``: 4). The ``spatial_dropout.SpatialDropoutLayer`` layers run caffe2jax's
built-in version (lowering/spatial_dropout.py). The solver has ENet's
enet_solver_encoder.prototxt values (Adam, base_lr 0.005, momentum 0.9 / 0.999, weight_decay
0.0002) with a short run. Prints the loss every 10 iterations.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from segnet_basic import ROOT, cli, make_segmentation  # noqa: E402

TRAIN_PROTOTXT = ROOT.parent / "shared" / "forks" / "models" / "enet_encoder_train.prototxt"


def train_prototxt(text: str, source: Path, batch: int, classes: int) -> str:
    """ENet's encoder train net with the list, batch, image size and class count changed."""
    subs = [(r'source: "[^"]*"', f'source: "{source}"'),
            (r"batch_size: \d+", f"batch_size: {batch}"), (r"new_height: \d+", "new_height: 64"),
            (r"new_width: \d+", "new_width: 128"),
            (r"num_output: 19\b", f"num_output: {classes}")]  # fmt: skip
    for pattern, value in subs:
        text, n = re.subn(pattern, value, text, count=1)
        if n != 1:
            raise SystemExit(f"{TRAIN_PROTOTXT}: no {pattern!r} to rewrite")
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work", type=Path)
    p.add_argument("--iters", type=int, default=60)
    a = p.parse_args()
    work = a.work.resolve()
    data = make_segmentation.build(work / "data", 48, 12, 72, 96)
    net = work / "enet_encoder_train.prototxt"
    net.write_text(train_prototxt(TRAIN_PROTOTXT.read_text(), data / "train.txt", 4, 4))
    solver = work / "enet_solver.prototxt"
    solver.write_text(f'net: "{net}"\ntest_initialization: false\nbase_lr: 0.005\n'
                      'lr_policy: "fixed"\ndisplay: 10\nmomentum: 0.9\nmomentum2: 0.999\n'
                      f"max_iter: {a.iters}\nweight_decay: 0.0002\nsnapshot: 0\n"
                      f'snapshot_prefix: "{work / "enet"}"\nsolver_type: ADAM\n'
                      "random_seed: 1\n")  # fmt: skip
    log = cli("train", "--solver", str(solver), "--force", "--log", str(work / "train.log"))
    print("\n".join(line for line in log.splitlines() if ", loss = " in line))


if __name__ == "__main__":
    main()
