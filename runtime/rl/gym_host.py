"""Run any Gymnasium environment with a discrete action space through a host-side loop.

``HostEnv`` keeps ``num_envs`` independent copies of ``gymnasium.make(env_id)`` (so each copy
carries the registered wrappers, ``TimeLimit`` included) and steps them one after another in
Python, presenting the batched interface the RL trainer uses for the JAX environments in
:mod:`caffe2jax.runtime.rl.envs`.

Auto-reset semantics ("same step", like :func:`caffe2jax.runtime.rl.envs.step_autoreset`):
when a copy's episode ends in :meth:`HostEnv.step` (terminated or truncated), that copy is reset
at once and the row of the returned ``obs`` is the first observation of its new episode. The
reward and flags returned belong to the finished step, and the observation the episode ended on
is kept in :attr:`HostEnv.final_obs`. Copy ``i`` is seeded with ``seed + i`` on the first
:meth:`HostEnv.reset`; later resets continue each copy's own random stream.

Gymnasium is an optional dependency: ``pip install caffe2jax[rl]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

GYM_PREFIX = "gym:"


def _import_gymnasium() -> Any:
    try:
        import gymnasium
    except ImportError as exc:
        raise ImportError(
            "Gymnasium environments need the optional 'gymnasium' package; "
            "install it with: pip install caffe2jax[rl]"
        ) from exc
    return gymnasium


def strip_gym_prefix(env_id: str) -> str:
    """``"gym:CartPole-v1"`` -> ``"CartPole-v1"``; ids without the prefix pass unchanged."""
    return env_id[len(GYM_PREFIX) :] if env_id.startswith(GYM_PREFIX) else env_id


def _make_one(gym: Any, env_id: str) -> Any:
    try:
        return gym.make(env_id)
    except gym.error.UnregisteredEnv as exc:
        raise ValueError(f"unknown Gymnasium environment id {env_id!r}: {exc}") from exc
    except gym.error.Error as exc:
        raise ValueError(f"cannot create Gymnasium environment {env_id!r}: {exc}") from exc


def _check_spaces(gym: Any, env_id: str, env: Any) -> None:
    if not isinstance(env.action_space, gym.spaces.Discrete):
        env.close()
        raise ValueError(
            f"Gymnasium environment {env_id!r} has action space {env.action_space}; "
            "the policy-gradient trainer needs a Discrete action space"
        )
    if env.observation_space.shape is None:
        env.close()
        raise ValueError(
            f"Gymnasium environment {env_id!r} has observation space "
            f"{env.observation_space} without a fixed shape"
        )


class HostEnv:
    """``num_envs`` copies of a Gymnasium environment, stepped on the host with auto-reset."""

    def __init__(self, env_id: str, num_envs: int = 1, seed: int = 0) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        gym = _import_gymnasium()
        self.env_id = strip_gym_prefix(env_id)
        self.num_envs = num_envs
        self.seed = seed
        first = _make_one(gym, self.env_id)
        _check_spaces(gym, self.env_id, first)
        self._envs = [first] + [gym.make(self.env_id) for _ in range(num_envs - 1)]
        space = first.observation_space
        self.obs_shape: tuple[int, ...] = tuple(space.shape)
        self.obs_dtype = np.dtype(space.dtype) if space.dtype is not None else np.dtype("f4")
        self.num_actions: int = int(first.action_space.n)
        self._action_start = int(first.action_space.start)
        self._started = False
        self.final_obs: np.ndarray | None = None

    def _reset_one(self, i: int) -> np.ndarray:
        seed = None if self._started else self.seed + i
        obs, _ = self._envs[i].reset(seed=seed)
        return np.asarray(obs, self.obs_dtype)

    def reset(self) -> np.ndarray:
        """Reset every copy; returns ``obs`` of shape ``[num_envs, *obs_shape]``."""
        obs = np.stack([self._reset_one(i) for i in range(self.num_envs)])
        if not self._started:
            for i, env in enumerate(self._envs):
                env.action_space.seed(self.seed + i)
            self._started = True
        self.final_obs = None
        return obs

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step every copy with ``actions[i]`` in ``[0, num_actions)``; auto-resets ended ones.

        Returns ``(obs, reward, terminated, truncated)`` with shapes ``[num_envs, *obs_shape]``
        and ``[num_envs]`` (float32 reward, bool flags).
        """
        if not self._started:
            raise RuntimeError("HostEnv.step called before HostEnv.reset")
        acts = np.asarray(actions).reshape(-1)
        if acts.shape[0] != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {acts.shape[0]}")
        if np.any((acts < 0) | (acts >= self.num_actions)):
            raise ValueError(f"actions must lie in [0, {self.num_actions}), got {acts}")
        obs = np.empty((self.num_envs, *self.obs_shape), self.obs_dtype)
        final = np.empty_like(obs)
        reward = np.empty(self.num_envs, np.float32)
        terminated = np.empty(self.num_envs, np.bool_)
        truncated = np.empty(self.num_envs, np.bool_)
        for i, env in enumerate(self._envs):
            o, r, term, trunc, _ = env.step(int(acts[i]) + self._action_start)
            final[i] = o
            reward[i], terminated[i], truncated[i] = r, term, trunc
            obs[i] = self._reset_one(i) if (term or trunc) else o
        self.final_obs = final
        return obs, reward, terminated, truncated

    def close(self) -> None:
        """Close every copy."""
        for env in self._envs:
            env.close()

    def __enter__(self) -> HostEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
