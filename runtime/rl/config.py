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
                            of the horizon (950 when
                            uncapped); gym: the spec's
                            reward_threshold
``horizon``                 the env's cap; none for     none (an episode ends when the
                            cartpole-mycaffe            pole falls)
``rollout_chunk``           1024                        —
``allow_discount_reset``    false                       false (``AllowDiscountReset``)
``eps_steps/start/end``     0 / 0 / 0 (off)             0 / 0 / 0 (PG.MT ``EpsSteps``…)
``episode_elite_percent``   1 (keep all)                1.0 (PG.MT ``EpisodeElitePercent``)
``update``                  PG, one step a batch        PG (``TrainerPG``); TRPO, PPO and
                                                        multi-step: :mod:`.update`
==========================  ==========================  ==================================

Atari (``env: "ALE/<Game>-v5"``, :mod:`.ale_env`): ``num_envs`` (1) emulators at once,
``frameskip`` (the id's: 4), ``repeat_action_probability`` (the id's: 0.25), ``actions`` (the
minimal action set), ``preprocess`` (true: Karpathy's Pong preprocessing, :mod:`.pixels`),
``overlap`` (true), ``env_threads`` (0: one per core), ``ale_rollout`` ("steps": one jitted
call per agent step, :mod:`.ale_loop`; "program": the emulators stepped inside compiled
rollouts of ``rollout_chunk`` agent steps as ale-py's XLA custom calls, :mod:`.ale_ffi` — or,
with an ale-py that has none, through io_callbacks, :mod:`.ale_program`; the same episodes
every way);
``difference_input`` is on unless set (Karpathy's and MyCaffe's ``cur - prev``).

``horizon`` truncates episodes; capped envs use their cap as the static scan length. With no
horizon (MyCaffe's gym) an episode runs until the env ends it: the batch is played as a chain
of bounded programs of ``rollout_chunk`` steps each (the last lane's state carried from one to
the next), so the compiled programs stay bounded however long an episode lasts.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

from caffe2jax.runtime.rl import ale_env, envs, gymnax_env
from caffe2jax.runtime.rl.gym_host import GYM_PREFIX
from caffe2jax.runtime.rl.policy import RLError
from caffe2jax.runtime.rl.rollout import RESET_MODES
from caffe2jax.runtime.rl.update import UpdateSettings
from caffe2jax.runtime.rl.update import from_proto as update_settings

ALE_ROLLOUTS = ("program", "steps")  # ale_ffi.AleFfi (or ale_program.AleProgram), AleLoop
UNCAPPED_TARGET = 950.0  # the default target of an env with no step cap (95% of 1000)
# Gymnasium's reward_threshold of the same environments
GYMNAX_TARGETS = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0, "MountainCar-v0": -110.0}
GYM_TARGETS = {"cartpole-v0": 195.0, "cartpole-v1": 475.0, "cartpole": 475.0}


@dataclass(frozen=True)
class RLConfig:
    """Resolved trainer settings (all static: a new value means a new compilation)."""

    env: str = "cartpole"
    gamma: float = 0.99
    batch_size: int = 10
    horizon: int | None = None  # None: the env's cap, else no truncation
    rollout_chunk: int = 1024  # steps per program when there is no horizon
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
    allow_discount_reset: bool = False
    eps_steps: int = 0
    eps_start: float = 0.0
    eps_end: float = 0.0
    episode_elite_percent: float = 1.0
    num_envs: int = 1
    frameskip: int | None = None  # None: the Atari id's
    repeat_action_probability: float | None = None  # None: the Atari id's
    actions: tuple[str, ...] = ()  # (): the game's minimal action set
    preprocess: bool = True
    overlap: bool = True
    env_threads: int = 0
    ale_rollout: str = "steps"  # "program": emulators stepped inside the compiled rollout
    update: UpdateSettings = UpdateSettings()  # PG, TRPO or PPO (:mod:`.update`)

    @property
    def is_ale(self) -> bool:
        return ale_env.is_ale(self.env)

    @property
    def is_gym(self) -> bool:
        return self.env.startswith(GYM_PREFIX) and not self.is_ale

    @property
    def on_host(self) -> bool:
        """Stepped outside XLA (Gymnasium or ALE): episodes end when the env says so."""
        return self.is_gym or self.is_ale

    def ale_settings(self) -> ale_env.AleSettings:
        """The Atari environment's settings: the id's (v5) where rl_param leaves them unset."""
        return ale_env.AleSettings(
            env=self.env,
            rom=ale_env.rom_id(self.env),
            num_envs=self.num_envs,
            frameskip=ale_env.V5["frameskip"] if self.frameskip is None else self.frameskip,
            repeat_action_probability=ale_env.V5["repeat_action_probability"]
            if self.repeat_action_probability is None
            else self.repeat_action_probability,
            actions=self.actions,
            preprocess=self.preprocess,
            overlap=self.overlap,
            threads=self.env_threads,
        )


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


def _atari(rl: Any) -> dict[str, Any]:
    """The ALE fields of rl_param (unset frameskip/stickiness: the Atari id's)."""
    return {
        "num_envs": rl.num_envs,
        "frameskip": _opt(rl, "frameskip"),
        "repeat_action_probability": _opt(rl, "repeat_action_probability"),
        "actions": tuple(a.strip().upper() for a in rl.actions),
        "preprocess": rl.preprocess,
        "overlap": rl.overlap,
        "env_threads": rl.env_threads,
        "ale_rollout": rl.ale_rollout,
    }


def from_solver(solver_param: Any, memory_batch: int = 10, **overrides: Any) -> RLConfig:
    """The config a solver's ``rl_param`` asks for; keyword ``overrides`` (None: ignored) win.

    Recognised overrides: every RLConfig field (``seed`` included). An unset ``batch_size``
    is ``memory_batch``, the MemoryData layer's batch size: MyCaffe's Brain takes its
    episodes per update from the project's batch size (``GetBatchSize(phase)``)."""
    rl = solver_param.rl_param
    given = {k: v for k, v in overrides.items() if v is not None}
    env = str(given.pop("env", rl.env)).strip()
    if not env.startswith((GYM_PREFIX, gymnax_env.PREFIX, *ale_env.PREFIXES)):
        env = env.lower()
    mycaffe = env == "cartpole-mycaffe"
    pixels = ale_env.is_ale(env)  # Karpathy's and MyCaffe's Pong input: cur - prev
    values: dict[str, Any] = {
        "env": env,
        "gamma": rl.gamma,
        "batch_size": rl.batch_size if rl.HasField("batch_size") else memory_batch,
        "population_std": rl.population_std,
        "normalize_by_length": _opt(rl, "normalize_by_length"),
        "difference_input": (mycaffe or pixels)
        if _opt(rl, "difference_input") is None
        else rl.difference_input,
        "stale_observation": mycaffe
        if _opt(rl, "stale_observation") is None
        else rl.stale_observation,
        "pole_angle_limit_deg": _opt(rl, "pole_angle_limit_deg"),
        "max_steps": _opt(rl, "max_steps"),
        "target": _opt(rl, "target_return"),
        "max_episodes": rl.max_episodes,
        "horizon": (rl.horizon or None) if rl.HasField("horizon") else None,
        "rollout_chunk": rl.rollout_chunk,
        "allow_discount_reset": rl.allow_discount_reset,
        "eps_steps": rl.eps_steps,
        "eps_start": rl.eps_start,
        "eps_end": rl.eps_end,
        "episode_elite_percent": rl.episode_elite_percent,
        **_atari(rl),
        "update": update_settings(rl),
    }
    values["seed"] = _seed(solver_param, given.pop("seed", None))
    values.update(given)
    if values["horizon"] == 0:
        values["horizon"] = None
    config = RLConfig(**values)
    check(config)
    return resolve_horizon(config)


def check(config: RLConfig) -> None:
    """One-line RLErrors for settings the trainer cannot run."""
    if config.is_ale:
        _check_ale(config)
    elif config.env.startswith(gymnax_env.PREFIX):
        try:
            gymnax_env.make(config.env)
        except ValueError as err:
            raise RLError(str(err)) from None
        if config.pole_angle_limit_deg is not None or config.max_steps is not None:
            raise RLError("pole_angle_limit_deg and max_steps apply to the built-in Cart-Pole envs")
    elif not config.is_gym:
        try:
            envs.make_env(config.env)
        except ValueError:
            known = ", ".join(sorted(envs.ENVS))
            raise RLError(
                f"unknown environment '{config.env}'; known: {known}, or gym:<Gymnasium id>"
            ) from None
    elif config.pole_angle_limit_deg is not None or config.max_steps is not None:
        raise RLError("pole_angle_limit_deg and max_steps apply to the built-in Cart-Pole envs")
    if not config.is_ale and config.num_envs != 1:
        raise RLError("rl_param num_envs applies to the Atari (ALE/<Game>-v5) environments")
    if config.batch_size < 1:
        raise RLError(f"rl_param batch_size must be >= 1, got {config.batch_size}")
    _check_sizes(config)
    if not 0 <= config.gamma <= 1:
        raise RLError(f"rl_param gamma must lie in [0, 1], got {config.gamma}")
    if config.horizon is not None and config.horizon < 1:
        raise RLError(f"the rollout horizon must be >= 1, got {config.horizon}")
    if config.rollout_chunk < 1:
        raise RLError(f"rl_param rollout_chunk must be >= 1, got {config.rollout_chunk}")
    for name in ("eps_start", "eps_end"):
        value = getattr(config, name)
        if not 0 <= value <= 1:
            raise RLError(f"rl_param {name} must lie in [0, 1] (MyCaffe's range), got {value}")
    if config.eps_end > config.eps_start:
        raise RLError(
            f"rl_param eps_end ({config.eps_end}) must not exceed eps_start "
            f"({config.eps_start}), as in MyCaffe"
        )
    if config.reset_mode not in RESET_MODES:
        raise RLError(f"reset_mode must be one of {RESET_MODES}, got {config.reset_mode!r}")
    if config.pole_angle_limit_deg is not None and not 0 < config.pole_angle_limit_deg < 90:
        raise RLError(
            f"pole_angle_limit_deg must lie in (0, 90), got {config.pole_angle_limit_deg}"
        )


# What one episode of a batch holds at least, whatever the env: its state, key, return and
# step count (the 2^31 − 1 batch asked XLA for 16 bytes an episode, then more).
EPISODE_BYTES = 64
INT_MAX = 2**31 - 1


def _check_sizes(config: RLConfig) -> None:
    """Counts the jitted rollout holds as int32, and a batch whose episodes' state alone would
    not fit in memory: refused before anything is allocated."""
    from caffe2jax.runtime.host.memory import gib, memory_budget

    if not 0 <= config.eps_steps <= INT_MAX:
        raise RLError(f"rl_param eps_steps must lie in [0, {INT_MAX}], got {config.eps_steps}")
    if not -(2**63) <= config.seed < 2**63:
        raise RLError(f"the seed must fit in 64 bits (int64), got {config.seed}")
    need = config.batch_size * EPISODE_BYTES
    if need > 1 << 30:  # below a GiB a batch is never the problem; the budget costs file reads
        budget = memory_budget()
        if need > budget.bytes:
            raise RLError(
                f"rl_param batch_size {config.batch_size} needs at least {gib(need)} for its "
                f"episodes, more than {budget.describe()}; lower batch_size"
            )


def _check_ale(config: RLConfig) -> None:
    try:
        ale_env.rom_id(config.env)
    except (ImportError, ValueError) as err:
        raise RLError(str(err)) from None
    if config.pole_angle_limit_deg is not None or config.max_steps is not None:
        raise RLError("pole_angle_limit_deg and max_steps apply to the built-in Cart-Pole envs")
    if not 1 <= config.num_envs <= config.batch_size:
        raise RLError(
            f"rl_param num_envs must lie in [1, batch_size = {config.batch_size}] (each "
            f"emulator plays one of the batch's episodes at a time), got {config.num_envs}"
        )
    if config.frameskip is not None and config.frameskip < 1:
        raise RLError(f"rl_param frameskip must be >= 1, got {config.frameskip}")
    if config.ale_rollout not in ALE_ROLLOUTS:
        raise RLError(
            f"rl_param ale_rollout must be one of {', '.join(map(repr, ALE_ROLLOUTS))}, "
            f"got {config.ale_rollout!r}"
        )
    sticky = config.repeat_action_probability
    if sticky is not None and not 0 <= sticky <= 1:
        raise RLError(f"rl_param repeat_action_probability must lie in [0, 1], got {sticky}")


def make_env(config: RLConfig) -> envs.CartPoleParams:
    """The built-in JAX env with the config's angle limit and step cap applied (or the
    gymnax env a ``gymnax:<id>`` names)."""
    if config.env.startswith(gymnax_env.PREFIX):
        return gymnax_env.make(config.env)
    env = envs.make_env(config.env)
    changes: dict[str, Any] = {}
    if config.pole_angle_limit_deg is not None:
        changes["theta_threshold_radians"] = config.pole_angle_limit_deg * math.pi / 180
    if config.max_steps is not None:
        changes["max_episode_steps"] = int(config.max_steps)
    return dataclasses.replace(env, **changes) if changes else env


def resolve_horizon(config: RLConfig) -> RLConfig:
    """Capped JAX envs scan to their cap (or a smaller given horizon); uncapped ones keep the
    given horizon, or None: no truncation. Gymnasium envs keep theirs (None: TimeLimit's)."""
    if config.on_host:
        return config
    cap = make_env(config).max_episode_steps
    given = config.horizon
    horizon = (cap if given is None else min(cap, given)) if cap > 0 else given
    return dataclasses.replace(config, horizon=horizon)


def default_target(config: RLConfig, gym_threshold: float | None = None) -> float | None:
    """The return that counts as solved (mean over the last 100 episodes)."""
    if config.target is not None:
        return config.target
    if config.on_host:
        return gym_threshold
    if config.env.startswith(gymnax_env.PREFIX):
        return GYMNAX_TARGETS.get(config.env[len(gymnax_env.PREFIX) :])
    if config.max_steps is None and config.env in GYM_TARGETS:
        return GYM_TARGETS[config.env]
    return UNCAPPED_TARGET if config.horizon is None else 0.95 * config.horizon
