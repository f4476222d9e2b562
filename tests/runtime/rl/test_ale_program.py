"""Atari batches played inside compiled rollouts (runtime/rl/ale_program.py): the same
episodes as the per-step loop (actions, probabilities, rewards, stored inputs, the update),
chunks crossing episodes and the batch ending inside a chunk, the episode ordering of the
chunks' steps, and the setting's errors."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

try:
    import ale_py  # noqa: F401
except ImportError as err:  # the [dev] and [atari] extras install it: missing is a failure
    raise ImportError("ale-py is missing: pip install -e '.[dev]' (or 'caffe2jax[atari]')") from err

from caffe2jax.runtime.rl import ale_eval, ale_ffi, ale_loop, ale_program
from caffe2jax.runtime.rl import trainer as trainer_module
from caffe2jax.runtime.rl.policy import RLError
from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer

KARPATHY = Path(__file__).resolve().parents[3] / "examples" / "rl" / "pong_karpathy_solver.prototxt"
# 3 episodes on 2 emulators (two overlap groups of one lane): lane 1 idles once episode 2 has
# begun on lane 0; chunks of 32 steps cross the horizon (90: points are scored by then) and
# the batch ends inside one
OPTIONS = {"seed": 4, "batch_size": 3, "num_envs": 2, "horizon": 90, "rollout_chunk": 32}


@pytest.fixture(scope="module")
def pair() -> tuple[PolicyGradientTrainer, PolicyGradientTrainer]:
    steps = PolicyGradientTrainer(KARPATHY, **OPTIONS)
    program = PolicyGradientTrainer(KARPATHY, ale_rollout="program", **OPTIONS)
    assert isinstance(program.driver, ale_ffi.AleFfi)  # ale-py 0.12 has the custom calls
    program.driver = ale_program.AleProgram(program)  # the io_callback program (no custom calls)
    # one compilation of the update for both (the same learn_fn of the same net and solver;
    # test_snapshot.py's resume runs the program trainer's own)
    program.learn = steps.learn
    return steps, program


def _leaves(ts) -> list[np.ndarray]:
    """Everything a PolicyState holds, as NumPy arrays (the key as its data)."""
    tree = (ts.params, ts.state, ts.opt_state, ts.lanes, jax.random.key_data(ts.key))
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_the_setting_picks_the_driver(pair, monkeypatch):
    """``"program"``: ale-py's custom calls where it has them (:mod:`.ale_ffi`), else the
    io_callbacks; ``"steps"``: the per-step loop."""
    steps, program = pair
    assert steps.config.ale_rollout == "steps" and isinstance(steps.driver, ale_loop.AleLoop)
    assert len(program.ale.groups) == 2  # overlap's groups: each draws with its own key
    monkeypatch.setattr(trainer_module, "ale_ffi_available", lambda: False)
    older = PolicyGradientTrainer(KARPATHY, ale_rollout="program", **OPTIONS)
    assert type(older.driver) is ale_program.AleProgram


def test_the_program_plays_the_loops_episodes_and_update(pair, monkeypatch):
    """From the same state (params, key, episode counter) a batch of each: the update sees
    the same trajectory bit for bit (stored inputs, actions, probabilities, rewards, mask),
    and the next states are equal (params, RMSProp history, key, counter)."""
    seen = []
    for trainer in pair:
        learn = trainer.learn
        monkeypatch.setattr(trainer, "learn", lambda *a, f=learn: seen.append(a[3]) or f(*a))
    steps, program = pair
    ts = steps.init()
    ts = ts._replace(lanes=ts.lanes.replace(episodes=ts.lanes.episodes + 3))  # episodes 3-5
    (ts_a, m_a), (ts_b, m_b) = steps.train_batch(ts), program.train_batch(ts)
    want, got = seen
    for a, b in zip(want, got):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    lengths = np.asarray(want.mask).sum(0)
    assert lengths.tolist() == [90, 90, 90] and np.abs(np.asarray(want.rewards)).sum() > 0
    np.testing.assert_array_equal(np.asarray(m_a.returns), np.asarray(m_b.returns))
    for a, b in zip(_leaves(ts_a), _leaves(ts_b)):
        np.testing.assert_array_equal(a, b)
    assert int(ts_b.lanes.episodes) == 6
    assert any(not np.array_equal(a, b) for a, b in zip(_leaves(ts), _leaves(ts_b)))


def test_lanes_restart_inside_a_chunk_and_idle_after_the_last_episode(pair):
    """A lane whose episode stops inside a chunk takes the batch's next episode from a reset,
    its first input zero; with none left it idles (-1), and once no lane plays the rest of the
    chunk is skipped and no further chunk runs."""
    _, program = pair
    ts = program.init()
    lanes = program.driver.lanes
    lanes.horizon = 10  # shorter episodes: restarts inside the first chunk
    try:
        played, (x, *_rest) = program.driver.play(ts.params, ts.state, ts.key, 0, 3)
    finally:
        lanes.horizon = OPTIONS["horizon"]
    assert played.shape == (32, 2)  # one chunk: the batch ended inside it
    # lane 1 (the second group) is collected one row late: its step runs while lane 0's
    # forward computes (the loop's overlap, pipelined inside the program)
    assert played[:, 0].tolist() == [0] * 10 + [2] * 10 + [-1] * 12
    assert played[:, 1].tolist() == [-1] + [1] * 10 + [-1] * 21
    assert not x[10, 0].any()  # episode 2's first input: zero
    assert x[11:20, 0].any()  # then the differences of its frames


def test_evaluation_plays_the_per_step_loop_on_the_same_emulators(pair):
    """``caffe2jax rl --test`` with ``ale_rollout: "program"`` (greedy or sampled play,
    screens for a GIF) runs the per-step loop: the same results as with ``"steps"``."""
    steps, program = pair
    ts = steps.init()
    a, _ = ale_eval.evaluate(steps, ts.params, ts.state, episodes=1, greedy=False, seed=2)
    b, screens = ale_eval.evaluate(program, ts.params, ts.state, 1, False, 2, frames=3)
    assert a.returns.tolist() == b.returns.tolist() and a.lengths.tolist() == [90]
    assert b.lengths.tolist() == [90] and len(screens) == 3


def test_trajectory_orders_steps_by_episode():
    # (T=4, n=2): lane 0 plays episode 0 for 3 steps then episode 2; lane 1 episode 1, idle
    played = np.array([[0, 1], [0, 1], [0, -1], [2, -1]], np.int32)
    x = np.arange(8, dtype=np.uint8).reshape(4, 2, 1)
    probs = np.arange(8, dtype=np.float32).reshape(4, 2, 1) / 10
    actions = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], np.int32)
    rewards = np.array([[0, 0], [1, 0], [0, 0], [-1, 0]], np.float32)
    traj = ale_program.trajectory(played, (x, probs, actions, rewards), 3)
    assert np.asarray(traj.x).shape == (64, 3, 1)  # padded to the update's bucket
    np.testing.assert_array_equal(np.asarray(traj.x)[:3, :, 0], [[0, 1, 6], [2, 3, 0], [4, 0, 0]])
    np.testing.assert_array_equal(np.asarray(traj.mask).sum(0), [3, 2, 1])
    np.testing.assert_array_equal(np.asarray(traj.rewards)[:3], [[0, 0, -1], [1, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(np.asarray(traj.actions)[:2], [[1, 0, 0], [0, 1, 0]])


def test_the_solver_and_the_cli_name_the_setting(tmp_path):
    from caffe2jax.cli.main import build_parser
    from caffe2jax.frontend.parse import read_solver
    from caffe2jax.runtime.rl import config

    path = tmp_path / "solver.prototxt"
    path.write_text(
        KARPATHY.read_text().replace("num_envs: 10", 'num_envs: 10 ale_rollout: "program"')
    )
    assert config.from_solver(read_solver(path)).ale_rollout == "program"
    assert config.from_solver(read_solver(KARPATHY)).ale_rollout == "steps"  # the default
    args = build_parser().parse_args(["rl", "--solver", str(path), "--ale-rollout", "steps"])
    assert args.ale_rollout == "steps"


def test_a_bad_setting_fails_with_one_line():
    with pytest.raises(RLError, match="ale_rollout must be one of 'program', 'steps', got 'xla'"):
        PolicyGradientTrainer(KARPATHY, seed=0, ale_rollout="xla")
