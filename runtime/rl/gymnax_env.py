"""gymnax environments (``gymnax:<id>``: CartPole-v1, Acrobot-v1, MountainCar-v0, …) stepped
inside the jitted rollout like the built-in Cart-Poles. Needs the ``[rl]`` extra (gymnax).

:class:`GymnaxEnv` gives a gymnax env the interface :mod:`.rollout` uses (``reset``,
``step``, ``step_autoreset``, ``max_episode_steps``, ``num_actions``, ``obs_shape``): its
state carries gymnax's state, a PRNG key for gymnax's stochastic steps, the step count and a
sticky ``terminated``. gymnax's own ``step`` resets automatically; this adapter calls
``step_env`` and ``reset_env`` instead, so an episode ends as in Gymnasium: ``done`` is
gymnax's terminal flag, ``truncated`` its ``max_steps_in_episode`` limit, and a step taken
after termination pays 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from caffe2jax.runtime.rl.envs import Transition

PREFIX = "gymnax:"


class GymnaxState(NamedTuple):
    inner: Any
    key: jax.Array
    t: jax.Array
    terminated: jax.Array


@dataclass(frozen=True, eq=False)
class GymnaxEnv:
    """A gymnax env and its default params behind the built-in envs' interface."""

    name: str
    env: Any
    params: Any

    @property
    def num_actions(self) -> int:
        return int(self.env.num_actions)

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return tuple(self.env.observation_space(self.params).shape)

    @property
    def max_episode_steps(self) -> int:
        return int(self.params.max_steps_in_episode)

    def reset(self, key: jax.Array) -> tuple[GymnaxState, jax.Array]:
        k_reset, k_next = jax.random.split(key)
        obs, inner = self.env.reset_env(k_reset, self.params)
        zero = jnp.zeros((), jnp.int32)
        state = GymnaxState(inner, k_next, zero, jnp.zeros((), jnp.bool_))
        return state, obs.astype(jnp.float32).reshape(-1)

    def step(self, state: GymnaxState, action: Any) -> Transition:
        key, k_step = jax.random.split(state.key)
        obs, inner, reward, done, _ = self.env.step_env(k_step, state.inner, action, self.params)
        obs = obs.astype(jnp.float32).reshape(-1)
        t = state.t + 1
        truncated = t >= self.max_episode_steps
        terminated = done & ~truncated
        reward = jnp.where(state.terminated, 0.0, reward).astype(jnp.float32)
        new = GymnaxState(inner, key, t, state.terminated | terminated)
        return Transition(new, obs, reward, done | truncated, terminated, truncated, obs)

    def step_autoreset(self, state: GymnaxState, action: Any, key: jax.Array) -> Transition:
        tr = self.step(state, action)
        fresh_state, fresh_obs = self.reset(key)
        new_state = jax.tree.map(lambda a, b: jnp.where(tr.done, a, b), fresh_state, tr.state)
        return tr.replace(state=new_state, obs=jnp.where(tr.done, fresh_obs, tr.obs))


def make(name: str) -> GymnaxEnv:
    """``gymnax:<id>`` → the adapter; a one-line ValueError when gymnax or the id is missing."""
    env_id = name[len(PREFIX) :]
    try:
        import gymnax
    except ImportError:
        raise ValueError(
            f"'{name}' needs gymnax: pip install 'caffe2jax[rl]' (gymnax, six)"
        ) from None
    if env_id not in gymnax.registered_envs:
        raise ValueError(
            f"unknown gymnax environment '{env_id}'; gymnax has: "
            + ", ".join(gymnax.registered_envs[:12])
            + ", …"
        )
    env, params = gymnax.make(env_id)
    return GymnaxEnv(name, env, params)
