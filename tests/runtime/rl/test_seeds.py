"""Many seeds in one program: the vmapped trainer, solve detection, the CLI."""

from __future__ import annotations

import re

import numpy as np
import pytest

from caffe2jax.cli.main import main
from caffe2jax.runtime.rl.policy import RLError
from caffe2jax.runtime.rl.seeds import _mark_solved, parse_seeds, trailing_means, train_seeds
from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer, RunResult, _extend
from tests.runtime.rl.test_rule import net_text, solver_text


def test_parse_seeds():
    assert parse_seeds("0-3") == [0, 1, 2, 3]
    assert parse_seeds("0-2,7") == [0, 1, 2, 7]
    for bad in ("a-b", "1,1", ""):
        with pytest.raises(RLError, match="--seeds"):
            parse_seeds(bad)


def test_solve_detection_matches_the_single_seed_rule():
    rng = np.random.default_rng(0)
    returns = np.cumsum(rng.integers(0, 4, (5, 400)), axis=1).astype(np.float64)
    target = 300.0
    solved: list[int | None] = [None] * 5
    for end in range(50, 401, 50):  # batches of 50 episodes
        _mark_solved(returns[:, :end], solved, target, end - 50)
    for i in range(5):
        single = RunResult(state=None)
        _extend(single, returns[i], target)
        assert solved[i] == single.solved_at
    means = trailing_means(returns)
    np.testing.assert_allclose(means[:, 99], returns[:, :100].mean(1))
    np.testing.assert_allclose(means[:, 9], returns[:, :10].mean(1))


def test_vmapped_seeds_match_separate_trainers():
    solver = solver_text(net_text(), "batch_size: 4")
    seeds = [3, 8]
    result = train_seeds(PolicyGradientTrainer(solver, seed=0), seeds, 8, None)
    assert result.returns.shape == (2, 8) and result.solved_at == [None, None]
    for row, seed in zip(result.returns, seeds):
        t = PolicyGradientTrainer(solver, seed=seed)
        ts, first = t.train_batch(t.init())
        # same params, keys and lanes per seed: the first batch plays the same episodes
        np.testing.assert_array_equal(row[:4], np.asarray(first.returns))


def test_seeds_cli(tmp_path, capsys):
    solver = tmp_path / "solver.prototxt"
    solver.write_text(solver_text(net_text(), "batch_size: 5 max_steps: 30"))
    args = ["rl", "--solver", str(solver), "--seeds", "0-2", "--episodes", "150"]
    assert main([*args, "--target", "5", "--plot", str(tmp_path / "seeds.png")]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"^Seed \d: solved at episode 100$", out, re.M)) == 3, out
    assert "Solved 3/3 seeds (target 5)" in out and (tmp_path / "seeds.png").stat().st_size
