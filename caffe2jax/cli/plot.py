"""`caffe2jax plot LOG OUT.png`: training loss and test outputs from a Caffe-format log, or the
returns of a `caffe2jax rl` run (its progress lines: the mean return of the last 100 episodes
and the running reward, against episodes and against wall time)."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

from caffe2jax.cli.args import Subparsers
from caffe2jax.frontend.errors import CaffeError

_TRAIN = re.compile(r"Iteration (\d+)(?: \(.*\))?, loss = ([-\d.e+naif]+)")
_TESTING = re.compile(r"Iteration (\d+), Testing net \(#(\d+)\)")
_TEST_OUT = re.compile(r"Test net output #\d+: (\S+) = ([-\d.e+naif]+)")
_RL = re.compile(
    r"Episode (\d+), mean return = ([-\d.e+naif]+) \(last \d+\), running reward = "
    r"([-\d.e+naif]+), .* ([\d.]+) s$"
)


@dataclass
class TrainingLog:
    """What a Caffe log records: (iter, smoothed loss) and per test net/output (iter, value)."""

    train: list[tuple[int, float]] = field(default_factory=list)
    test: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    rl: list[tuple[int, float, float, float]] = field(default_factory=list)  # (episode, mean,
    # running reward, seconds) from `caffe2jax rl`


def parse_log(text: str) -> TrainingLog:
    """Read Caffe's (or our) log lines, as Caffe's tools/extra/parse_log.py does."""
    log = TrainingLog()
    test_iter, test_net = 0, 0
    for line in text.splitlines():
        if m := _TRAIN.search(line):
            log.train.append((int(m.group(1)), float(m.group(2))))
        elif m := _TESTING.search(line):
            test_iter, test_net = int(m.group(1)), int(m.group(2))
        elif m := _RL.search(line):
            log.rl.append((int(m.group(1)), *(float(m.group(i)) for i in (2, 3, 4))))
        elif m := _TEST_OUT.search(line):
            name = m.group(1) if test_net == 0 else f"{m.group(1)} (test net #{test_net})"
            log.test.setdefault(name, []).append((test_iter, float(m.group(2))))
    return log


def add(sub: Subparsers) -> None:
    p = sub.add_parser("plot", help="plot loss and test outputs from a training log to PNG")
    p.add_argument("log", help="log written by caffe2jax train (or Caffe)")
    p.add_argument("out", help="PNG file to write")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(func=run)


def _plot_losses(plt, log: TrainingLog, title: str):
    """The training loss (log scale) and the test outputs of a Caffe log."""
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
    loss_ax.set_title(title)
    return fig


def _plot_rl(plt, log: TrainingLog, title: str):
    """An RL run: mean return and running reward against episodes, and against hours."""
    episodes, means, running, seconds = zip(*log.rl)
    hours = [s / 3600 for s in seconds]
    fig, (by_episode, by_time) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    by_episode.plot(episodes, means, color="tab:blue", lw=1, label="mean return (last 100)")
    by_episode.plot(episodes, running, color="tab:orange", lw=1.6, label="running reward")
    by_episode.set_xlabel("episode")
    by_episode.set_ylabel("return")
    by_episode.legend(loc="upper left")
    by_time.plot(hours, running, color="tab:orange", lw=1.6, label="running reward")
    by_time.set_xlabel("wall time (hours)")
    for ax in (by_episode, by_time):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return fig


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
    if not log.train and not log.test and not log.rl:
        raise CaffeError(f"{path}: no training, test or RL progress lines found (is it a log?)")
    fig = _plot_rl(plt, log, path.stem) if log.rl else _plot_losses(plt, log, path.stem)
    fig.tight_layout()
    with atomic_path(args.out, overwrite=args.force) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    print(f"Wrote {args.out}")
    return 0
