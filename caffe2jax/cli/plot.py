"""`caffe2jax plot LOG OUT.png`: training loss and test outputs from a Caffe-format log."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

from caffe2jax.frontend.errors import CaffeError

_TRAIN = re.compile(r"Iteration (\d+)(?: \(.*\))?, loss = ([-\d.e+naif]+)")
_TESTING = re.compile(r"Iteration (\d+), Testing net \(#(\d+)\)")
_TEST_OUT = re.compile(r"Test net output #\d+: (\S+) = ([-\d.e+naif]+)")


@dataclass
class TrainingLog:
    """What a Caffe log records: (iter, smoothed loss) and per test net/output (iter, value)."""

    train: list[tuple[int, float]] = field(default_factory=list)
    test: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


def parse_log(text: str) -> TrainingLog:
    """Read Caffe's (or our) log lines, as Caffe's tools/extra/parse_log.py does."""
    log = TrainingLog()
    test_iter, test_net = 0, 0
    for line in text.splitlines():
        if m := _TRAIN.search(line):
            log.train.append((int(m.group(1)), float(m.group(2))))
        elif m := _TESTING.search(line):
            test_iter, test_net = int(m.group(1)), int(m.group(2))
        elif m := _TEST_OUT.search(line):
            name = m.group(1) if test_net == 0 else f"{m.group(1)} (test net #{test_net})"
            log.test.setdefault(name, []).append((test_iter, float(m.group(2))))
    return log


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="plot loss and test outputs from a training log to PNG")
    p.add_argument("log", help="log written by caffe2jax train (or Caffe)")
    p.add_argument("out", help="PNG file to write")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CaffeError("plotting needs matplotlib: pip install 'caffe2jax[plot]'") from None
    from caffe2jax.runtime.formats.atomic import atomic_path, refuse_overwrite

    refuse_overwrite(args.out, args.force)
    path = Path(args.log)
    if not path.is_file():
        raise CaffeError(f"{path}: log file not found")
    log = parse_log(path.read_text(encoding="utf-8", errors="replace"))
    if not log.train and not log.test:
        raise CaffeError(f"{path}: no training or test lines found (is it a Caffe log?)")
    fig, loss_ax = plt.subplots(figsize=(8, 4.5))
    if log.train:
        iters, losses = zip(*log.train)
        loss_ax.plot(iters, losses, color="tab:blue", label="train loss")
    for name, points in log.test.items():
        if "loss" in name:
            loss_ax.plot(*zip(*points), "o--", color="tab:orange", label=f"test {name}")
    loss_ax.set_xlabel("iteration")
    loss_ax.set_ylabel("loss")
    loss_ax.set_yscale("log")
    others = {n: p for n, p in log.test.items() if "loss" not in n}
    if others:
        score_ax = loss_ax.twinx()
        for name, points in others.items():
            score_ax.plot(*zip(*points), "s-", color="tab:green", label=f"test {name}")
        score_ax.set_ylabel("test output")
        score_ax.set_ylim(0, 1.05 if all(v <= 1 for _, v in sum(others.values(), [])) else None)
        score_ax.legend(loc="center right")
    loss_ax.legend(loc="upper center")
    loss_ax.set_title(path.stem)
    fig.tight_layout()
    with atomic_path(args.out, overwrite=args.force) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    print(f"Wrote {args.out}")
    return 0
