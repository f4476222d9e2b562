"""Atari batches (runtime/rl/ale_loop.py): reproducible, the stored inputs are the frame
differences, the packed update equals the float one, the example models train, and the
settings resolve as documented."""

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

from caffe2jax.frontend.parse import read_solver
from caffe2jax.runtime.rl import ale_loop, pixels, rule
from caffe2jax.runtime.rl.policy import RLError
from caffe2jax.runtime.rl.rollout import Trajectory
from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "rl"
KARPATHY = EXAMPLES / "pong_karpathy_solver.prototxt"
CONV = EXAMPLES / "pong_conv_solver.prototxt"


@pytest.fixture(scope="module")
def trainer() -> PolicyGradientTrainer:
    return PolicyGradientTrainer(KARPATHY, seed=4, batch_size=3, num_envs=2, horizon=120)


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_settings_resolve_to_v5_and_pg_pong(trainer):
    cfg, s = trainer.config, trainer.config.ale_settings()
    assert (s.rom, s.frameskip, s.repeat_action_probability, s.max_frames) == ("pong", 4, 0.25,
                                                                               108_000)  # fmt: skip
    assert cfg.difference_input and cfg.allow_discount_reset and cfg.preprocess
    assert trainer.ale.action_names == ("RIGHT", "LEFT") and list(trainer.ale.action_ids) == [2, 3]
    assert trainer.target is None  # Pong: no threshold unless target_return is set


def test_gymnasiums_spelling_selects_the_ale_path_too():
    t = PolicyGradientTrainer(KARPATHY, seed=0, env="gym:ALE/Pong-v5", frameskip=2,
                              repeat_action_probability=0.0)  # fmt: skip
    assert t.ale is not None and t.host is None and not t.config.is_gym
    s = t.config.ale_settings()
    assert (s.frameskip, s.repeat_action_probability) == (2, 0.0)


def test_the_fast_pong_solver_is_pg_pong_with_a_ten_times_larger_learning_rate():
    # docs/rl_pong.md's learning curve comes from this solver
    fast = read_solver(EXAMPLES / "pong_karpathy_fast_solver.prototxt")
    slow = read_solver(KARPATHY)
    assert (fast.base_lr, slow.base_lr) == (pytest.approx(1e-3), pytest.approx(1e-4))
    for field in ("base_lr", "snapshot", "snapshot_prefix"):
        fast.ClearField(field)
        slow.ClearField(field)
    assert fast == slow


def test_a_batch_is_reproducible_and_counts_real_steps(trainer):
    ts0 = trainer.init()
    ts1, m1 = trainer.train_batch(ts0)
    ts2, m2 = trainer.train_batch(ts0)
    np.testing.assert_array_equal(np.asarray(m1.returns), np.asarray(m2.returns))
    for a, b in zip(_leaves(ts1.params), _leaves(ts2.params)):
        np.testing.assert_array_equal(a, b)
    assert np.asarray(m1.lengths).tolist() == [120, 120, 120]  # the horizon cut every episode
    assert int(m1.steps) == 360 and int(ts1.lanes.episodes) == 3
    assert any(not np.array_equal(a, b) for a, b in zip(_leaves(ts0.params), _leaves(ts1.params)))


def test_stored_inputs_are_the_differences_of_the_preprocessed_screens(trainer):
    """Episode 0 is played on lane 0: its stored (packed) inputs decode to bin(s_t) − bin(s_t−1),
    zero at t = 0, where s_t are the screens lane 0 showed before each of its steps."""
    ts = trainer.init()
    screens: list[np.ndarray] = []

    def keep(group, episode, obs):
        if group == 0 and episode[0] == 0:
            screens.append(np.array(obs[0]))

    played = trainer.driver.play(ts.params, ts.state, jax.random.key(0), 0, 3, on_screen=keep)
    stored = np.stack(played.x[0])
    x = np.asarray(pixels.unpack_difference(jnp.asarray(stored), 6400))
    frames = np.asarray(pixels.binarise(jnp.asarray(pixels.crop(np.stack(screens)))))
    frames = frames.reshape(len(screens), -1)
    assert not x[0].any()
    np.testing.assert_array_equal(x[1:], frames[1 : len(x)] - frames[: len(x) - 1])
    assert np.abs(x).sum() > 0  # the ball and paddles moved


def test_the_update_from_packed_inputs_equals_the_float_one(trainer):
    ts = trainer.init()
    played = trainer.driver.play(ts.params, ts.state, jax.random.key(1), 0, 3)
    packed = ale_loop.trajectory(played, 1)
    floats = packed._replace(x=pixels.unpack_difference(packed.x, 6400))
    returns = rule.discounted_returns(packed.rewards, packed.mask, 0.99, True)
    adv = rule.standardize(returns, packed.mask)

    def fwd(decode):
        return lambda p, x: trainer.policy.forward(p, ts.state, decode(x))[1]

    decode = ale_loop.decoder(trainer.config)
    g_packed = rule.batch_grads(fwd(decode), ts.params, packed, adv, True)
    g_float = rule.batch_grads(fwd(lambda x: x), ts.params, Trajectory(*floats), adv, True)
    for a, b in zip(_leaves(g_packed), _leaves(g_float)):
        np.testing.assert_array_equal(a, b)


def test_trajectory_buckets_pad_at_most_a_quarter():
    for steps in (1, 64, 65, 300, 513, 900, 1025, 5000):
        size = ale_loop.bucket(steps)
        assert size >= steps and size % 64 == 0 and (steps <= 256 or size <= 1.25 * steps)


def test_the_convolutional_softmax_example_trains():
    t = PolicyGradientTrainer(CONV, seed=0, batch_size=2, num_envs=2, horizon=40)
    assert t.policy.spec.kind == "softmax" and t.ale.action_names == ("NOOP", "RIGHT", "LEFT")
    result = t.run(episodes=4)
    assert len(result.returns) == 4 and result.steps == 160 and t.iterations(result.state) == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_envs": 4, "batch_size": 3}, r"num_envs must lie in \[1, batch_size = 3\]"),
        ({"env": "cartpole", "num_envs": 2}, "num_envs applies to the Atari"),
        ({"env": "ALE/Pong-v0"}, "unsupported Atari id"),
        ({"frameskip": 0}, "frameskip must be >= 1"),
        ({"repeat_action_probability": 1.5}, r"repeat_action_probability must lie in \[0, 1\]"),
        ({"actions": ("NOOP", "RIGHT", "LEFT")}, "outputs 2 actions .* has 3"),
    ],
)
def test_errors(options, message):
    with pytest.raises(RLError, match=message):
        PolicyGradientTrainer(KARPATHY, seed=0, **options)
