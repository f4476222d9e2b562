"""MyCaffe's PG options (rl_param 13-19), each against a NumPy transcription of its rule in
MyCaffe's source (``MyCaffe.trainers/pg.mt/TrainerPG.cs``), and the uncapped horizon."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.runtime.rl import rule
from caffe2jax.runtime.rl.policy import SIGMOID, SOFTMAX, RLError
from caffe2jax.runtime.rl.rollout import explore, rollout
from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer
from tests.runtime.rl.test_rule import net_text, solver_text


def np_discounted_reset(rewards: np.ndarray, gamma: float, allow_reset: bool) -> np.ndarray:
    """``Memory.GetDiscountedRewards(fGamma, bAllowReset)`` for one episode."""
    out = np.zeros_like(rewards)
    running = np.float32(0)
    for t in range(len(rewards) - 1, -1, -1):
        if allow_reset and rewards[t] != 0:
            running = np.float32(0)
        running = np.float32(running * np.float32(gamma) + rewards[t])
        out[t] = running
    return out


def np_purge_non_elite(sums: list[float], percent: float) -> list[int]:
    """``MemoryCache.PurgeNonElite``: indices of the episodes kept."""
    if percent <= 0.0 or percent >= 1.0:
        return list(range(len(sums)))
    low, high = min(sums), max(sums)
    cutoff = low + (1.0 - percent) * (high - low)
    kept = []
    for i in sorted(range(len(sums)), key=lambda i: -sums[i]):
        if sums[i] >= cutoff:
            kept.append(i)
        else:
            break
    return sorted(kept)


def np_get_epsilon(n: int, steps: int, start: float, end: float) -> float:
    """``Agent.getEpsilon(nEpisode)``."""
    if steps == 0:
        return 0.0
    if n >= steps:
        return end
    return start + n * (end - start) / steps


def test_allow_discount_reset_matches_mycaffe():
    rng = np.random.default_rng(0)
    lengths = [7, 12, 1, 9]
    rewards = np.zeros((12, 4), np.float32)
    mask = np.zeros((12, 4), np.float32)
    for b, n in enumerate(lengths):
        # Pong-like rewards: mostly 0, sometimes +1 / -1
        rewards[:n, b] = rng.choice([0.0, 0.0, 0.0, 1.0, -1.0], n)
        mask[:n, b] = 1
    for allow in (False, True):
        got = np.asarray(rule.discounted_returns(rewards, mask, 0.99, allow))
        for b, n in enumerate(lengths):
            want = np_discounted_reset(rewards[:n, b], 0.99, allow)
            np.testing.assert_allclose(got[:n, b], want, rtol=1e-6, atol=1e-7)
            assert np.all(got[n:, b] == 0)
    # on Cart-Pole (reward 1 every step) the reset makes every return 1
    ones = np.ones((5, 1), np.float32)
    np.testing.assert_array_equal(rule.discounted_returns(ones, ones, 0.99, True), ones)


@pytest.mark.parametrize("percent", [1.0, 0.0, -0.5, 0.7, 0.3, 0.999, 0.5])
def test_episode_elite_percent_matches_purge_non_elite(percent):
    rng = np.random.default_rng(3)
    for _ in range(20):
        sums = rng.integers(5, 200, 10).astype(np.float32)
        sums[rng.integers(0, 10)] = sums[rng.integers(0, 10)]  # ties
        got = np.flatnonzero(np.asarray(rule.elite_mask(jnp.asarray(sums), percent)))
        assert got.tolist() == np_purge_non_elite(sums.tolist(), percent)
    same = np.full(4, 30.0, np.float32)  # one value: everything is elite
    assert np.asarray(rule.elite_mask(jnp.asarray(same), 0.5)).tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize(
    ("steps", "start", "end"), [(0, 0.0, 0.0), (100, 1.0, 0.1), (7, 0.5, 0.5), (30, 0.9, 0.0)]
)
def test_epsilon_schedule_matches_get_epsilon(steps, start, end):
    n = np.arange(0, 3 * max(steps, 1) + 5)
    got = np.asarray(rule.epsilon(jnp.asarray(n), steps, start, end))
    want = np.array([np_get_epsilon(int(i), steps, start, end) for i in n])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", [SIGMOID, SOFTMAX])
def test_explore_matches_get_action(kind):
    """``getAction``: if eps > 0 and NextDouble() < eps, action = Next(nActionCount) and the
    recorded Aprob is its one-hot vector; otherwise the policy's draw."""
    rng = np.random.default_rng(5)
    b = 64
    n = 2 if kind == SIGMOID else 3
    probs = rng.dirichlet(np.ones(n), b).astype(np.float32)
    probs = probs[:, :1] if kind == SIGMOID else probs
    policy_action = rng.integers(0, n, b).astype(np.int32)
    eps = rng.choice([0.0, 0.3, 1.0], b).astype(np.float32)
    u = rng.random((b, 2)).astype(np.float32)
    got_p, got_a = explore(kind, jnp.asarray(probs), jnp.asarray(policy_action), eps, u)
    for i in range(b):
        if eps[i] > 0 and u[i, 0] < eps[i]:
            a = min(int(u[i, 1] * n), n - 1)
            onehot = np.eye(n, dtype=np.float32)[a]
            assert int(got_a[i]) == a
            np.testing.assert_array_equal(got_p[i], onehot[:1] if kind == SIGMOID else onehot)
        else:
            assert int(got_a[i]) == policy_action[i]
            np.testing.assert_array_equal(got_p[i], probs[i])


