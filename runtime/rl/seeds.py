"""Many seeds in one program: independent policies trained side by side (``rl --seeds 0-15``).

Each seed has its own params, solver state, PRNG key and lane memory, exactly what
:meth:`PolicyGradientTrainer.init` gives that seed; the batch program of the JAX path
(episodes, MyCaffe's rule, one solver update) is ``jax.vmap``-ed over the seed axis, so one
XLA program advances every seed by one update. With several devices and a seed count they
divide, the seed axis is sharded across them. A seed keeps training after it solved (its
solve episode is recorded) until every seed solved or the episode limit is reached.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import numpy as np

from caffe2jax.runtime.rl.policy import RLError
from caffe2jax.runtime.rl.rollout import new_lanes
from caffe2jax.runtime.rl.trainer import SOLVED_WINDOW, PolicyGradientTrainer, PolicyState
from caffe2jax.runtime.train.step import merge


@dataclass
class SeedsResult:
    """Per seed: every episode's return and the 1-based episode at which it solved."""

    seeds: list[int]
    returns: np.ndarray  # (seeds, episodes)
    solved_at: list[int | None] = field(default_factory=list)
    steps: int = 0

    @property
    def solve_rate(self) -> float:
        return sum(s is not None for s in self.solved_at) / len(self.seeds)


def parse_seeds(text: str) -> list[int]:
    """``"0-15"``, ``"3,5,8"`` or a mix (``"0-3,9"``)."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            seeds.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    except ValueError:
        raise RLError(f"--seeds takes a range or list like 0-15 or 1,4,7; got '{text}'") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise RLError(f"--seeds needs distinct seeds; got '{text}'")
    return seeds


def _init_fn(trainer: PolicyGradientTrainer):
    def init(seed: jax.Array) -> PolicyState:
        k_init, k_run = jax.random.split(jax.random.key(seed))
        params, state = trainer.model.init(k_init)
        opt_state = trainer.tx.init(merge(params, state))
        lanes = new_lanes(trainer.config.batch_size, trainer.policy.obs_size)
        return PolicyState(params, state, opt_state, k_run, lanes)

    return init


def _shard(tree: PolicyState, count: int) -> PolicyState:
    devices = jax.devices()
    if len(devices) < 2 or count % len(devices):
        return tree
    mesh = jax.sharding.Mesh(np.array(devices), ("seed",))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("seed"))
    return jax.device_put(tree, spec)


def train_seeds(
    trainer: PolicyGradientTrainer, seeds: list[int], episodes: int, target: float | None
) -> SeedsResult:
    """Train one policy per seed, side by side, for at most ``episodes`` episodes each."""
    if trainer.env is None or trainer.config.horizon is None:
        raise RLError(
            "--seeds runs capped JAX environments (cartpole, cartpole-v0/v1, gymnax:<id>, or "
            "cartpole-mycaffe with a horizon); "
            f"'{trainer.config.env}' has no step cap here"
        )
    ts = jax.jit(jax.vmap(_init_fn(trainer)))(np.asarray(seeds, np.uint32))
    ts = _shard(ts, len(seeds))
    batch = jax.jit(jax.vmap(trainer.driver.batch_fn))
    chunks: list[np.ndarray] = []
    solved: list[int | None] = [None] * len(seeds)
    steps, done = 0, 0
    while done < episodes and (target is None or any(s is None for s in solved)):
        ts, metrics = batch(ts)
        chunks.append(np.asarray(metrics.returns))
        steps += int(np.sum(metrics.steps))
        done += chunks[-1].shape[1]
        if target is not None:
            _mark_solved(np.concatenate(chunks, axis=1), solved, target, done - chunks[-1].shape[1])
    return SeedsResult(list(seeds), np.concatenate(chunks, axis=1), solved, steps)


def _mark_solved(returns: np.ndarray, solved: list[int | None], target: float, since: int) -> None:
    """Record, per seed, the first episode where the trailing-100 mean reaches ``target``."""
    n = returns.shape[1]
    if n < SOLVED_WINDOW:
        return
    sums = np.cumsum(returns, axis=1, dtype=np.float64)
    window = sums[:, SOLVED_WINDOW - 1 :].copy()
    window[:, 1:] -= sums[:, : n - SOLVED_WINDOW]
    means = window / SOLVED_WINDOW  # means[:, j]: episodes j+1 .. j+100
    first = max(since - SOLVED_WINDOW + 1, 0)
    for i, at in enumerate(solved):
        if at is None:
            hits = np.flatnonzero(means[i, first:] >= target)
            if hits.size:
                solved[i] = int(first + hits[0] + SOLVED_WINDOW)


def trailing_means(returns: np.ndarray) -> np.ndarray:
    """Mean of the last (up to) 100 returns at each episode, per seed."""
    sums = np.cumsum(returns, axis=1, dtype=np.float64)
    n = np.arange(1, returns.shape[1] + 1)
    shifted = np.zeros_like(sums)
    shifted[:, SOLVED_WINDOW:] = sums[:, :-SOLVED_WINDOW]
    return (sums - shifted) / np.minimum(n, SOLVED_WINDOW)
