"""Pong rollouts as ONE XLA call: the emulators stepped from inside ``lax.scan`` by
``jax.experimental.io_callback``, against today's loop (one jitted call per step) and the
emulators alone. A measurement of issue 39 item 4's design, not yet the trainer's driver.

    python benchmarks/rl_pong_program.py              # 8 emulators, 300 agent steps, 3 rounds
    python benchmarks/rl_pong_program.py --n 8 --steps 200 --rounds 2

Three sides play Karpathy's policy (examples/rl/pong_karpathy_solver.prototxt, untrained,
seed 0) on ale-py 0.12's ``AtariVectorEnv`` (runtime/rl/ale_env.py's AleEnvs: ALE/Pong-v5,
frameskip 4, sticky actions 0.25 drawn here), ``n`` emulators, ``steps`` agent steps each:

* in-program: one ``jax.jit`` of a ``lax.scan`` over the steps; each step preprocesses the
  screens (runtime/rl/pixels.py), runs the policy for every emulator, draws the actions and
  calls the emulators through an ordered ``io_callback`` (one vector-env step, the ended
  lanes reset), storing the packed inputs, actions, probabilities, rewards and ends — the
  whole batch one XLA call;
* per-step calls: the trainer's Atari loop (runtime/rl/ale_loop.py ``AleLoop.play``, with its
  overlap of two emulator groups), ``n`` episodes cut at ``steps`` steps: the same work;
* emulators alone: the same emulators with random actions, nothing else (the ceiling).

Frames are emulator frames (agent steps × 4). Rounds alternate the sides; medians reported.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

from caffe2jax.runtime.rl import PolicyGradientTrainer, pixels
from caffe2jax.runtime.rl.ale_env import AleEnvs
from caffe2jax.runtime.rl.rollout import sample

SOLVER = Path(__file__).resolve().parents[1] / "examples" / "rl" / "pong_karpathy_solver.prototxt"
FRAMESKIP = 4


class HostEnvs:
    """The emulators as the program's callback sees them: one step for every lane, ended
    lanes reset at once (their next screen is the new episode's first)."""

    def __init__(self, envs: AleEnvs, seed: int):
        self.envs, self.rng = envs, np.random.default_rng(seed)
        self.first = envs.reset(0)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(action)
        red, reward, ended = self.envs.step(0, np.asarray(action), self.rng.random((n, FRAMESKIP)))
        if ended.any():
            red = np.where(ended[:, None, None], self.envs.reset(0, ended), red)
        return red, reward, ended


def program(trainer: PolicyGradientTrainer, host: HostEnvs, steps: int):
    """The jitted rollout: ``(params, state, key) -> (stored inputs, actions, probs, rewards,
    ends)``, time-major, one XLA call."""
    policy, n = trainer.policy, trainer.config.num_envs
    shapes = (
        jax.ShapeDtypeStruct((n, pixels.SIZE, pixels.SIZE), jnp.uint8),
        jax.ShapeDtypeStruct((n,), jnp.float32),
        jax.ShapeDtypeStruct((n,), jnp.bool_),
    )

    def body(carry, i):
        params, state, key, red, prev, has_prev = carry
        cur = pixels.binarise(red).reshape(n, -1)
        x = pixels.difference(cur, prev, has_prev)
        probs = policy.forward(params, state, x)[0]
        u = jax.random.uniform(jax.random.fold_in(key, i), (n,))
        action = sample(policy.spec.kind, probs, u)
        red, reward, ended = io_callback(host.step, shapes, action, ordered=True)
        out = (pixels.pack_difference(x), action, probs, reward, ended)
        return (params, state, key, red, cur, ~ended), out

    def run(params, state, key, red):
        prev = jnp.zeros((n, pixels.SIZE * pixels.SIZE), jnp.float32)
        init = (params, state, key, red, prev, jnp.zeros((n,), jnp.bool_))
        return lax.scan(body, init, jnp.arange(steps))[1]

    return jax.jit(run)


def time_program(trainer, host, run, ts, steps: int) -> float:
    start = time.perf_counter()
    out = run(ts.params, ts.state, ts.key, host.first)
    jax.block_until_ready(out)
    host.first = host.envs.reset(0)
    return steps * trainer.config.num_envs * FRAMESKIP / (time.perf_counter() - start)


def time_loop(loop_trainer, ts, steps: int) -> float:
    n = loop_trainer.config.num_envs
    start = time.perf_counter()
    played = loop_trainer.driver.play(ts.params, ts.state, ts.key, 0, n)
    frames = int(played.steps.sum()) * FRAMESKIP
    assert frames <= steps * n * FRAMESKIP
    return frames / (time.perf_counter() - start)


def time_emulators(envs: AleEnvs, steps: int) -> float:
    n, rng = envs.settings.num_envs, np.random.default_rng(1)
    envs.reset(0)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, ended = envs.step(0, rng.integers(0, 2, n), rng.random((n, FRAMESKIP)))
        if ended.any():
            envs.reset(0, ended)
    return steps * n * FRAMESKIP / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    one = PolicyGradientTrainer(SOLVER, seed=0, num_envs=a.n, batch_size=a.n, overlap=False)
    loop = PolicyGradientTrainer(SOLVER, seed=0, num_envs=a.n, batch_size=a.n, horizon=a.steps)
    ts = one.init()
    host = HostEnvs(one.ale, 0)
    run = program(one, host, a.steps)
    alone = AleEnvs(one.config.ale_settings())
    time_program(one, host, run, ts, a.steps)  # compile
    time_loop(loop, ts, a.steps)  # compile
    rows: dict[str, list[float]] = {"in-program": [], "per-step calls": [], "emulators": []}
    for _ in range(a.rounds):
        rows["in-program"].append(time_program(one, host, run, ts, a.steps))
        rows["per-step calls"].append(time_loop(loop, ts, a.steps))
        rows["emulators"].append(time_emulators(alone, a.steps))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {load:.1f},"
        f" jax {jax.__version__}, {a.n} emulators, {a.steps} agent steps, {a.rounds} rounds"
    )
    ceiling = statistics.median(rows["emulators"])
    for name, values in rows.items():
        m = statistics.median(values)
        print(f"{name:15s} {m:8.0f} frames/s  ({m / ceiling:.2f}× the emulators alone)")


if __name__ == "__main__":
    main()
