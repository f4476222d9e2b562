"""Pong training with the emulators stepped inside the compiled rollout (``ale_rollout:
"program"``: ale-py's XLA custom calls, or io_callbacks) against the per-step calls
(``"steps"``), the NumPy pg-pong loop and the emulators alone: frames/s, alternating rounds,
medians (issue 39 item 4).

    python benchmarks/rl_pong_program.py                 # 8 emulators, batches of 10, 3 rounds
    python benchmarks/rl_pong_program.py --n 8 --batch 10 --rounds 5 --chunk 256
    python benchmarks/rl_pong_program.py --no-callbacks    # without the io_callback side

Each round times, in turn:

* ffi: ``PolicyGradientTrainer.train_batch`` with ``ale_rollout: "program"``
  (runtime/rl/ale_ffi.py): the batch's episodes as XLA calls of ``rollout_chunk`` agent
  steps, each a ``lax.scan`` whose step preprocesses, runs the policy, draws the actions and
  steps ale-py's vector env through its XLA FFI custom calls (the lanes' bookkeeping and
  sticky actions on the device); then the rule and RMSProp;
* callbacks: the same program with the emulators stepped through ordered ``io_callback``s
  (runtime/rl/ale_program.py, what ``"program"`` runs with an ale-py without custom calls);
* steps: the same with ``ale_rollout: "steps"`` (runtime/rl/ale_loop.py: one jitted call per
  agent step, two emulator groups overlapped). Same seed and state: the same episodes as the
  program side (tests/runtime/rl/test_ale_program.py), so the same frames;
* NumPy pg-pong: benchmarks/rl_pong.py's NumpyPong (Karpathy's loop batched over the same
  emulators, one OpenBLAS thread);
* emulators alone: the same emulators with random actions and nothing else (the ceiling),
  for as long as the ffi side took.

Compilation is done before the rounds (one batch of each side, the update for the likely
length buckets). Frames are emulator frames (agent steps × 4).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads OpenBLAS

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rl_pong import FRAMESKIP, SEED, SOLVER, NumpyPong, warm  # noqa: E402

from caffe2jax.runtime.rl import PolicyGradientTrainer  # noqa: E402
from caffe2jax.runtime.rl.ale_env import AleEnvs  # noqa: E402
from caffe2jax.runtime.rl.ale_program import AleProgram  # noqa: E402


def trainer(n: int, batch: int, rollout: str, chunk: int) -> PolicyGradientTrainer:
    """``rollout``: "ffi" (``ale_rollout: "program"`` with ale-py's custom calls), "callbacks"
    (the program through io_callbacks) or "steps"."""
    t = PolicyGradientTrainer(SOLVER, seed=SEED, num_envs=n, batch_size=batch,
                              ale_rollout="steps" if rollout == "steps" else "program",
                              rollout_chunk=chunk)  # fmt: skip
    if rollout == "callbacks":
        t.driver = AleProgram(t)
    return t


class Side:
    """One trainer, its state carried from round to round."""

    def __init__(self, t: PolicyGradientTrainer):
        self.t, self.ts = t, warm(t)

    def __call__(self) -> tuple[int, float]:
        start = time.perf_counter()
        self.ts, metrics = self.t.train_batch(self.ts)
        jax.block_until_ready(self.ts.params)
        return int(metrics.steps) * FRAMESKIP, time.perf_counter() - start


def numpy_side(settings, batch: int):
    peer = NumpyPong(settings, batch, SEED)

    def run() -> tuple[int, float]:
        start = time.perf_counter()
        steps = peer.train_batch()
        return steps * FRAMESKIP, time.perf_counter() - start

    return run


def emulators_side(settings, seconds: list[float]):
    envs, rng = AleEnvs(settings), np.random.default_rng(0)
    envs.reset(0)
    n = settings.num_envs

    def run() -> tuple[int, float]:
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds[-1]:
            _, _, ended = envs.step(0, rng.integers(0, 2, n), rng.random((n, FRAMESKIP)))
            if ended.any():
                envs.reset(0, ended)
            steps += n
        return steps * FRAMESKIP, time.perf_counter() - start

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8, help="emulators")
    ap.add_argument("--batch", type=int, default=10, help="episodes per update")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=1024, help="rollout_chunk (agent steps)")
    ap.add_argument("--no-callbacks", action="store_true", help="leave out the callbacks side")
    a = ap.parse_args()
    ffi = Side(trainer(a.n, a.batch, "ffi", a.chunk))
    program = None if a.no_callbacks else Side(trainer(a.n, a.batch, "callbacks", a.chunk))
    steps = Side(trainer(a.n, a.batch, "steps", a.chunk))
    plain = ffi.t.config.ale_settings()
    settings = type(plain)(**{**plain.__dict__, "overlap": False})
    seconds = [10.0]
    sides = {"ffi": ffi, "callbacks": program, "steps": steps,
             "NumPy pg-pong": numpy_side(settings, a.batch),
             "emulators alone": emulators_side(settings, seconds)}  # fmt: skip
    if a.no_callbacks:
        del sides["callbacks"]
    rates: dict[str, list[float]] = {name: [] for name in sides}
    loads = [os.getloadavg()[0]]
    for _ in range(a.rounds):
        for name, side in sides.items():
            frames, took = side()
            if name == "ffi":
                seconds.append(took)
            rates[name].append(frames / took)
        loads.append(os.getloadavg()[0])
    print(f"# {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), load "
          f"average {min(loads):.1f}-{max(loads):.1f}, JAX {jax.__version__}, {a.n} emulators, "
          f"batches of {a.batch} episodes, rollout_chunk {a.chunk}, {a.rounds} rounds")  # fmt: skip
    med = {name: statistics.median(r) for name, r in rates.items()}
    for name, r in rates.items():
        cells = ", ".join(f"{v:,.0f}" for v in r)
        print(f"{name:16s} {med[name]:8,.0f} frames/s (rounds: {cells}); "
              f"{med[name] / med['NumPy pg-pong']:.2f}x NumPy, "
              f"{med[name] / med['emulators alone']:.2f}x the emulators alone")  # fmt: skip
    for a_, b_ in (("ffi", "steps"), ("ffi", "callbacks"), ("callbacks", "steps")):
        if a_ in med and b_ in med:
            print(f"{a_} / {b_}: {med[a_] / med[b_]:.2f}x")


if __name__ == "__main__":
    main()
