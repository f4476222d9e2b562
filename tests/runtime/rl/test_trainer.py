"""The jitted policy-gradient trainer: compilation, reproducibility, rollouts, errors, the
Gymnasium host path, the CLI, and learning Cart-Pole."""

from __future__ import annotations

import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.cli.main import main
from caffe2jax.runtime.formats.weights import load_weights
from caffe2jax.runtime.rl import rollout as ro
from caffe2jax.runtime.rl.config import UNCAPPED_TARGET
from caffe2jax.runtime.rl.envs import cartpole_v1
from caffe2jax.runtime.rl.policy import SIGMOID, SOFTMAX, RLError
from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer
from tests.runtime.rl.test_rule import net_text, solver_text

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "rl"
SIGMOID_SOLVER = EXAMPLES / "cartpole_sigmoid_solver.prototxt"
SOFTMAX_SOLVER = EXAMPLES / "cartpole_softmax_solver.prototxt"

try:
    import gymnasium
except ImportError:
    gymnasium = None


@pytest.fixture(scope="module")
def trainer() -> PolicyGradientTrainer:
    return PolicyGradientTrainer(solver_text(net_text(), "batch_size: 4"), seed=11)


def _returns(trainer: PolicyGradientTrainer, batches: int, seed: int | None = None) -> tuple:
    ts = trainer.init(seed)
    out = []
    for _ in range(batches):
        ts, metrics = trainer.train_batch(ts)
        out.append(np.asarray(metrics.returns))
    return np.concatenate(out), ts


def test_compiles_once_and_counts_real_steps(trainer):
    ts = trainer.init()
    before = trainer.driver.traces
    total = 0
    for _ in range(3):
        ts, metrics = trainer.train_batch(ts)
        lengths = np.asarray(metrics.lengths)
        # Cart-Pole pays 1 per step, termination included: return == length == real steps
        np.testing.assert_array_equal(np.asarray(metrics.returns), lengths)
        assert int(metrics.steps) == lengths.sum() and np.all(lengths >= 1)
        total += int(metrics.steps)
    assert trainer.driver.traces - before <= 1 and trainer.driver.traces == 1
    assert trainer.iterations(ts) == 3  # one solver update per batch
    assert total < 3 * 4 * trainer.config.horizon


