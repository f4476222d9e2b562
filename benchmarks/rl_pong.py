"""Frames/s of the whole Pong trainer (emulation + policy + update): caffe2jax vs NumPy pg-pong.

    python benchmarks/rl_pong.py                    # 1, 8 and 32 emulators, ~10 min on 2 cores
    python benchmarks/rl_pong.py --ns 1,8 --batches 1   # shorter

Both sides train Karpathy's Pong policy (examples/rl/pong_karpathy_solver.prototxt: 80×80
difference frame -> 200 ReLU -> 1 Sigmoid, no biases; RMSProp lr 1e-4, decay 0.99, eps 1e-5;
gamma 0.99 with the return restarted at every point; one update per batch of episodes) from
scratch on the same emulators: runtime/rl/ale_env.py's AleEnvs over ale-py's AtariVectorEnv
(ALE/Pong-v5: frameskip 4, sticky actions 0.25), the same lanes (an emulator takes the batch's
next episode when its last one ends), the same per-episode sticky-action generators.

* caffe2jax: PolicyGradientTrainer.train_batch — each step one jitted call (preprocessing,
  forward for every emulator, action draw), with the emulators of one half stepping while
  the other half's forward runs (``overlap``; the "no overlap" rows turn it off); the batch's
  rule and RMSProp update as one jitted program. Compilation is done before the clock starts.
* NumPy: Karpathy's pg-pong.py shape, batched over the emulators — NumPy preprocessing and
  forward (float32) per step, the episode's backward when it ends (from the stored hidden
  activations), gradients summed, RMSProp every ``batch`` episodes.

NumPy's matrix products run on one OpenBLAS thread (``OPENBLAS_NUM_THREADS=1``, set here unless
given): on the shared 2-core machine its default two spinning threads, competing with the
emulator threads, made the same loop several times slower (docs/performance.md).

The batch is max(10, emulators) episodes. Frames are the emulator frames of the batch's
episodes (agent steps × 4); an emulator that idles at the end of a batch is not counted. The
"emulators alone" rows step the same emulators with random actions and nothing else: the
ceiling. Each side trains for the same number of batches; the table prints frames/s and the
ratio caffe2jax / NumPy per emulator count.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads OpenBLAS

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from caffe2jax.runtime.rl import PolicyGradientTrainer, ale_loop  # noqa: E402
from caffe2jax.runtime.rl.ale_env import AleEnvs, sticky_generator  # noqa: E402
from caffe2jax.runtime.rl.pixels import BACKGROUND  # noqa: E402

SOLVER = Path(__file__).resolve().parents[1] / "examples" / "rl" / "pong_karpathy_solver.prototxt"
FRAMESKIP = 4
SEED = 0


def trainer_for(n: int, batch: int, overlap: bool) -> PolicyGradientTrainer:
    return PolicyGradientTrainer(SOLVER, seed=SEED, num_envs=n, batch_size=batch, overlap=overlap)


def warm(trainer: PolicyGradientTrainer) -> object:
    """One batch (compiles the step), and the update for every likely length bucket."""
    ts = trainer.init()
    ts, _ = trainer.train_batch(ts)
    for length in (640, 768, 896, 1024, 1280, 1536, 1792, 2048):
        traj = ale_loop.trajectory(_dummy(trainer.config.batch_size, length), 1)
        jax.block_until_ready(trainer.learn(ts.params, ts.state, ts.opt_state, traj))
    return ts


def _dummy(batch: int, length: int) -> ale_loop.Played:
    row = np.zeros((2, 800), np.uint8)
    return ale_loop.Played(
        [[row] * length for _ in range(batch)],
        [[0] * length for _ in range(batch)],
        [[np.zeros(1, np.float32)] * length for _ in range(batch)],
        [[0.0] * length for _ in range(batch)],
    )


def run_ours(n: int, batch: int, batches: int, overlap: bool) -> tuple[int, float]:
    trainer = trainer_for(n, batch, overlap)
    ts = warm(trainer)
    steps, start = 0, time.perf_counter()
    for _ in range(batches):
        ts, metrics = trainer.train_batch(ts)
        steps += int(metrics.steps)
    jax.block_until_ready(ts.params)
    seconds = time.perf_counter() - start
    trainer.ale.close()
    return steps * FRAMESKIP, seconds


class NumpyPong:
    """Karpathy's pg-pong.py over ``n`` emulators at once, in NumPy float32."""

    H, D = 200, 6400

    def __init__(self, settings, batch: int, seed: int):
        self.envs, self.batch, self.n = AleEnvs(settings), batch, settings.num_envs
        rng = np.random.default_rng(seed)
        self.w1 = (rng.standard_normal((self.H, self.D)) / np.sqrt(self.D)).astype(np.float32)
        self.w2 = (rng.standard_normal(self.H) / np.sqrt(self.H)).astype(np.float32)
        self.cache = [np.zeros_like(self.w1), np.zeros_like(self.w2)]
        self.draw = np.random.default_rng(seed + 1)
        self.first = 0

    @staticmethod
    def prepro(red: np.ndarray) -> np.ndarray:
        """pg-pong's prepro after the crop and stride: erase 144 and 109, the rest to 1."""
        keep = (red != 0) & (red != BACKGROUND[0]) & (red != BACKGROUND[1])
        return keep.reshape(len(red), -1).astype(np.float32)

    def backward(self, xs, hs, dlogps, rewards) -> tuple[np.ndarray, np.ndarray]:
        """One episode's gradient (pg-pong's discount_rewards with the reset, standardise,
        policy_backward)."""
        r = np.asarray(rewards, np.float32)
        out, running = np.zeros_like(r), 0.0
        for t in reversed(range(len(r))):
            running = 0.0 if r[t] != 0 else running
            running = running * 0.99 + r[t]
            out[t] = running
        out -= out.mean()
        out /= out.std() if out.std() else 1.0
        eph, epx = np.stack(hs), np.stack(xs).astype(np.float32)
        epdlogp = np.asarray(dlogps, np.float32) * out
        dw2 = eph.T @ epdlogp
        dh = np.outer(epdlogp, self.w2)
        dh[eph <= 0] = 0
        return dh.T @ epx, dw2

    def update(self, grads) -> None:
        for i, (w, g) in enumerate(zip((self.w1, self.w2), grads)):
            self.cache[i] = 0.99 * self.cache[i] + 0.01 * g * g
            w += 1e-4 * g / (np.sqrt(self.cache[i]) + 1e-5)

    def train_batch(self) -> int:
        """``batch`` episodes, their gradients summed, one RMSProp step: the agent steps."""
        n, envs = self.n, self.envs
        episode, nxt = np.arange(n), n
        gens = [sticky_generator(SEED, self.first + e) for e in episode]
        mem = [([], [], [], []) for _ in range(n)]
        red = envs.reset(0)
        prev, has_prev = np.zeros((n, self.D), np.float32), np.zeros(n, np.bool_)
        grads, steps = [np.zeros_like(self.w1), np.zeros_like(self.w2)], 0
        while (episode >= 0).any():
            cur = self.prepro(red)
            x = np.where(has_prev[:, None], cur - prev, 0.0).astype(np.float32)
            prev, has_prev = cur, np.ones(n, np.bool_)
            h = np.maximum(x @ self.w1.T, 0)
            p = 1 / (1 + np.exp(-(h @ self.w2)))
            action = (self.draw.random(n) >= p).astype(np.int32)  # 0 (up) with probability p
            sticky = np.stack(
                [np.ones(FRAMESKIP) if g is None else g.random(FRAMESKIP) for g in gens]
            )
            red, reward, ended = envs.step(0, action, sticky)
            for i in np.flatnonzero(episode >= 0):
                for store, value in zip(
                    mem[i], (x[i].astype(np.int8), h[i], float(action[i] == 0) - p[i], reward[i])
                ):
                    store.append(value)  # fmt: skip
                steps += 1
                if ended[i]:
                    for g, d in zip(grads, self.backward(*mem[i])):
                        g += d
                    mem[i] = ([], [], [], [])
                    episode[i] = nxt if nxt < self.batch else -1
                    gens[i] = sticky_generator(SEED, self.first + nxt) if nxt < self.batch else None
                    nxt += 1
            if ended.any():
                red = np.where(ended[:, None, None], envs.reset(0, ended), red)
                has_prev[ended] = False
        self.update(grads)
        self.first += self.batch
        return steps


