"""Does a fast path pay? The CPU-table cases with it on and off, in one process.

    python benchmarks/fast_paths.py --path layout|pool|pointwise|patches [--cases a,b] [--blocks 7]

Each side is the same net compiled with an engine policy (lowering/engines/policy.py) that differs
in one field from the environment's: ``layout``: the channels-last pass (``channels_last``,
lowering/layout.py). ``pool``: MAX/AVE pooling as strided views with phase-sum backwards
(lowering/engines/windows.py, ``pool="phases"``) vs XLA's reduce_window (``pool="xla"``:
select_and_scatter / padded window-sum backwards). ``pointwise``: 1×1 convolutions as one matrix
product (lowering/engines/conv_forms.py, ``pointwise``) vs lax.conv. ``patches``: convolutions of
≤ 4 input channels as im2col + one matrix product (``patches``) vs lax.conv / oneDNN. Both
variants live in one process and are timed in alternating blocks (median per case; ratio on/off
< 1 means the path pays). Writes ``benchmarks/results/<path>-<time>.json``/``.md``.
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


# each path: the policy field it turns on and off, and its two values
FIELDS = {
    "layout": ("channels_last", True, False),
    "pool": ("pool", "phases", "xla"),
    "pointwise": ("pointwise", True, False),
    "patches": ("patches", True, False),
}


def policy(path: str, on: bool):
    """The environment's engine policy with ``path``'s field on or off."""
    from caffe2jax.lowering.engines.policy import EnginePolicy

    field, yes, no = FIELDS[path]
    return EnginePolicy.from_env(**{field: yes if on else no})


def runner(kind: str, prototxt: Path, shape, path: str, on: bool):
    if kind == "train":
        return cpu_table.train_step(prototxt, shape, *SOLVER, "fp32", policy(path, on))
    edit = cpu_table._alexnet_fc64 if prototxt == cpu_table.ALEXNET else None
    return cpu_table.deploy(prototxt, shape, "fp32", edit, policy(path, on))[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--path", choices=["layout", "pool", "pointwise", "patches"], required=True)
    parser.add_argument("--cases", default="lenet,quick,googlenet1,alexnet,cifar_full")
    parser.add_argument("--blocks", type=int, default=7)
    args = parser.parse_args()
    configure_jax(compile_cache=False)
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
