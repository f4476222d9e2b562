"""Atari 2600 games through the Arcade Learning Environment (ale-py), many emulators at once.

``env: "ALE/<Game>-v5"`` (or Gymnasium's spelling ``gym:ALE/<Game>-v5``) selects a game whose
ROM ships with ale-py (≥ 0.9). Its emulators run in C++ threads through ale-py's
``AtariVectorEnv``; :class:`AleEnvs` keeps them as one group, or as two groups when
``overlap`` is on, so one half steps while the policy's forward runs for the other half.

Settings follow the ``-v5`` ids (Machado et al. 2018, as ale-py registers them): ``frameskip``
4 (the action repeated on 4 frames, the reward summed), sticky actions with
``repeat_action_probability`` 0.25, the game's minimal action set, 108,000 frames (30 minutes)
at most per episode, no no-op starts, no FIRE on reset, rewards unclipped, the raw RGB screen
(no max-pooling of frames, no resizing). ``rl_param`` overrides ``frameskip``,
``repeat_action_probability`` and the actions the policy's outputs stand for (``actions``:
names of ``ale_py.Action``, e.g. Pong's ``RIGHT`` = up and ``LEFT`` = down).

MyCaffe's ATARI gym (``MyCaffe.gym/Gyms/AtariGym.cs``) differs: no sticky actions, a frame skip
drawn from 3-5 on every step (the vector env takes one fixed frameskip, so that is not
offered), and ALE's colour averaging.

Reproducible episodes. With ``repeat_action_probability`` 0 an Atari game is deterministic: a
reset (without a seed) starts the same game, and the same actions play the same frames. ale-py
draws sticky actions from each emulator's own generator, which only a seeded reset — a reload
of the ROM, ~0.1 s — can set. So the emulators here run with ALE's stickiness off, the frame
skip is played frame by frame when stickiness is on, and the sticky draws are made on the
host with ALE's rule (on each frame, with probability ``p`` the previous frame's action is
applied again instead of the agent's; NOOP after a reset) from a generator seeded by the run's
seed and the episode's index (:func:`sticky_generator`). An episode is then a function of the
seed, its index and the policy's actions, whichever emulator plays it (tested), and a
snapshot needs only the seed and the episode counter to resume the emulators exactly.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from caffe2jax.runtime.rl import pixels

PREFIXES = ("ALE/", "gym:ALE/")
V5 = {"frameskip": 4, "repeat_action_probability": 0.25, "max_frames": 108_000}
_ID = re.compile(r"(?:gym:)?ALE/([A-Za-z0-9]+)-v5")


def is_ale(env: str) -> bool:
    return env.startswith(PREFIXES)


def _import_ale() -> Any:
    try:
        import ale_py
        from ale_py.vector_env import AtariVectorEnv
    except ImportError as exc:
        raise ImportError(
            "Atari environments need the optional 'ale-py' package (ROMs included); install "
            "it with: pip install 'caffe2jax[atari]'"
        ) from exc
    return ale_py, AtariVectorEnv


def rom_id(env: str) -> str:
    """``"ALE/Pong-v5"`` -> ale-py's ROM id ``"pong"`` (ValueError for other ids)."""
    match = _ID.fullmatch(env)
    if match is None:
        raise ValueError(
            f"unsupported Atari id '{env}': use ALE/<Game>-v5 (e.g. ALE/Pong-v5); the v0/v4 "
            "ids draw a random frame skip, which ale-py's vector env does not offer"
        )
    _import_ale()
    from ale_py import registration, roms

    names = {registration.rom_id_to_name(r): r for r in roms.get_all_rom_ids()}
    if match.group(1) not in names:
        raise ValueError(f"'{env}': ale-py has no ROM for game '{match.group(1)}'")
    return names[match.group(1)]


def sticky_generator(run_seed: int, episode: int) -> np.random.Generator:
    """The sticky-action draws of the run's ``episode``-th episode (0-based)."""
    return np.random.Generator(
        np.random.Philox(np.random.SeedSequence([run_seed % 2**32, episode]))
    )


@dataclass(frozen=True)
class AleSettings:
    """One Atari environment as the trainer runs it."""

    env: str
    rom: str
    num_envs: int
    frameskip: int
    repeat_action_probability: float
    actions: tuple[str, ...]  # () -> the minimal action set
    preprocess: bool
    overlap: bool
    threads: int
    max_frames: int = V5["max_frames"]

    @property
    def obs_shape(self) -> tuple[int, int]:
        return (pixels.SIZE, pixels.SIZE)


