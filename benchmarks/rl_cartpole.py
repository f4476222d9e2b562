"""Env-steps/s: the jitted policy-gradient trainer vs the same algorithm as a host loop.

    python benchmarks/rl_cartpole.py            # about a minute and a half on 2 CPU cores
    python benchmarks/rl_cartpole.py --quick    # shorter runs, for a smoke test

Both sides train the Sigmoid Cart-Pole example (examples/rl/cartpole_sigmoid_solver.prototxt:
the same net, the same Caffe-filler initial weights, RMSProp with the solver's settings) on
Cart-Pole-v1 with MyCaffe's rule: discounted returns, per-episode standardisation, Dlogps
modulated and divided by the episode length, gradients summed over ``batch_size`` episodes,
one update per batch.

* jitted: :class:`caffe2jax.runtime.rl.PolicyGradientTrainer`, one XLA program per batch
  (rollout with lax.scan over steps and all episodes side by side, rule, solver update). The
  rows compare its loop forms: masked episodes with a while_loop of 32-step scans (the
  default), one scan over the whole 500-step horizon, and auto-reset lanes; plus a larger
  batch. Compilation is timed apart and excluded from the rate.
* host: MyCaffe's own shape — one Gymnasium ``CartPole-v1`` (gymnasium.make, wrappers
  included), one NumPy forward per step, the NumPy backward per episode, the RMSProp update
  in NumPy every ``batch_size`` episodes.

Only real environment steps are counted. Each side trains from scratch for a fixed number of
episodes (the jitted runs: best of 3 identical runs) or seconds (the host loop), so both see
the short early episodes and the long later ones. The ratio compares the default jitted row
(the example's 10 episodes per update) and the batch-100 row with the host loop.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from caffe2jax.runtime.rl import PolicyGradientTrainer

SOLVER = (
    Path(__file__).resolve().parents[1] / "examples" / "rl" / "cartpole_sigmoid_solver.prototxt"
)


@dataclass
class Row:
    name: str
    batch: int
    episodes: int
    steps: int
    seconds: float
    compile_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.steps / self.seconds


def jitted(name: str, episodes: int, seed: int, repeats: int, **options) -> Row:
    """Train from scratch for ``episodes``, ``repeats`` times (the same work each time: the
    same seed), keeping the fastest; the first batch (compilation) is timed apart."""
    trainer = PolicyGradientTrainer(SOLVER, seed=seed, **options)
    batch = trainer.config.batch_size
    start = time.perf_counter()
    jax.block_until_ready(trainer.train_batch(trainer.init()))
    compile_s = time.perf_counter() - start
    best = None
    for _ in range(repeats):
        ts, steps, done = trainer.init(), 0, 0
        start = time.perf_counter()
        while done < episodes:
            ts, metrics = trainer.train_batch(ts)
            steps += int(metrics.steps)  # a host sync per batch, as the CLI's progress needs
            done += batch
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    return Row(name, batch, done, steps, best, compile_s)


class NumpyPG:
    """MyCaffe's PG trainer for the Sigmoid example net, stepped one env step at a time."""

    def __init__(self, trainer: PolicyGradientTrainer, seed: int):
        import gymnasium

        params = trainer.init().params
        self.w = {
            k: np.asarray(v, np.float64)
            for k, v in (("W1", params["ip1"][0]), ("W2", params["actions"][0]))
        }
        sp = trainer.solver_param
        self.lr, self.decay, self.delta = sp.base_lr, sp.rms_decay, sp.delta
        self.gamma, self.batch = trainer.config.gamma, trainer.config.batch_size
        self.hist = {k: np.zeros_like(v) for k, v in self.w.items()}
        self.grad = {k: np.zeros_like(v) for k, v in self.w.items()}
        self.env = gymnasium.make("CartPole-v1")
        self.rng = np.random.default_rng(seed)
        self.seed = seed

    def episode(self, first: bool) -> int:
        obs, _ = self.env.reset(seed=self.seed if first else None)
        xs, hs, ps, acts, rewards = [], [], [], [], []
        done = False
        while not done:
            x = np.asarray(obs, np.float64)
            h = np.maximum(self.w["W1"] @ x, 0.0)
            p = 1.0 / (1.0 + np.exp(-(self.w["W2"] @ h)[0]))
            a = 0 if self.rng.random() < p else 1
            obs, r, terminated, truncated, _ = self.env.step(a)
            done = terminated or truncated
            xs.append(x), hs.append(h), ps.append(p), acts.append(a), rewards.append(r)
        self.learn(np.array(xs), np.array(hs), np.array(ps), np.array(acts), np.array(rewards))
        return len(rewards)

    def learn(self, xs, hs, ps, acts, rewards) -> None:
        returns = np.zeros_like(rewards)
        running = 0.0
        for t in range(len(rewards) - 1, -1, -1):
            running = running * self.gamma + rewards[t]
            returns[t] = running
        adv = returns - returns.mean()
        std = returns.std()
        adv = adv / std if std else adv
        diff = (-((acts == 0) - ps) * adv / len(rewards))[:, None]  # MemoryLoss ÷ T
        dh = (diff @ self.w["W2"]) * (hs > 0)
        self.grad["W2"] += diff.T @ hs
        self.grad["W1"] += dh.T @ xs

    def update(self) -> None:
        """Caffe's RMSProp ApplyUpdate on the accumulated diffs."""
        for k, g in self.grad.items():
            self.hist[k] = self.decay * self.hist[k] + (1 - self.decay) * g * g
            self.w[k] -= self.lr * g / (np.sqrt(self.hist[k]) + self.delta)
            g[...] = 0.0

    def run(self, seconds: float) -> Row:
        steps = episodes = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds or episodes % self.batch:
            steps += self.episode(first=episodes == 0)
            episodes += 1
            if episodes % self.batch == 0:
                self.update()
        return Row(
            "host loop (Gymnasium + NumPy)",
            self.batch,
            episodes,
            steps,
            time.perf_counter() - start,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs (smoke test)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    episodes, host_s, repeats = (200, 3.0, 1) if args.quick else (2000, 10.0, 3)
    print(
        f"# jax {jax.__version__}, {jax.devices()[0].platform}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    rows = [
        jitted("jitted, masked, 32-step scans in a while_loop", episodes, args.seed, repeats),
        jitted("jitted, masked, one 500-step scan", episodes, args.seed, repeats, chunk=0),
        jitted("jitted, auto-reset lanes", episodes, args.seed, repeats, reset_mode="auto"),
        jitted(
            "jitted, masked, 32-step scans, batch 100",
            episodes * 5,
            args.seed,
            repeats,
            batch_size=100,
        ),
    ]
    host = NumpyPG(PolicyGradientTrainer(SOLVER, seed=args.seed), args.seed).run(host_s)
    print(f"| {'trainer':<48} | batch | episodes | env steps | seconds | compile s | steps/s |")
    print(f"|{'-' * 50}|------:|---------:|----------:|--------:|----------:|--------:|")
    for row in [*rows, host]:
        print(
            f"| {row.name:<48} | {row.batch:5d} | {row.episodes:8d} | {row.steps:9d} | "
            f"{row.seconds:7.2f} | {row.compile_s:9.2f} | {row.rate:7.0f} |"
        )
    print(
        f"\nratio (default jitted / host loop): {rows[0].rate / host.rate:.0f}x; "
        f"batch 100: {rows[3].rate / host.rate:.0f}x"
    )


if __name__ == "__main__":
    main()
