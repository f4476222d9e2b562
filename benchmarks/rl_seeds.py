"""16 seeds in one program (``rl --seeds 0-15``) vs 16 sequential runs of the same trainer.

    python benchmarks/rl_seeds.py            # a few minutes on 2 CPU cores
    python benchmarks/rl_seeds.py --seeds 4  # shorter, for a smoke test

Both sides train the Sigmoid Cart-Pole example (examples/rl/cartpole_sigmoid_solver.prototxt)
on CartPole-v1 until solved (mean return >= 475 over 100 episodes) or ``--episodes``:

* vmapped: :func:`caffe2jax.runtime.rl.seeds.train_seeds`, the batch program vmapped over the
  seed axis, every seed advanced by one update per program; it runs until the slowest seed
  solved (seeds that solved keep training);
* sequential: one :class:`PolicyGradientTrainer` per seed, ``run()`` until that seed solved.

Wall times include compilation (once for the vmapped program; once per trainer for the
sequential runs, as 16 separate ``caffe2jax rl`` calls would pay). Printed: solve rate and solve
episodes of each side, both wall times and their ratio.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from caffe2jax.runtime.rl import PolicyGradientTrainer
from caffe2jax.runtime.rl.seeds import train_seeds

SOLVER = Path(__file__).resolve().parents[1] / "examples/rl/cartpole_sigmoid_solver.prototxt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--episodes", type=int, default=5000)
    args = ap.parse_args()
    seeds = list(range(args.seeds))

    start = time.perf_counter()
    trainer = PolicyGradientTrainer(SOLVER, seed=0)
    result = train_seeds(trainer, seeds, args.episodes, trainer.target)
    vmapped = time.perf_counter() - start

    start = time.perf_counter()
    sequential_at = []
    for seed in seeds:
        t = PolicyGradientTrainer(SOLVER, seed=seed)
        sequential_at.append(t.run(episodes=args.episodes).solved_at)
    sequential = time.perf_counter() - start

    def summary(at: list[int | None]) -> str:
        hit = [a for a in at if a is not None]
        med = f", median {np.median(hit):.0f}" if hit else ""
        return f"{len(hit)}/{len(at)} solved{med}: {at}"

    print(f"vmapped    {vmapped:7.1f} s  {summary(result.solved_at)}")
    print(f"sequential {sequential:7.1f} s  {summary(sequential_at)}")
    print(f"ratio (sequential / vmapped): {sequential / vmapped:.2f}x")


if __name__ == "__main__":
    main()
