"""Does a fast path pay? The CPU-table cases with it on and off, in one process.

    python benchmarks/fast_paths.py --path layout|pool|pointwise|patches [--cases a,b] [--blocks 7]

``layout``: the channels-last pass (lowering/layout.py). ``pool``: MAX/AVE pooling as strided views
with phase-sum backwards (lowering/engines/windows.py, ``pooling.POOL_BACKWARD = "phases"``) vs
XLA's reduce_window (select_and_scatter / padded window-sum backwards). Both variants live in one
process and are timed in alternating blocks (median per case; ratio on/off < 1 means the path pays).
``pointwise``: 1×1 convolutions as one matrix product (lowering/vision.py ``POINTWISE_DOT``) vs
lax.conv. ``patches``: convolutions of ≤ 4 input channels as im2col + one matrix product
(``FEW_CHANNELS``) vs lax.conv / oneDNN. Writes ``benchmarks/results/<path>-<time>.json``/``.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_table  # noqa: E402
from harness import Row, machine, measure, write  # noqa: E402

from caffe2jax.cli.main import configure_jax  # noqa: E402

CASES = {
    "lenet": ("LeNet b64 train step", "train", cpu_table.LENET, (64, 1, 28, 28), 10),
    "quick": ("CIFAR-10 quick b100 train step", "train", cpu_table.QUICK, (100, 3, 32, 32), 2),
    "googlenet1": ("GoogLeNet forward b1", "forward", cpu_table.GOOGLENET, (1, 3, 224, 224), 3),
    "googlenet8": ("GoogLeNet forward b8", "forward", cpu_table.GOOGLENET, (8, 3, 224, 224), 1),
    "alexnet": ("AlexNet (fc 64) forward b1", "forward", cpu_table.ALEXNET, (1, 3, 227, 227), 3),
    "cifar_full": ("CIFAR-10 full forward b1", "forward", cpu_table.FULL, (1, 3, 32, 32), 100),
}
SOLVER = (0.001, 0.9, 4e-3)


def runner(kind: str, prototxt: Path, shape, path: str, on: bool):
    from caffe2jax.lowering import layout, pooling, vision

    # read when a Model is built (layout) or when its program is traced (pool)
    layout.CHANNELS_LAST_DEFAULT = on if path == "layout" else layout.CHANNELS_LAST_DEFAULT
    pool_form = ("phases" if on else "xla") if path == "pool" else pooling.POOL_BACKWARD
    pointwise = on if path == "pointwise" else vision.POINTWISE_DOT
    few = (4 if on else 0) if path == "patches" else vision.FEW_CHANNELS
    pooling.POOL_BACKWARD, vision.POINTWISE_DOT, vision.FEW_CHANNELS = pool_form, pointwise, few
    if kind == "train":
        run = cpu_table.train_step(prototxt, shape, *SOLVER, "fp32")
    else:
        edit = cpu_table._alexnet_fc64 if prototxt == cpu_table.ALEXNET else None
        run = cpu_table.deploy(prototxt, shape, "fp32", edit)[0]

    def traced_with_its_setting():
        pooling.POOL_BACKWARD, vision.POINTWISE_DOT, vision.FEW_CHANNELS = pool_form, pointwise, few
        return run()

    return traced_with_its_setting


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--path", choices=["layout", "pool", "pointwise", "patches"], required=True)
    parser.add_argument("--cases", default="lenet,quick,googlenet1,alexnet,cifar_full")
    parser.add_argument("--blocks", type=int, default=7)
    args = parser.parse_args()
    configure_jax(compile_cache=False)
    import os

    os.environ.pop("CAFFE2JAX_CHANNELS_LAST", None)
    rows = []
    for name in args.cases.split(","):
        title, kind, prototxt, shape, calls = CASES[name]
        on = runner(kind, prototxt, shape, args.path, True)
        off = runner(kind, prototxt, shape, args.path, False)
        row = measure(Row(f"{title}: {args.path} on vs off", "off"), on,
                      lambda off=off: off, calls, args.blocks)  # fmt: skip
        print(f"  {title}: on {row.ours_ms:.2f} ms, off {row.peer_ms:.2f} ms, "
              f"{row.ratio:.2f}×", flush=True)  # fmt: skip
        rows.append(row)
    write(args.path, f"Fast path {args.path}: on vs off", rows, machine(),
          "python benchmarks/fast_paths.py " + " ".join(sys.argv[1:]))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
