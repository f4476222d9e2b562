"""The Atari emulators (runtime/rl/ale_env.py): what ale-py guarantees, and what the trainer's
exact resume relies on — lanes of a vector env equal single emulators, a reset replays the
game, the host-side frame skip and sticky actions equal ALE's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

try:
    import ale_py  # noqa: F401
    from ale_py.vector_env import AtariVectorEnv
except ImportError as err:  # the [dev] and [atari] extras install it: missing is a failure
    raise ImportError("ale-py is missing: pip install -e '.[dev]' (or 'caffe2jax[atari]')") from err

from caffe2jax.runtime.rl import ale_env
from caffe2jax.runtime.rl.ale_env import AleEnvs, AleSettings

PONG = AleSettings("ALE/Pong-v5", "pong", 1, 4, 0.25, (), True, True, 0)


def _raw(n: int) -> AtariVectorEnv:
    return AtariVectorEnv("pong", n, img_height=210, img_width=160, grayscale=False, stack_num=1,
                          maxpool=False, noop_max=0, use_fire_reset=False, reward_clipping=False,
                          repeat_action_probability=0.25, frameskip=4,
                          autoreset_mode="SameStep")  # fmt: skip


def _play_raw(env: AtariVectorEnv, seeds: list[int], actions: np.ndarray) -> tuple:
    obs, _ = env.reset(seed=np.asarray(seeds))
    screens, rewards = [obs[:, 0, 35:195:2, ::2, 0].copy()], []
    for a in actions:
        obs, r, *_ = env.step(a.astype(np.int32))
        screens.append(obs[:, 0, 35:195:2, ::2, 0].copy())
        rewards.append(r)
    return np.stack(screens), np.stack(rewards)


def test_ale_py_vector_env_equals_single_envs_with_the_same_seeds():
    """ale-py's own guarantee (its sticky actions on): sub-environment i of a vector env seeded
    with s_i plays what a one-emulator vector env seeded with s_i plays."""
    actions = np.random.default_rng(0).integers(0, 6, (250, 3))
    screens, rewards = _play_raw(_raw(3), [3, 4, 5], actions)
    for i, seed in enumerate((3, 4, 5)):
        one_screens, one_rewards = _play_raw(_raw(1), [seed], actions[:, i : i + 1])
        np.testing.assert_array_equal(screens[:, i], one_screens[:, 0])
        np.testing.assert_array_equal(rewards[:, i], one_rewards[:, 0])
    assert np.abs(rewards).sum() > 0  # points were scored in those steps


def _play(envs: AleEnvs, actions: np.ndarray, sticky: np.ndarray) -> tuple:
    """Every group stepped in turn, lanes reset where an episode ended."""
    out = [np.concatenate([envs.reset(g) for g in range(len(envs.groups))])]
    rewards, ends = [], []
    for a, u in zip(actions, sticky):
        parts = [envs.step(g, a[sl], u[sl]) for g, sl in enumerate(envs.slices)]
        red, reward, ended = (np.concatenate(p) for p in zip(*parts))
        for g, sl in enumerate(envs.slices):
            if ended[sl].any():
                red[sl] = np.where(ended[sl, None, None], envs.reset(g, ended[sl]), red[sl])
        out.append(red)
        rewards.append(reward)
        ends.append(ended)
    return np.stack(out), np.stack(rewards), np.stack(ends)


def test_lanes_equal_single_emulators_and_resets_replay_the_game():
    """Three lanes in two groups (overlap) equal three one-lane AleEnvs fed the same actions
    and sticky draws — through episode ends and resets, so a reset starts the same game."""
    rng = np.random.default_rng(1)
    steps = 1500  # a random policy's Pong game ends after ~750-1300 steps
    actions, sticky = rng.integers(0, 2, (steps, 3)), rng.random((steps, 3, 4))
    settings = dataclasses.replace(PONG, num_envs=3, actions=("RIGHT", "LEFT"))
    many = AleEnvs(settings)
    assert [s.stop - s.start for s in many.slices] == [2, 1]
    red, rewards, ends = _play(many, actions, sticky)
    assert ends.any(axis=0).all()  # every lane finished a game and was reset
    one = dataclasses.replace(settings, num_envs=1)
    for i in range(3):
        r1, w1, e1 = _play(AleEnvs(one), actions[:, i : i + 1], sticky[:, i : i + 1])
        np.testing.assert_array_equal(red[:, i], r1[:, 0])
        np.testing.assert_array_equal(rewards[:, i], w1[:, 0])
        np.testing.assert_array_equal(ends[:, i], e1[:, 0])


def test_host_frame_skip_and_sticky_actions_follow_ales_rule():
    """With sticky actions the frame skip is played here, frame by frame: frame f applies the
    previous frame's action where u[f] < p (NOOP after a reset), and the rewards are summed.
    Checked against an emulator stepped one frame at a time with those applied actions."""
    rng = np.random.default_rng(2)
    settings = dataclasses.replace(PONG, num_envs=2, overlap=False, actions=("RIGHT", "LEFT"))
    envs = AleEnvs(settings)
    frames = AleEnvs(dataclasses.replace(settings, repeat_action_probability=0.0, frameskip=1))
    envs.reset(0)
    frames.reset(0)
    ids = np.asarray([envs.action_set.index(a) for a in ("RIGHT", "LEFT")])
    noop = envs.action_set.index("NOOP")
    applied = np.full(2, noop)
    for _ in range(120):
        action, u = rng.integers(0, 2, 2), rng.random((2, 4))
        red, reward, _ = envs.step(0, action, u)
        total = np.zeros(2, np.float32)
        for f in range(4):
            applied = np.where(u[:, f] < 0.25, applied, ids[action])
            frames.action_ids = np.arange(len(frames.action_set))  # apply ALE ids as given
            expected, r, _ = frames.step(0, applied)
            total += r
        np.testing.assert_array_equal(red, expected)
        np.testing.assert_array_equal(reward, total)


def test_without_stickiness_the_vector_env_skips_frames_itself():
    """p = 0: the vector env plays the 4 frames in C++; the same as 4 single frames."""
    rng = np.random.default_rng(3)
    settings = dataclasses.replace(PONG, num_envs=2, repeat_action_probability=0.0)
    skip, single = AleEnvs(settings), AleEnvs(dataclasses.replace(settings, frameskip=1))
    for envs in (skip, single):
        for g in range(len(envs.groups)):
            envs.reset(g)
    for _ in range(150):
        action = rng.integers(0, 6, 2)
        red, reward, _ = zip(*[skip.step(g, action[sl]) for g, sl in enumerate(skip.slices)])
        total = np.zeros(2, np.float32)
        for _ in range(4):
            parts = [single.step(g, action[sl]) for g, sl in enumerate(single.slices)]
            expected = np.concatenate([p[0] for p in parts])
            total += np.concatenate([p[1] for p in parts])
        np.testing.assert_array_equal(np.concatenate(red), expected)
        np.testing.assert_array_equal(np.concatenate(reward), total)


def test_sticky_generators_are_keyed_by_seed_and_episode():
    a = ale_env.sticky_generator(7, 3).random(5)
    np.testing.assert_array_equal(a, ale_env.sticky_generator(7, 3).random(5))
    assert not np.array_equal(a, ale_env.sticky_generator(7, 4).random(5))
    assert not np.array_equal(a, ale_env.sticky_generator(8, 3).random(5))


@pytest.mark.parametrize(
    ("env", "rom"),
    [("ALE/Pong-v5", "pong"), ("gym:ALE/SpaceInvaders-v5", "space_invaders")],
)
def test_ids_name_roms(env, rom):
    assert ale_env.is_ale(env) and ale_env.rom_id(env) == rom


@pytest.mark.parametrize(
    ("env", "message"),
    [("ALE/Pong-v4", "random frame skip"), ("ALE/Pongg-v5", "no ROM for game 'Pongg'")],
)
def test_bad_ids(env, message):
    with pytest.raises(ValueError, match=message):
        ale_env.rom_id(env)


def test_unknown_action_names_list_the_action_set():
    with pytest.raises(ValueError, match=r"UP not in ALE/Pong-v5's action set \(NOOP, FIRE"):
        AleEnvs(dataclasses.replace(PONG, actions=("RIGHT", "UP")))