def run_numpy(n: int, batch: int, batches: int) -> tuple[int, float]:
    settings = trainer_for(n, batch, False).config.ale_settings()
    peer = NumpyPong(settings, batch, SEED)
    steps, start = 0, time.perf_counter()
    for _ in range(batches):
        steps += peer.train_batch()
    seconds = time.perf_counter() - start
    peer.envs.close()
    return steps * FRAMESKIP, seconds


def run_emulators(n: int, seconds: float = 10.0) -> tuple[int, float]:
    """The same emulators with random actions, nothing else."""
    settings = trainer_for(n, max(10, n), False).config.ale_settings()
    envs, rng = AleEnvs(settings), np.random.default_rng(0)
    envs.reset(0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, ended = envs.step(0, rng.integers(0, 2, n), rng.random((n, FRAMESKIP)))
        if ended.any():
            envs.reset(0, ended)
        steps += n
    elapsed = time.perf_counter() - start
    envs.close()
    return steps * FRAMESKIP, elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="1,8,32", help="emulator counts")
    ap.add_argument("--batches", type=int, default=2, help="timed batches per row")
    args = ap.parse_args()
    cpu = platform.processor() or platform.machine()
    print(f"# {os.cpu_count()} CPUs ({cpu}), load average {os.getloadavg()[0]:.1f}, JAX "
          f"{jax.__version__} on {jax.devices()[0].platform}, OPENBLAS_NUM_THREADS="
          f"{os.environ['OPENBLAS_NUM_THREADS']}")  # fmt: skip
    print(
        "| emulators | batch | emulators alone (frames/s) | caffe2jax (frames/s) | caffe2jax, no "
        "overlap | NumPy pg-pong (frames/s) | caffe2jax / NumPy |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in (int(v) for v in args.ns.split(",")):
        batch = max(10, n)
        alone = run_emulators(n)
        ours = run_ours(n, batch, args.batches, True)
        plain = run_ours(n, batch, args.batches, False) if n >= 2 else ours
        peer = run_numpy(n, batch, args.batches)
        rate = [f / s for f, s in (alone, ours, plain, peer)]
        plain_cell = f"{rate[2]:,.0f}" if n >= 2 else "(one emulator)"
        print(f"| {n} | {batch} | {rate[0]:,.0f} | {rate[1]:,.0f} | {plain_cell} | "
              f"{rate[3]:,.0f} | {rate[1] / rate[3]:.2f}× |", flush=True)  # fmt: skip


if __name__ == "__main__":
    jnp.zeros(())  # start the backend before the clocks
    main()
