"""Atari batches whose emulators are ale-py's XLA custom calls (runtime/rl/ale_ffi.py): the
custom calls step and reset as the vector env's Python API does, the sticky draws are the
per-step ones, and a batch is the per-step loop's (actions, probabilities, rewards, stored
inputs, the update), lanes restarting inside a chunk and idling after the last episode."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

try:
    import ale_py  # noqa: F401
except ImportError as err:  # the [dev] and [atari] extras install it: missing is a failure
    raise ImportError("ale-py is missing: pip install -e '.[dev]' (or 'caffe2jax[atari]')") from err

from caffe2jax.runtime.rl import ale_ffi, ale_loop, ale_program, pixels
from caffe2jax.runtime.rl.ale_env import AleEnvs, AleSettings, sticky_generator
from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer

KARPATHY = Path(__file__).resolve().parents[3] / "examples" / "rl" / "pong_karpathy_solver.prototxt"
# 3 episodes on 2 emulators (two overlap groups of one lane, each drawing with its own key),
# sticky actions on (the frame skip played frame by frame): chunks of 32 steps cross the
# horizon (90: points are scored by then) and the batch ends inside one
OPTIONS = {"seed": 4, "batch_size": 3, "num_envs": 2, "horizon": 90, "rollout_chunk": 32}


def _settings(n: int, sticky: float, max_frames: int) -> AleSettings:
    return AleSettings("ALE/Pong-v5", "pong", n, 4, sticky, (), True, False, 2, max_frames)


def test_the_custom_calls_step_and_reset_as_the_python_api():
    """Two equal vector envs, one through ``send``/``recv``/``reset``, one through the jitted
    custom calls: the same screens, rewards and ends on every step, across the vector env's
    own restarts (20-step episodes) and masked resets."""
    python_side = AleEnvs(_settings(3, 0.0, 80))
    emu = ale_ffi.Emulators(python_side)
    step = jax.jit(emu.step)
    reset = jax.jit(emu.reset)
    red = python_side.reset(0)
    handle, got = reset(emu.handle, jnp.ones(3, jnp.bool_), jnp.zeros_like(red))
    np.testing.assert_array_equal(red, got)
    rng, ends = np.random.default_rng(0), 0
    for t in range(45):
        actions = rng.integers(0, 6, 3)
        red, reward, ended = python_side.step(0, actions)
        handle, got, got_reward, got_ended = step(handle, python_side.action_ids[actions])
        np.testing.assert_array_equal(red, got)
        np.testing.assert_array_equal(reward, got_reward)
        np.testing.assert_array_equal(ended, got_ended)
        ends += int(ended.sum())
        if t % 9 == 4:  # lanes 0 and 2 restarted
            mask = np.array([True, False, True])
            red = python_side.reset(0, mask)
            handle, got = reset(handle, jnp.asarray(mask), got)
            np.testing.assert_array_equal(red, got)
    assert ends == 2  # lane 1 alone plays unreset: its episode truncated twice
    python_side.close()
    emu.close()


def test_the_sticky_table_holds_the_per_step_draws():
    """Row ``e``, columns ``j*4 .. j*4+3``: the 4 draws step ``j`` of the batch's episode ``e``
    makes from its generator (:func:`.ale_env.sticky_generator`), compared with ``p``."""

    class Envs:
        settings = _settings(2, 0.25, 400)

    table = ale_ffi.sticky_table(Envs(), 7, 5, 2, 0)
    assert table.shape == (2, 404)  # 100 agent steps (400 frames / 4) and one more
    for e in range(2):
        g = sticky_generator(7, 5 + e)
        steps = [g.random(4) < 0.25 for _ in range(101)]
        np.testing.assert_array_equal(table[e], np.concatenate(steps))
    assert 0.15 < table.mean() < 0.35
    assert ale_ffi.sticky_table(Envs(), 7, 5, 2, 10).shape == (2, 40)  # the horizon's steps


@pytest.fixture(scope="module")
def pair() -> tuple[PolicyGradientTrainer, PolicyGradientTrainer]:
    steps = PolicyGradientTrainer(KARPATHY, **OPTIONS)
    ffi = PolicyGradientTrainer(KARPATHY, ale_rollout="program", **OPTIONS)
    ffi.learn = steps.learn  # one compilation of the update (the same net and solver)
    return steps, ffi


def _leaves(ts) -> list[np.ndarray]:
    tree = (ts.params, ts.state, ts.opt_state, ts.lanes, jax.random.key_data(ts.key))
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_the_ffi_program_plays_the_loops_episodes_and_update(pair, monkeypatch):
    """From the same state (params, key, episode counter) a batch of each: the update sees
    the same trajectory bit for bit, and the next states are equal."""
    seen = []
    for trainer in pair:
        learn = trainer.learn
        monkeypatch.setattr(trainer, "learn", lambda *a, f=learn: seen.append(a[3]) or f(*a))
    steps, ffi = pair
    assert isinstance(ffi.driver, ale_ffi.AleFfi) and len(ffi.ale.groups) == 2
    ts = steps.init()
    ts = ts._replace(lanes=ts.lanes.replace(episodes=ts.lanes.episodes + 3))  # episodes 3-5
    (ts_a, m_a), (ts_b, m_b) = steps.train_batch(ts), ffi.train_batch(ts)
    want, got = seen
    for a, b in zip(want, got):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.asarray(want.mask).sum(0).tolist() == [90, 90, 90]
    assert np.abs(np.asarray(want.rewards)).sum() > 0
    np.testing.assert_array_equal(np.asarray(m_a.returns), np.asarray(m_b.returns))
    for a, b in zip(_leaves(ts_a), _leaves(ts_b)):
        np.testing.assert_array_equal(a, b)
    assert int(ts_b.lanes.episodes) == 6


def test_lanes_restart_inside_a_chunk_and_idle_after_the_last_episode(pair):
    """A lane whose episode stops inside a chunk takes the batch's next episode from a reset,
    its first input zero; with none left it idles (-1); once no lane plays the rest of the
    chunk is skipped and no further chunk runs (the horizon is an argument: no recompile)."""
    _, ffi = pair
    ts = ffi.init()
    ffi.driver.horizon = 10  # shorter episodes: restarts inside the first chunk
    try:
        played, (x, *_rest) = ffi.driver.play(ts.params, ts.state, ts.key, 0, 3)
    finally:
        ffi.driver.horizon = OPTIONS["horizon"]
    assert played.shape == (32, 2)  # one chunk: the batch ended inside it
    assert played[:, 0].tolist() == [0] * 10 + [2] * 10 + [-1] * 12
    assert played[:, 1].tolist() == [1] * 10 + [-1] * 22
    assert not x[10, 0].any()  # episode 2's first input: zero
    assert x[11:20, 0].any()  # then the differences of its frames
    assert x.shape[-1] == pixels.SIZE * pixels.SIZE // 8  # bit planes


def test_without_stickiness_one_call_per_step_plays_the_loops_episodes():
    """``repeat_action_probability: 0`` (the emulators skip the frames themselves: one custom
    call per agent step) on 3 emulators (overlap groups of 2 and 1), 4 episodes in chunks of
    16 steps: the loop's trajectory bit for bit."""
    options = {**OPTIONS, "num_envs": 3, "batch_size": 4, "horizon": 40, "rollout_chunk": 16}
    options["repeat_action_probability"] = 0.0
    steps = PolicyGradientTrainer(KARPATHY, **options)
    ffi = PolicyGradientTrainer(KARPATHY, ale_rollout="program", **options)
    ts = steps.init()
    want = ale_loop.trajectory(steps.driver.play(ts.params, ts.state, ts.key, 0, 4), 1)
    got = ale_program.trajectory(*ffi.driver.play(ts.params, ts.state, ts.key, 0, 4), 4)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.asarray(want.mask).sum(0).tolist() == [40] * 4
