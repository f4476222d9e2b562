"""The update entry of rl_param (runtime/rl/update.py) as the trainer runs it: defaults and
errors, PG unchanged when named, the multi-step wrapper over Caffe's solver, and exact resume
of TRPO and PPO runs from snapshots."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np
import pytest

from caffe2jax.cli.main import main
from caffe2jax.frontend import caffe_pb2
from caffe2jax.runtime.rl import update
from caffe2jax.runtime.rl.policy import RLError
from caffe2jax.runtime.rl.snapshot import read_snapshot, write_snapshot
from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer
from tests.runtime.rl.test_learners import VALUE_HEAD
from tests.runtime.rl.test_rule import net_text, solver_text
from tests.runtime.rl.test_trpo import _batch


def test_defaults_are_the_references():
    """Schulman's TRPO (CG 10, damping 0.1, max KL 0.01, backtracking ½ over 10 fractions,
    accept ratio 0.1), PPO's clip 0.2; an unset entry is MyCaffe's PG, one step."""
    rl = caffe_pb2.RLParameter()
    assert update.from_proto(rl) == update.UpdateSettings() and update.from_proto(rl).is_default
    rl.update.type = "trpo"
    s = update.from_proto(rl)
    assert (s.type, s.cg_iterations, s.cg_damping, s.max_kl) == ("TRPO", 10, 0.1, 0.01)
    assert (s.line_search_steps, s.backtrack, s.accept_ratio, s.clip) == (10, 0.5, 0.1, 0.2)
    assert s.kl_factor == 1.5 and not s.is_default


@pytest.mark.parametrize(
    "entry, message",
    [
        ('type: "A3C"', "update type must be one of PG, TRPO, PPO; got 'A3C'"),
        ('type: "PPO" clip: 1.5', "clip must lie in (0, 1), got 1.5"),
        ('type: "TRPO" steps: 0', "steps must be >= 1, got 0"),
        ('type: "TRPO" max_kl: 0', "needs max_kl > 0"),
        ('type: "TRPO" backtrack: 1', "backtrack must lie in (0, 1)"),
    ],
)
def test_bad_entries_fail_in_one_line(entry, message, tmp_path, capsys):
    solver = tmp_path / "solver.prototxt"
    solver.write_text(solver_text(net_text(), f"update {{ {entry} }}"))
    with pytest.raises(RLError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PolicyGradientTrainer(solver)
    assert main(["rl", "--solver", str(solver), "--episodes", "1"]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_pg_named_is_the_default_bit_for_bit():
    rl = 'env: "cartpole-v1" batch_size: 3'
    plain = PolicyGradientTrainer(solver_text(net_text(), rl), seed=4).run(episodes=9)
    named = PolicyGradientTrainer(solver_text(net_text(), rl + ' update { type: "PG" }'), seed=4)
    result = named.run(episodes=9)
    assert result.returns == plain.returns
    for a, b in zip(_leaves(plain.state.params), _leaves(result.state.params)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["sigmoid", "softmax"])
def test_multi_step_is_k_solver_updates_on_one_batch(kind):
    """steps: 3 with RMSProp = three PG updates in a row on the same episodes (each at the
    params and solver history the previous left), iter + 3."""
    solver = 'type: "RMSProp" base_lr: 0.01 rms_decay: 0.9'
    one = PolicyGradientTrainer(solver_text(net_text(kind), 'env: "cartpole-v1"', solver))
    three = PolicyGradientTrainer(
        solver_text(net_text(kind), 'env: "cartpole-v1" update { steps: 3 }', solver)
    )
    ts, traj = _batch(one)
    params, opt_state = ts.params, ts.opt_state
    for _ in range(3):
        params, opt_state = one.learn(params, ts.state, opt_state, traj)
    got, got_state = three.learn(ts.params, ts.state, ts.opt_state, traj)
    for a, b in zip(_leaves((params, opt_state)), _leaves((got, got_state))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)  # fori_loop vs 3 programs
    assert three.iterations(ts._replace(opt_state=got_state)) == 3


@pytest.mark.parametrize(
    "entry",
    ['type: "TRPO" steps: 2', 'type: "PPO" epochs: 2',
     'type: "PPO" epochs: 2 value_blob: "value" chunk_rows: 40'],
)  # fmt: skip
def test_trpo_and_ppo_resume_exactly(tmp_path, entry):
    """A run snapshotted after 2 updates and resumed plays the episodes and reaches the
    params, solver history and iter of the uninterrupted run (PPO's deal follows the seed
    and the solverstate's iter; a value head's params and history are the net's)."""
    rl = f'env: "cartpole-mycaffe" batch_size: 3 max_steps: 80 update {{ {entry} }}'
    net = net_text("softmax") + ("\n" + VALUE_HEAD if "value_blob" in entry else "")
    t = PolicyGradientTrainer(solver_text(net, rl, 'type: "Adam" base_lr: 0.01'),
                              seed=2)  # fmt: skip
    whole = t.run(episodes=12)
    part = t.run(episodes=6)
    paths = write_snapshot(t, part, str(tmp_path / "c"))
    resumed = read_snapshot(t, paths[1])
    rest = t.run(episodes=12, resume=resumed)
    assert rest.returns == whole.returns and t.iterations(rest.state) > 4
    for a, b in zip(_leaves(whole.state.params), _leaves(rest.state.params)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(_leaves(whole.state.opt_state), _leaves(rest.state.opt_state)):
        np.testing.assert_array_equal(a, b)


EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "rl"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cartpole_trpo_solver", "cartpole_ppo_solver"])
def test_examples_solve_cartpole_v1_from_the_cli(name, tmp_path, monkeypatch, capsys):
    """The shipped TRPO and PPO solvers solve CartPole-v1 (mean ≥ 475 over 100 episodes) from
    ``caffe2jax rl`` with seed 0 within 240 s (measured on 2 shared CPU cores: TRPO at episode
    423 in 18 s, PPO at 559 in 15 s)."""
    monkeypatch.chdir(tmp_path)  # the solvers' snapshot_prefix is relative
    assert main(["rl", "--solver", str(EXAMPLES / f"{name}.prototxt"), "--seed", "0"]) == 0
    out = capsys.readouterr().out
    solved = [line for line in out.splitlines() if line.startswith("Solved:")]
    assert len(solved) == 1, out
    match = re.fullmatch(r"Solved: mean return (\d+\.\d) over the last 100 episodes at episode "
                         r"(\d+) \((\d+\.\d) s, \d+ env-steps/s\)", solved[0])  # fmt: skip
    assert match and float(match.group(1)) >= 475 and float(match.group(3)) <= 240


def test_snapshot_cadence_with_several_updates_a_batch(tmp_path):
    """PPO makes epochs × minibatches = 6 solver updates a batch: ``snapshot: 4`` writes one
    whenever a multiple of 4 was passed (iters 6, 12, 18), not only on exact multiples."""
    rl = 'env: "cartpole-v1" batch_size: 2 update { type: "PPO" epochs: 2 minibatches: 3 }'
    solver = tmp_path / "solver.prototxt"
    solver.write_text(solver_text(net_text(), rl, 'type: "SGD" base_lr: 0.01\nsnapshot: 4'))
    prefix = tmp_path / "p"
    args = ["rl", "--solver", str(solver), "--episodes", "6", "--snapshot-prefix", str(prefix)]
    assert main(args) == 0
    written = sorted(int(p.stem.split("_")[-1]) for p in tmp_path.glob("p_iter_*.solverstate"))
    assert written == [6, 12, 18]