def test_exploration_in_the_trainer_follows_the_episode_count():
    """eps 1 for the first 8 episodes, then 0: batches of 4, so the first two batches act
    uniformly at random (one-hot probabilities), the third from the policy."""
    rl = "batch_size: 4 eps_steps: 8 eps_start: 1 eps_end: 0"
    t = PolicyGradientTrainer(solver_text(net_text(kind=SOFTMAX), rl), seed=2)
    ts = t.init()
    seen: set[float] = set()
    for batch in range(3):
        lanes = ts.lanes
        assert int(lanes.episodes) == 4 * batch
        _, k_roll = jax.random.split(ts.key)
        act = t.driver.policy_fn(ts.params, ts.state)
        traj, _ = rollout(t.env, t.rollout_options, t.policy.spec.kind, act, k_roll, lanes)
        probs, mask = np.asarray(traj.probs), np.asarray(traj.mask) > 0
        expected = np.asarray(rule.epsilon(jnp.arange(4 * batch, 4 * batch + 4), 8, 1.0, 0.0))
        for lane, eps in enumerate(expected):
            steps = probs[mask[:, lane], lane]
            one_hot = np.all(np.isin(steps, [0.0, 1.0]), axis=-1)
            if eps == 1.0:  # episode 0: every step explores
                assert one_hot.all()
            elif eps == 0.0:  # episodes 8-11: the policy's own (never 0/1) probabilities
                assert not one_hot.any()
            seen.add(float(eps))
        ts, _ = t.train_batch(ts)
    assert {1.0, 0.0} <= seen


def test_uncapped_episodes_span_several_rollout_programs():
    """cartpole-mycaffe has no step cap: with rollout_chunk 8, episodes longer than 8 steps
    still run to the fall (return == length, each ending terminated)."""
    rl = 'env: "cartpole-mycaffe" batch_size: 6 rollout_chunk: 8'
    t = PolicyGradientTrainer(solver_text(net_text(), rl), seed=4)
    assert t.config.horizon is None and t.rollout_options.horizon == 0
    ts = t.init()
    longest = 0
    for _ in range(3):
        ts, m = t.train_batch(ts)
        lengths = np.asarray(m.lengths)
        np.testing.assert_array_equal(np.asarray(m.returns), lengths)
        longest = max(longest, int(lengths.max()))
    assert longest > 8
    assert t.iterations(ts) == 3


@pytest.mark.parametrize(
    ("rl", "message"),
    [
        ("eps_start: 1.5", "eps_start must lie in [0, 1]"),
        ("eps_start: 0.1 eps_end: 0.5", "must not exceed eps_start"),
        ("rollout_chunk: 0", "rollout_chunk must be >= 1"),
    ],
)
def test_bad_options_fail_with_one_line(rl, message):
    with pytest.raises(RLError, match=message.replace("[", r"\[").replace("]", r"\]")):
        PolicyGradientTrainer(solver_text(net_text(), rl), seed=0)


def test_gymnax_acrobot_runs_in_the_jitted_rollout():
    """gymnax:Acrobot-v1 through the adapter: -1 per step until the goal, 500-step cap."""
    net = net_text(kind=SOFTMAX, actions=3).replace("channels: 4", "channels: 6")
    t = PolicyGradientTrainer(solver_text(net, 'env: "gymnax:Acrobot-v1" batch_size: 3'), seed=0)
    assert t.config.horizon == 500 and t.target == -100.0
    ts, m = t.train_batch(t.init())
    lengths, returns = np.asarray(m.lengths), np.asarray(m.returns)
    assert np.all((lengths >= 1) & (lengths <= 500))
    # -1 on every step but a terminating one (0): the return is -length or -(length - 1)
    assert np.all((returns == -lengths) | (returns == -(lengths - 1)))
    with pytest.raises(RLError, match="unknown gymnax environment"):
        PolicyGradientTrainer(solver_text(net, 'env: "gymnax:NoSuchEnv-v0"'), seed=0)