def vector_env(s: AleSettings, n: int) -> Any:
    """ale-py's vector env with ALE's own stickiness off (see the module docstring) and, when
    stickiness is on, one frame per step (the frame skip is then played here)."""
    _, vector = _import_ale()
    frameskip = s.frameskip if s.repeat_action_probability == 0 else 1
    return vector(
        s.rom, n, img_height=210, img_width=160, grayscale=False, stack_num=1, maxpool=False,
        noop_max=0, use_fire_reset=False, reward_clipping=False, episodic_life=False,
        frameskip=frameskip, repeat_action_probability=0.0,
        max_num_frames_per_episode=s.max_frames, autoreset_mode="SameStep",
        num_threads=min(s.threads or os.cpu_count() or 1, n),
    )  # fmt: skip


class AleEnvs:
    """``num_envs`` emulators in one or two ``AtariVectorEnv`` groups, lanes numbered across
    the groups in order. Screens come back cropped and downsampled (:func:`pixels.crop`)."""

    def __init__(self, settings: AleSettings):
        _import_ale()
        self.settings = settings
        n = settings.num_envs
        sizes = [n - n // 2, n // 2] if settings.overlap and n >= 2 else [n]
        self.groups = [vector_env(settings, k) for k in sizes]
        self.slices = [slice(sum(sizes[:i]), sum(sizes[: i + 1])) for i in range(len(sizes))]
        self.action_set = [a.name for a in self.groups[0].ale.get_action_set()]
        names = settings.actions or tuple(self.action_set)
        unknown = [a for a in names if a not in self.action_set]
        if unknown:
            raise ValueError(
                f"action(s) {', '.join(unknown)} not in {settings.env}'s action set "
                f"({', '.join(self.action_set)})"
            )
        self.action_names = tuple(names)
        self.action_ids = np.asarray([self.action_set.index(a) for a in names], np.int32)
        self.noop = self.action_set.index("NOOP") if "NOOP" in self.action_set else 0
        self.applied = np.full(n, self.noop, np.int32)  # the action each emulator applies now
        self.screens: list[np.ndarray | None] = [None] * len(self.groups)  # the last RGB screens

    @property
    def num_actions(self) -> int:
        return len(self.action_ids)

    def reset(self, group: int, mask: np.ndarray | None = None) -> np.ndarray:
        """Reset the group's lanes (all, or those in ``mask``); the group's cropped screens
        ``(n, 80, 80)`` uint8."""
        sl = self.slices[group]
        options = None if mask is None else {"reset_mask": np.asarray(mask, np.bool_)}
        obs, _ = self.groups[group].reset(options=options)
        applied = self.applied[sl]  # a view: ALE applies NOOP after a reset
        applied[slice(None) if mask is None else np.asarray(mask, np.bool_)] = self.noop
        self.screens[group] = obs
        return pixels.crop(obs)

    def step(
        self, group: int, actions: np.ndarray, sticky: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One agent step of the group's emulators for the policy's action indices: the
        cropped screens, the rewards summed over the frames (float32) and the episode ends.

        ``sticky`` (``(n, frameskip)`` uniforms, needed when stickiness is on): on frame ``f``
        an emulator applies its previous action again where ``sticky[:, f] < p``. A lane whose
        episode ends on a frame gets nothing from the frames after it."""
        env, sl, s = self.groups[group], self.slices[group], self.settings
        wanted = self.action_ids[np.asarray(actions)]
        if s.repeat_action_probability == 0:
            env.send(wanted)
            obs, reward, terminated, truncated, _ = env.recv()
            self.screens[group] = obs
            return pixels.crop(obs), reward.astype(np.float32), terminated | truncated
        total = np.zeros(len(wanted), np.float32)
        ended = np.zeros(len(wanted), np.bool_)
        for f in range(s.frameskip):
            applied = np.where(sticky[:, f] < s.repeat_action_probability, self.applied[sl], wanted)
            self.applied[sl] = applied
            env.send(applied.astype(np.int32))
            obs, reward, terminated, truncated, _ = env.recv()
            total += np.where(ended, 0, reward)
            ended |= terminated | truncated
        self.screens[group] = obs
        return pixels.crop(obs), total, ended

    def close(self) -> None:
        for env in self.groups:
            env.close()
