"""The trainer's settings: the solver's ``rl_param`` (RLParameter) resolved against the env.

A field the solver leaves unset takes the environment's value, so the same defaults serve
Gymnasium's Cart-Pole and MyCaffe's:

==========================  ==========================  ==================================
setting                     unset means                 MyCaffe's (paper's) value
==========================  ==========================  ==================================
``pole_angle_limit_deg``    the env's (12° v0/v1)       20° (``cartpole-mycaffe``)
``max_steps``               the env's cap (500 v1)      no cap (``cartpole-mycaffe``)
``difference_input``        on for cartpole-mycaffe     on (``UseRawInput`` false)
``stale_observation``       on for cartpole-mycaffe     on (CartPoleGym.Step's lag)
``normalize_by_length``     the MemoryLoss layer's      loss_param VALID: ÷ episode
                            normaliser                  length (set: true ÷ T, false ÷ 1)
``population_std``          true                        true (``Blob.std`` divides by T)
``batch_size``              MemoryData's batch_size     ``GetBatchSize(phase)`` episodes
``gamma``                   0.99                        0.99 (property ``Gamma``)
``target_return``           475 v1, 195 v0, else 95%    —
                            of the horizon; gym: the
                            spec's reward_threshold
==========================  ==========================  ==================================

``horizon`` bounds the jitted rollout (a static scan length): capped envs use their cap;
uncapped ones (MyCaffe's) stop an episode after ``horizon`` steps (default 1000), which is
a truncation MyCaffe does not have.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

from caffe2jax.runtime.rl import envs
from caffe2jax.runtime.rl.gym_host import GYM_PREFIX
from caffe2jax.runtime.rl.policy import RLError
from caffe2jax.runtime.rl.rollout import RESET_MODES

DEFAULT_HORIZON = 1000
GYM_TARGETS = {"cartpole-v0": 195.0, "cartpole-v1": 475.0, "cartpole": 475.0}


@dataclass(frozen=True)
class RLConfig:
    """Resolved trainer settings (all static: a new value means a new compilation)."""

    env: str = "cartpole"
    gamma: float = 0.99
    batch_size: int = 10
    horizon: int | None = None  # None: the env's cap, else DEFAULT_HORIZON
    chunk: int = 32
    reset_mode: str = "mask"
    population_std: bool = True
    normalize_by_length: bool | None = None  # None: the MemoryLoss layer's normaliser
    difference_input: bool = False
    stale_observation: bool = False
    pole_angle_limit_deg: float | None = None  # None: the env's
    max_steps: int | None = None  # None: the env's cap; 0: no cap
    target: float | None = None
    max_episodes: int = 0
    seed: int = 0

    @property
    def is_gym(self) -> bool:
        return self.env.startswith(GYM_PREFIX)


def _opt(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def _seed(solver_param: Any, seed: int | None) -> int:
    if seed is not None:
        return int(seed)
    rl = solver_param.rl_param
    if rl.HasField("seed") and rl.seed >= 0:
        return int(rl.seed)
    if solver_param.random_seed >= 0:
        return int(solver_param.random_seed)
    return time.time_ns() % 2**31


def from_solver(solver_param: Any, memory_batch: int = 10, **overrides: Any) -> RLConfig:
    """The config a solver's ``rl_param`` asks for; keyword ``overrides`` (None: ignored) win.

    Recognised overrides: every RLConfig field (``seed`` included). An unset ``batch_size``
    is ``memory_batch``, the MemoryData layer's batch size: MyCaffe's Brain takes its
    episodes per update from the project's batch size (``GetBatchSize(phase)``)."""
    rl = solver_param.rl_param
    given = {k: v for k, v in overrides.items() if v is not None}
    env = str(given.pop("env", rl.env)).strip()
    if not env.startswith(GYM_PREFIX):
        env = env.lower()
    mycaffe = env == "cartpole-mycaffe"
    values: dict[str, Any] = {
        "env": env,
        "gamma": rl.gamma,
        "batch_size": rl.batch_size if rl.HasField("batch_size") else memory_batch,
        "population_std": rl.population_std,
        "normalize_by_length": _opt(rl, "normalize_by_length"),
        "difference_input": mycaffe
        if _opt(rl, "difference_input") is None
        else rl.difference_input,
        "stale_observation": mycaffe
        if _opt(rl, "stale_observation") is None
        else rl.stale_observation,
        "pole_angle_limit_deg": _opt(rl, "pole_angle_limit_deg"),
        "max_steps": _opt(rl, "max_steps"),
        "target": _opt(rl, "target_return"),
        "max_episodes": rl.max_episodes,
    }
    values["seed"] = _seed(solver_param, given.pop("seed", None))
    values.update(given)
    config = RLConfig(**values)
    check(config)
    return resolve_horizon(config)


def check(config: RLConfig) -> None:
    """One-line RLErrors for settings the trainer cannot run."""
    if not config.is_gym:
        try:
            envs.make_env(config.env)
        except ValueError:
            known = ", ".join(sorted(envs.ENVS))
            raise RLError(
                f"unknown environment '{config.env}'; known: {known}, or gym:<Gymnasium id>"
            ) from None
    elif config.pole_angle_limit_deg is not None or config.max_steps is not None:
        raise RLError("pole_angle_limit_deg and max_steps apply to the built-in Cart-Pole envs")
    if config.batch_size < 1:
        raise RLError(f"rl_param batch_size must be >= 1, got {config.batch_size}")
    if not 0 <= config.gamma <= 1:
        raise RLError(f"rl_param gamma must lie in [0, 1], got {config.gamma}")
    if config.horizon is not None and config.horizon < 1:
        raise RLError(f"the rollout horizon must be >= 1, got {config.horizon}")
    if config.reset_mode not in RESET_MODES:
        raise RLError(f"reset_mode must be one of {RESET_MODES}, got {config.reset_mode!r}")
    if config.pole_angle_limit_deg is not None and not 0 < config.pole_angle_limit_deg < 90:
        raise RLError(
            f"pole_angle_limit_deg must lie in (0, 90), got {config.pole_angle_limit_deg}"
        )


def make_env(config: RLConfig) -> envs.CartPoleParams:
    """The built-in JAX env with the config's angle limit and step cap applied."""
    env = envs.make_env(config.env)
    changes: dict[str, Any] = {}
    if config.pole_angle_limit_deg is not None:
        changes["theta_threshold_radians"] = config.pole_angle_limit_deg * math.pi / 180
    if config.max_steps is not None:
        changes["max_episode_steps"] = int(config.max_steps)
    return dataclasses.replace(env, **changes) if changes else env


def resolve_horizon(config: RLConfig) -> RLConfig:
    """Capped JAX envs scan to their cap (or a smaller given horizon); uncapped ones to the
    given horizon or DEFAULT_HORIZON. Gymnasium envs keep None (the host loop needs none)."""
    if config.is_gym:
        return config
    cap = make_env(config).max_episode_steps
    given = config.horizon
    if cap > 0:
        horizon = cap if given is None else min(cap, given)
    else:
        horizon = DEFAULT_HORIZON if given is None else given
    return dataclasses.replace(config, horizon=horizon)


def default_target(config: RLConfig, gym_threshold: float | None = None) -> float | None:
    """The return that counts as solved (mean over the last 100 episodes)."""
    if config.target is not None:
        return config.target
    if config.is_gym:
        return gym_threshold
    if config.max_steps is None and config.env in GYM_TARGETS:
        return GYM_TARGETS[config.env]
    return 0.95 * config.horizon
