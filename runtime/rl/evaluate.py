"""Running a trained policy without learning: MyCaffe's ``Test``/``Run`` for a PG trainer.

``evaluate`` plays ``episodes`` episodes side by side in one jitted rollout (the same
:func:`~caffe2jax.runtime.rl.rollout.rollout` as training, so the difference input and the
stale observation apply as configured) and reports each episode's return. ``greedy`` takes the
most probable action (Sigmoid: action 0 when P(action 0) ≥ 0.5); otherwise actions are drawn
as MyCaffe's ``Brain.act`` draws them. MyCaffe's gym has no step cap, so an episode of an
uncapped env stops after ``TEST_HORIZON`` steps unless a horizon is given.

:func:`play_states` replays one episode step by step and returns the Cart-Pole states, for
:mod:`.render`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.lowering.graph import Params
from caffe2jax.runtime.rl.policy import SIGMOID, RLError
from caffe2jax.runtime.rl.rollout import RolloutOptions, new_lanes, preprocess, rollout, sample

if TYPE_CHECKING:
    from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer

TEST_HORIZON = 10_000


class EvalResult(NamedTuple):
    """Each episode's return and length; ``truncated`` counts episodes stopped at the horizon."""

    returns: np.ndarray
    lengths: np.ndarray
    horizon: int
    truncated: int


def greedy_probs(kind: str, probs: jax.Array) -> jax.Array:
    """Probabilities that make MyCaffe's draw pick the most probable action for any ``u``."""
    if kind == SIGMOID:
        return (probs >= 0.5).astype(probs.dtype)
    return jax.nn.one_hot(jnp.argmax(probs, axis=-1), probs.shape[-1], dtype=probs.dtype)


def policy_fn(
    trainer: PolicyGradientTrainer, params: Params, state: Params, greedy: bool
) -> Callable[[jax.Array], jax.Array]:
    kind = trainer.policy.spec.kind

    def act(x: jax.Array) -> jax.Array:
        probs = trainer.policy.forward(params, state, x)[0]
        return greedy_probs(kind, probs) if greedy else probs

    return act


def horizon_for_test(trainer: PolicyGradientTrainer, horizon: int | None = None) -> int:
    if trainer.env is None:
        raise RLError(
            "rl --test runs the JAX environments (cartpole*, gymnax:<id>), "
            f"not '{trainer.config.env}'"
        )
    if horizon is not None:
        return horizon
    return trainer.config.horizon or TEST_HORIZON


def evaluate(
    trainer: PolicyGradientTrainer,
    params: Params,
    state: Params,
    episodes: int = 100,
    greedy: bool = True,
    seed: int = 0,
    horizon: int | None = None,
) -> EvalResult:
    """Play ``episodes`` episodes with the policy; no learning, no exploration."""
    limit = horizon_for_test(trainer, horizon)
    cfg = trainer.config
    opts = RolloutOptions(limit, cfg.chunk, "mask", cfg.difference_input, cfg.stale_observation)
    kind = trainer.policy.spec.kind

    @jax.jit
    def play(params: Params, state: Params, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        act = policy_fn(trainer, params, state, greedy)
        traj, _ = rollout(trainer.env, opts, kind, act, key, new_lanes(episodes, obs_size))
        return jnp.sum(traj.rewards, axis=0), jnp.sum(traj.mask, axis=0)

    obs_size = trainer.policy.obs_size
    returns, lengths = play(params, state, jax.random.key(seed))
    lengths = np.asarray(lengths).astype(np.int64)
    return EvalResult(np.asarray(returns), lengths, limit, int(np.sum(lengths >= limit)))


def play_states(
    trainer: PolicyGradientTrainer,
    params: Params,
    state: Params,
    greedy: bool = True,
    seed: int = 0,
    max_steps: int = 500,
) -> np.ndarray:
    """One episode's Cart-Pole states ``(steps + 1, 4)``: x, x_dot, theta, theta_dot."""
    env, cfg, kind = trainer.env, trainer.config, trainer.policy.spec.kind
    horizon_for_test(trainer)
    act = policy_fn(trainer, params, state, greedy)

    @jax.jit
    def one(env_state, seen, true_obs, lanes, key):
        x, lanes = preprocess(seen[None], lanes, jnp.ones((1,), jnp.bool_), cfg.difference_input)
        action = sample(kind, act(x), jax.random.uniform(key, (1,)))[0]
        tr = env.step(env_state, action)
        seen = true_obs if cfg.stale_observation else tr.obs
        return tr.state, seen, tr.obs, lanes, tr.done

    key = jax.random.key(seed)
    env_state, obs = env.reset(jax.random.fold_in(key, 0))
    seen, true_obs, lanes = obs, obs, new_lanes(1, trainer.policy.obs_size)
    states = [np.asarray(obs)]
    for t in range(max_steps):
        env_state, seen, true_obs, lanes, done = one(
            env_state, seen, true_obs, lanes, jax.random.fold_in(key, t + 1)
        )
        states.append(np.asarray(true_obs))
        if bool(done):
            break
    return np.stack(states)
