"""The TRPO update in one compiled program vs the same update with its loops in Python.

    python benchmarks/rl_trpo.py            # about a minute on 2 CPU cores
    python benchmarks/rl_trpo.py --quick    # fewer repeats, for a smoke test

TensorForce 0.3's comparison: its ``NaturalGradient`` and ``OptimizedStep`` ran the
conjugate-gradient solve and the line search as graph loops, where other TRPO implementations
(Schulman's modular_rl, OpenAI baselines) ran them in Python, calling the graph for every
Fisher-vector product and every trial step. Both sides here do the same arithmetic on the
same batch of episodes:

* in-program: the trainer's learning step for ``examples/rl/cartpole_trpo_solver.prototxt``
  (:meth:`PolicyGradientTrainer.learn`, jitted): advantage, gradient, CG as a
  ``lax.while_loop``, step length, line search as a ``lax.while_loop``, one XLA program;
* Python loops: the same pieces compiled apart — the advantage and gradient, one
  Fisher-vector product, the surrogate and KL of a trial step — with modular_rl's ``cg`` and
  ``linesearch`` loops in Python over flat NumPy vectors, each iteration one call into XLA.

The batch is 10 Cart-Pole-v1 episodes played by a policy trained with the example for 300
episodes (so the episodes are long), padded to the 500-step horizon. Reported: median
seconds per update over the repeats (compilation excluded), the ratio, and that both sides
reach the same params.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from caffe2jax.runtime.rl import PolicyGradientTrainer, rule
from caffe2jax.runtime.rl import rollout as ro
from caffe2jax.runtime.rl import surrogate as sur

SOLVER = Path(__file__).resolve().parents[1] / "examples" / "rl" / "cartpole_trpo_solver.prototxt"


def batch(trainer: PolicyGradientTrainer, warm_episodes: int) -> tuple:
    """Params after ``warm_episodes`` of training and one fresh batch played with them."""
    ts = trainer.run(episodes=warm_episodes, target=1e9).state
    act = trainer.driver.policy_fn(ts.params, ts.state)
    traj, _ = ro.rollout(trainer.env, trainer.rollout_options, trainer.policy.spec.kind, act,
                         jax.random.key(11), ts.lanes)  # fmt: skip
    return ts, traj


def python_pieces(trainer: PolicyGradientTrainer, ts, traj) -> dict:
    """The compiled pieces the Python loops call, over flat parameter vectors."""
    s, sig = trainer.config.update, trainer.policy.spec.kind == "sigmoid"
    flat0, unravel = ravel_pytree(ts.params)
    probs_of = trainer.learning.probs_fn(ts.state, traj)
    returns = rule.discounted_returns(traj.rewards, traj.mask, trainer.config.gamma)
    adv = rule.standardize(returns, traj.mask)
    old = probs_of(ts.params)
    logp_old = sur.log_prob(old, traj.actions, sig)

    def objective(flat):
        new = probs_of(unravel(flat))
        value = sur.surrogate(sur.log_prob(new, traj.actions, sig), logp_old, adv, traj.mask)
        return value, sur.mean_kl(old, new, traj.mask, sig)

    def fvp(v):
        kl_of = lambda f: objective(f)[1]  # noqa: E731
        return jax.jvp(jax.grad(kl_of), (flat0,), (v,))[1] + s.cg_damping * v

    return {
        "flat0": np.asarray(flat0),
        "unravel": unravel,
        "grad": jax.jit(lambda f: jax.grad(lambda x: objective(x)[0])(f)),
        "fvp": jax.jit(fvp),
        "objective": jax.jit(objective),
    }


def cg_python(fvp, b: np.ndarray, iterations: int, residual_tol: float = 1e-10) -> np.ndarray:
    """modular_rl's ``cg``: each iteration one call of the compiled Fisher-vector product."""
    p, r, x = b.copy(), b.copy(), np.zeros_like(b)
    rdotr = r @ r
    for _ in range(iterations):
        z = np.asarray(fvp(p))
        v = rdotr / (p @ z)
        x += v * p
        r -= v * z
        new = r @ r
        p = r + new / rdotr * p
        rdotr = new
        if rdotr < residual_tol:
            break
    return x


def trpo_python(pieces: dict, s) -> np.ndarray:
    """One TRPO update with the CG and the line search as Python loops."""
    x0 = pieces["flat0"]
    g = np.asarray(pieces["grad"](x0))
    x = cg_python(pieces["fvp"], g, s.cg_iterations)
    shs = 0.5 * x @ np.asarray(pieces["fvp"](x))
    step = x * np.sqrt(s.max_kl / shs) if shs > 0 else np.zeros_like(x)
    expected = g @ step
    before = float(pieces["objective"](x0)[0])
    for k in range(s.line_search_steps):
        m = s.backtrack**k
        value, kl = pieces["objective"](x0 + m * step)
        actual = float(value) - before
        if actual > 0 and actual >= s.accept_ratio * expected * m and kl <= s.kl_factor * s.max_kl:
            return x0 + m * step
    return x0


def timed(fn, repeats: int) -> tuple[float, object]:
    out = fn()  # compile / warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        jax.block_until_ready(out)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    repeats = 5 if args.quick else 30
    trainer = PolicyGradientTrainer(SOLVER, seed=0)
    ts, traj = batch(trainer, 100 if args.quick else 300)
    steps = int(jnp.sum(traj.mask))
    s = trainer.config.update
    program, (params, _) = timed(
        lambda: trainer.learn(ts.params, ts.state, ts.opt_state, traj), repeats
    )
    pieces = python_pieces(trainer, ts, traj)
    loops, flat = timed(lambda: trpo_python(pieces, s), repeats)
    same = np.allclose(np.asarray(ravel_pytree(params)[0]), flat, rtol=1e-4, atol=1e-6)
    print(f"TRPO update on {steps} real steps (10 episodes, horizon 500), {jax.devices()[0]}")
    print(f"  one program (CG + line search in XLA loops): {program * 1e3:8.2f} ms")
    print(f"  Python loops calling compiled pieces:        {loops * 1e3:8.2f} ms")
    print(f"  ratio (Python loops / one program):          {loops / program:8.2f}x")
    print(f"  same params: {same}")


if __name__ == "__main__":
    main()