def test_seed_reproduces_and_differs(trainer):
    a, ts_a = _returns(trainer, 3, seed=5)
    again = PolicyGradientTrainer(solver_text(net_text(), "batch_size: 4"), seed=5)
    b, ts_b = _returns(again, 3)
    c, _ = _returns(trainer, 3, seed=6)
    np.testing.assert_array_equal(a, b)
    for x, y in zip(jax.tree.leaves(ts_a.params), jax.tree.leaves(ts_b.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not np.array_equal(a, c)


def _rollout(opts: ro.RolloutOptions, kind: str = SIGMOID, batch: int = 5, blind: bool = False):
    """Play a fixed policy without a net: P(action 0) rises with the pole angle, or is 1/2
    whatever the input (``blind``: the same actions whatever the preprocessing)."""

    def act(x):
        p0 = jax.nn.sigmoid(-8 * x[:, 2] - 2 * x[:, 3])[:, None]
        p0 = jnp.full_like(p0, 0.5) if blind else p0
        return p0 if kind == SIGMOID else jnp.concatenate([p0, 1 - p0], axis=1)

    return ro.rollout(cartpole_v1(), opts, kind, act, jax.random.key(3), ro.new_lanes(batch, 4))


def test_loop_forms_and_reset_modes_play_the_same_episodes():
    base = ro.RolloutOptions(horizon=500, chunk=32)
    ref, _ = _rollout(base)
    lengths = np.asarray(ref.mask.sum(0))
    assert np.all(lengths > 0)
    mask = np.asarray(ref.mask)
    assert np.all(mask[1:] <= mask[:-1])  # each episode is a prefix of the padded batch
    for opts in (ro.RolloutOptions(500, chunk=0), ro.RolloutOptions(500, 32, reset_mode="auto")):
        other, _ = _rollout(opts)
        np.testing.assert_array_equal(np.asarray(other.mask)[:500], mask[:500])
        for a, b in zip(other, ref):  # equal on the real steps (auto mode differs after them)
            real = mask[:500].reshape(500, 5, *([1] * (np.ndim(a) - 2))) > 0
            np.testing.assert_array_equal(
                np.where(real, np.asarray(a)[:500], 0), np.where(real, np.asarray(b)[:500], 0)
            )


def test_action_draws():
    """MyCaffe's act: Sigmoid u < Aprob → 0; Softmax the first cumulative sum above u."""
    u = jnp.asarray([0.1, 0.29, 0.31, 0.99, 0.5])
    p0 = jnp.asarray([0.3, 0.3, 0.3, 0.3, 0.0])[:, None]
    np.testing.assert_array_equal(ro.sample(SIGMOID, p0, u), [0, 0, 1, 1, 1])
    probs = jnp.asarray([[0.3, 0.3, 0.4]] * 4 + [[0.5, 0.49, 0.0]])
    np.testing.assert_array_equal(ro.sample(SOFTMAX, probs, u), [0, 0, 1, 2, 1])
    last = ro.sample(SOFTMAX, jnp.asarray([[0.5, 0.49]]), jnp.asarray([0.995]))
    np.testing.assert_array_equal(last, [1])  # sums short of u: the last action


def test_stale_and_difference_inputs():
    fresh, _ = _rollout(ro.RolloutOptions(500, 32), blind=True)
    stale, _ = _rollout(ro.RolloutOptions(500, 32, stale_observation=True), blind=True)
    x, s = np.asarray(fresh.x), np.asarray(stale.x)
    np.testing.assert_array_equal(s[0], x[0])  # the reset observation, twice
    np.testing.assert_array_equal(s[1], x[0])
    assert not np.array_equal(s[2], s[1])
    diff, lanes = _rollout(ro.RolloutOptions(500, 32, difference_input=True), blind=True)
    d = np.asarray(diff.x)
    np.testing.assert_array_equal(d[0], 0)  # MyCaffe zeroes the first input
    np.testing.assert_allclose(d[1], x[1] - x[0], atol=1e-7)
    # the lane memory keeps each lane's last input for the next batch (m_sdLast)
    last_step = np.asarray(diff.mask).sum(0).astype(int) - 1
    assert np.all(np.asarray(lanes.has_last))
    np.testing.assert_allclose(np.asarray(lanes.last), x[last_step, np.arange(5)], atol=1e-7)


def test_mycaffe_env_defaults():
    t = PolicyGradientTrainer(solver_text(net_text(), 'env: "cartpole-mycaffe"'), seed=0)
    cfg = t.config
    assert cfg.difference_input and cfg.stale_observation and cfg.horizon is None
    assert t.env.max_episode_steps == 0
    assert math.isclose(t.env.theta_threshold_radians, 20 * math.pi / 180)
    assert t.target == pytest.approx(UNCAPPED_TARGET)
    plain = PolicyGradientTrainer(
        solver_text(net_text(), 'env: "cartpole-mycaffe" difference_input: false max_steps: 50'),
        seed=0,
    )
    assert not plain.config.difference_input and plain.config.horizon == 50
    v1 = PolicyGradientTrainer(solver_text(net_text(), "pole_angle_limit_deg: 15"), seed=0)
    assert not v1.config.difference_input and v1.config.horizon == 500 and v1.target == 475
    assert math.isclose(v1.env.theta_threshold_radians, 15 * math.pi / 180)


@pytest.mark.parametrize(
    ("solver", "message"),
    [
        (solver_text(net_text(data=False)), "MemoryData"),
        (solver_text(net_text(loss=False)), "MemoryLoss"),
        (solver_text(net_text("softmax", actions=3)), "3 actions"),
        (solver_text(net_text(), 'env: "pong"'), "unknown environment 'pong'"),
        (solver_text(net_text().replace("channels: 4", "channels: 3")), "observes 4"),
    ],
)
def test_errors(solver, message, tmp_path, capsys):
    with pytest.raises(RLError, match=message):
        PolicyGradientTrainer(solver)
    path = tmp_path / "solver.prototxt"
    path.write_text(solver)
    assert main(["rl", "--solver", str(path), "--episodes", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("caffe2jax rl: error:") and message in err[0]


@pytest.mark.skipif(gymnasium is None, reason="gymnasium is not installed")
def test_gymnasium_host_path():
    t = PolicyGradientTrainer(
        solver_text(net_text("softmax"), "batch_size: 2"), env="gym:CartPole-v1", seed=1
    )
    assert t.target == 475  # CartPole-v1's reward_threshold
    result = t.run(episodes=4)
    assert len(result.returns) == 4 and result.steps == sum(result.returns)
    assert t.iterations(result.state) == 2
    with pytest.raises(RLError, match="3 actions"):
        PolicyGradientTrainer(solver_text(net_text("softmax", 3)), env="gym:CartPole-v1")


def test_learns_cartpole_v1_and_cli(tmp_path, capsys):
    """The Softmax example solves CartPole-v1 (mean ≥ 475 over 100 episodes) with seed 0;
    the CLI prints exactly one Solved line and writes a loadable snapshot."""
    prefix = tmp_path / "snap" / "policy"
    args = ["rl", "--solver", str(SOFTMAX_SOLVER), "--seed", "0", "--episodes", "1500"]
    assert main([*args, "--snapshot-prefix", str(prefix)]) == 0
    out = capsys.readouterr().out
    solved = [line for line in out.splitlines() if line.startswith("Solved:")]
    assert len(solved) == 1, out
    pattern = (
        r"Solved: mean return (\d+\.\d) over the last 100 episodes at episode (\d+) "
        r"\(\d+\.\d s, \d+ env-steps/s\)"
    )
    match = re.fullmatch(pattern, solved[0])
    assert match and float(match.group(1)) >= 475 and int(match.group(2)) <= 1500
    snapshots = list(prefix.parent.glob("policy_iter_*.caffemodel"))
    assert len(snapshots) == 1
    trainer = PolicyGradientTrainer(SOFTMAX_SOLVER, seed=0)
    initial = trainer.init().params
    params, _ = load_weights(snapshots[0], trainer.model)
    for name, blobs in initial.items():
        for start, trained in zip(blobs, params[name]):
            assert start.shape == trained.shape
            assert not np.array_equal(np.asarray(start), np.asarray(trained))
