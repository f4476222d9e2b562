"""The slower path: the same learning rule with episodes stepped by a Gymnasium host loop.

``gym:<id>`` environments are not JAX functions, so each step goes to the host: the policy's
forward and MyCaffe's action draw run as one small jitted function over the ``batch_size``
lanes, :class:`~caffe2jax.runtime.rl.gym_host.HostEnv` steps each Gymnasium copy in Python,
and once every lane's episode has ended the padded trajectory goes through the same jitted
rule and solver update as the JAX path (:meth:`PolicyGradientTrainer.learn`). A lane whose
episode ended keeps being stepped (HostEnv resets it) but nothing more of it is recorded or
counted. Trajectories are padded to a power of two (at least 16 steps) so the update compiles
once per length bucket. Episodes end when Gymnasium says so (its TimeLimit), or after the
trainer's ``horizon`` steps when one is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.runtime.rl import rule
from caffe2jax.runtime.rl.gym_host import HostEnv
from caffe2jax.runtime.rl.policy import RLError
from caffe2jax.runtime.rl.rollout import Trajectory, explore, preprocess, sample
from caffe2jax.runtime.rl.state import BatchMetrics, PolicyState, episode_metrics

if TYPE_CHECKING:
    from caffe2jax.runtime.rl.config import RLConfig
    from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer


def open_env(config: RLConfig) -> HostEnv:
    """``batch_size`` copies of the Gymnasium env, with its ``reward_threshold`` attached."""
    try:
        host = HostEnv(config.env, num_envs=config.batch_size, seed=config.seed)
    except (ImportError, ValueError) as err:
        raise RLError(str(err)) from None
    import gymnasium

    spec = gymnasium.spec(host.env_id)
    host.reward_threshold = getattr(spec, "reward_threshold", None)
    return host


class HostLoop:
    """Drives a Gymnasium environment for a trainer (:class:`~.driver.EnvDriver`)."""

    def __init__(self, trainer: PolicyGradientTrainer):
        self.trainer = trainer
        self.act = jax.jit(self._act_fn())

    def _act_fn(self) -> Any:
        """``(params, state, seen, lanes, alive, key, first) -> (x, lanes, probs, action)``
        (``first``: the batch's first episode index, for PG.MT's ε schedule)."""
        policy, cfg = self.trainer.policy, self.trainer.config
        spec = policy.spec

        def act(params, state, seen, lanes, alive, key, first):
            x, lanes = preprocess(seen, lanes, alive, cfg.difference_input)
            probs = policy.forward(params, state, x)[0]
            u = jax.random.uniform(key, (seen.shape[0],), jnp.float32)
            action = sample(spec.kind, probs, u)
            if cfg.eps_steps > 0:
                index = first + jnp.arange(seen.shape[0], dtype=jnp.int32)
                eps = rule.epsilon(index, cfg.eps_steps, cfg.eps_start, cfg.eps_end)
                u_eps = jax.random.uniform(jax.random.fold_in(key, 1), (seen.shape[0], 2))
                probs, action = explore(spec.kind, probs, action, eps, u_eps)
            return x, lanes, probs, action

        return act

    def train_batch(self, ts: PolicyState) -> tuple[PolicyState, BatchMetrics]:
        """``batch_size`` Gymnasium episodes from the host, then the jitted rule and update."""
        key, k_play = jax.random.split(ts.key)
        record, lanes = _play(self.trainer, self.act, ts, k_play)
        length = _bucket(len(record["m"]))
        traj = Trajectory(*(_pad(record[k], length) for k in "xaprm"))
        params, opt_state = self.trainer.learn(ts.params, ts.state, ts.opt_state, traj)
        return PolicyState(params, ts.state, opt_state, key, lanes), episode_metrics(traj)


def _bucket(steps: int) -> int:
    return max(16, 1 << (steps - 1).bit_length())


def _pad(rows: list[np.ndarray], length: int) -> jax.Array:
    stacked = np.stack(rows)
    pad = np.zeros((length - stacked.shape[0], *stacked.shape[1:]), stacked.dtype)
    return jnp.asarray(np.concatenate([stacked, pad]))


def _play(trainer: PolicyGradientTrainer, act: Any, ts: PolicyState, key: jax.Array) -> tuple:
    """One episode per lane on the host: lists of per-step arrays and the new lane memory."""
    host, cfg = trainer.host, trainer.config
    true_obs = host.reset().reshape(cfg.batch_size, -1).astype(np.float32)
    seen, lanes = true_obs, ts.lanes
    first = lanes.episodes
    alive = np.ones(cfg.batch_size, np.bool_)
    record: dict[str, list[np.ndarray]] = {k: [] for k in ("x", "a", "p", "r", "m")}
    t = 0
    while alive.any():
        x, lanes, probs, action = act(
            ts.params,
            ts.state,
            jnp.asarray(seen),
            lanes,
            jnp.asarray(alive),
            jax.random.fold_in(key, t),
            first,
        )
        action = np.asarray(action)
        _, reward, terminated, truncated = host.step(action)
        final = host.final_obs.reshape(cfg.batch_size, -1).astype(np.float32)
        for k, v in zip("xaprm", (x, action, probs, reward * alive, alive)):
            record[k].append(np.asarray(v, np.int32 if k == "a" else np.float32))
        seen = true_obs if cfg.stale_observation else final
        true_obs = final
        t += 1
        alive &= ~(terminated | truncated) & (not cfg.horizon or t < cfg.horizon)
    return record, lanes.replace(episodes=first + cfg.batch_size)
