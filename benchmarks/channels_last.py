"""Does the channels-last pass pay? The CPU-table cases with the pass on and off, in one process.

    python benchmarks/channels_last.py [--cases lenet,quick,googlenet1,alexnet] [--blocks 7]

The pass is a ``Model`` argument, so both variants live in one process and are timed in
alternating blocks (median per case; ratio on/off < 1 means the pass pays). Writes
``benchmarks/results/channels_last-<time>.json``/``.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_table  # noqa: E402
from harness import Row, machine, measure, write  # noqa: E402

from caffe2jax.cli import configure_jax  # noqa: E402

CASES = {
    "lenet": ("LeNet b64 train step", "train", cpu_table.LENET, (64, 1, 28, 28), 10),
    "quick": ("CIFAR-10 quick b100 train step", "train", cpu_table.QUICK, (100, 3, 32, 32), 2),
    "googlenet1": ("GoogLeNet forward b1", "forward", cpu_table.GOOGLENET, (1, 3, 224, 224), 3),
    "googlenet8": ("GoogLeNet forward b8", "forward", cpu_table.GOOGLENET, (8, 3, 224, 224), 1),
    "alexnet": ("AlexNet (fc 64) forward b1", "forward", cpu_table.ALEXNET, (1, 3, 227, 227), 3),
    "cifar_full": ("CIFAR-10 full forward b1", "forward", cpu_table.FULL, (1, 3, 32, 32), 100),
}
SOLVER = (0.001, 0.9, 4e-3)


def runner(kind: str, prototxt: Path, shape, channels_last: bool):
    from caffe2jax.lowering import layout

    layout.CHANNELS_LAST_DEFAULT = channels_last  # Models built now take this default
    if kind == "train":
        return cpu_table.train_step(prototxt, shape, *SOLVER, "fp32")
    edit = cpu_table._alexnet_fc64 if prototxt == cpu_table.ALEXNET else None
    return cpu_table.deploy(prototxt, shape, "fp32", edit)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="lenet,quick,googlenet1,alexnet,cifar_full")
    parser.add_argument("--blocks", type=int, default=7)
    args = parser.parse_args()
    configure_jax(compile_cache=False)
    import os

    os.environ.pop("CAFFE2JAX_CHANNELS_LAST", None)
    rows = []
    for name in args.cases.split(","):
        title, kind, prototxt, shape, calls = CASES[name]
        on = runner(kind, prototxt, shape, True)
        off = runner(kind, prototxt, shape, False)
        row = measure(Row(title + ": pass on (caffe2jax) vs off (peer)", "pass off"), on,
                      lambda off=off: off, calls, args.blocks)  # fmt: skip
        print(f"  {title}: on {row.ours_ms:.2f} ms, off {row.peer_ms:.2f} ms, "
              f"{row.ratio:.2f}×", flush=True)  # fmt: skip
        rows.append(row)
    write("channels_last", "Channels-last pass on vs off", rows, machine(),
          "python benchmarks/channels_last.py " + " ".join(sys.argv[1:]))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
