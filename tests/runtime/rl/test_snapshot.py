"""Snapshots and exact resume (runtime/rl/snapshot.py): after ``kill -9`` a resumed Pong run
plays the same episodes as an uninterrupted one; Ctrl-C snapshots and stops; Cart-Pole resumes
exactly too; mismatched or unsupported resumes are refused."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

try:
    import ale_py  # noqa: F401
except ImportError as err:  # the [dev] and [atari] extras install it: missing is a failure
    raise ImportError("ale-py is missing: pip install -e '.[dev]' (or 'caffe2jax[atari]')") from err

from caffe2jax.runtime.formats.snapshot import parse_record, resume_path
from caffe2jax.runtime.rl.ale_program import AleProgram
from caffe2jax.runtime.rl.policy import RLError
from caffe2jax.runtime.rl.snapshot import read_snapshot, write_snapshot
from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer
from tests.runtime.formats.test_snapshot import v1_rl_text
from tests.runtime.rl.test_rule import net_text, solver_text

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "rl"


def _pong_solver(folder: Path, snapshot: int = 1) -> Path:
    """Karpathy's Pong net; 2 episodes per update on 2 emulators, episodes cut at 150 steps
    (points are scored in that time), 10 episodes in all, a snapshot every update."""
    text = (EXAMPLES / "pong_karpathy_solver.prototxt").read_text()
    text = text.replace(
        'net: "pong_karpathy.prototxt"', f'net: "{EXAMPLES}/pong_karpathy.prototxt"'
    )
    text = text.replace("snapshot: 50", f"snapshot: {snapshot}")
    text = text.replace("num_envs: 10", "num_envs: 2 batch_size: 2 horizon: 150")
    text = text.replace("max_episodes: 20000", "max_episodes: 10")
    path = folder / "solver.prototxt"
    path.write_text(text)
    return path


def _cli(solver: Path, prefix: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "caffe2jax", "rl", "--solver", str(solver), "--seed", "7",
            "--every", "2", "--snapshot-prefix", str(prefix), *extra]  # fmt: skip


def _final(prefix: Path, iteration: int) -> tuple[list[float], bytes]:
    state = Path(f"{prefix}_iter_{iteration}.solverstate")
    record = parse_record(Path(f"{state}.resume.json").read_text())
    return record.values["returns"], Path(f"{prefix}_iter_{iteration}.caffemodel").read_bytes()


def _wait_for(path: Path, proc: subprocess.Popen, limit: float = 300) -> None:
    start = time.monotonic()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - start < limit, f"{path} never appeared"
        time.sleep(0.05)


def test_resume_after_kill_9_replays_the_same_episodes(tmp_path):
    solver = _pong_solver(tmp_path)
    whole = subprocess.run(_cli(solver, tmp_path / "a" / "p"), capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    returns, weights = _final(tmp_path / "a" / "p", 5)
    assert len(returns) == 10 and any(returns)  # points were scored

    prefix = tmp_path / "b" / "p"
    proc = subprocess.Popen(_cli(solver, prefix), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(Path(f"{prefix}_iter_2.solverstate"), proc)
    proc.send_signal(signal.SIGKILL)  # kill -9: no handler, no clean-up
    proc.communicate()
    again = subprocess.run(_cli(solver, prefix, "--snapshot", f"{prefix}_iter_2.solverstate"),
                           capture_output=True, text=True)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "Resuming from" in again.stdout and "at episode 4" in again.stdout
    assert _final(prefix, 5) == (returns, weights)  # the same episodes, the same weights


def test_ctrl_c_snapshots_stops_and_resumes(tmp_path):
    solver = _pong_solver(tmp_path, snapshot=0)  # no cadence: only Ctrl-C writes one
    prefix = tmp_path / "p"
    proc = subprocess.Popen(_cli(solver, prefix), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdout.readline().startswith("Environment ALE/Pong-v5")
    assert proc.stdout.readline().startswith("Episode 2, mean return")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "stopping after this batch" in err and "Stopped (Ctrl-C) after" in out
    written = sorted(prefix.parent.glob("p_iter_*.solverstate"))
    assert len(written) == 1
    n = int(written[0].name.split("_")[2].split(".")[0])
    record = parse_record(Path(f"{written[0]}.resume.json").read_text())
    assert len(record.values["returns"]) == 2 * n and record.values["running"] is not None
    resumed = subprocess.run(_cli(solver, prefix, "--snapshot", str(written[0])),
                             capture_output=True, text=True)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "Stopped after 10 episodes" in resumed.stdout


def _arrays(ts) -> list[np.ndarray]:
    """Everything a PolicyState holds, as NumPy arrays (the key as its data)."""
    tree = (ts.params, ts.state, ts.opt_state, ts.lanes, jax.random.key_data(ts.key))
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("version", [2, 1])
def test_cartpole_resumes_exactly(tmp_path, version):
    """MyCaffe's Cart-Pole: the lanes' difference memory crosses batches, so it must too;
    a record in the schema written before the snapshot record was shared (version 1) too."""
    solver = solver_text(net_text(), 'env: "cartpole-mycaffe" batch_size: 3 max_steps: 80')
    t = PolicyGradientTrainer(solver, seed=2)
    whole = t.run(episodes=12)
    part = t.run(episodes=6)
    write_snapshot(t, part, str(tmp_path / "c"))
    if version == 1:
        sidecar = resume_path(tmp_path / "c_iter_2.solverstate")
        sidecar.write_text(v1_rl_text(parse_record(sidecar.read_text())))
    resumed = read_snapshot(t, tmp_path / "c_iter_2.solverstate")
    assert resumed.returns == part.returns and resumed.running == part.running
    assert np.asarray(resumed.state.lanes.has_last).all()  # the memory crossed the snapshot
    rest = t.run(episodes=12, resume=resumed)
    assert rest.returns == whole.returns and rest.running == whole.running
    for a, b in zip(_arrays(whole.state), _arrays(rest.state)):
        np.testing.assert_array_equal(a, b)


def test_refuses_another_seed_and_gym_envs(tmp_path):
    solver = solver_text(net_text(), "batch_size: 2")
    t = PolicyGradientTrainer(solver, seed=1)
    write_snapshot(t, t.run(episodes=2), str(tmp_path / "s"))
    with pytest.raises(RLError, match="the snapshot's seed is 1, this run's is 3"):
        read_snapshot(PolicyGradientTrainer(solver, seed=3), tmp_path / "s_iter_1.solverstate")
    with pytest.raises(RLError, match="needs the solverstate"):
        read_snapshot(t, tmp_path / "nothing.solverstate")
    gym = PolicyGradientTrainer(solver, seed=1, env="gym:CartPole-v1")
    with pytest.raises(RLError, match="gym: environments cannot resume"):
        read_snapshot(gym, tmp_path / "s_iter_1.solverstate")


def test_pong_ppo_resumes_exactly(tmp_path):
    """examples/rl/pong_karpathy_ppo_solver.prototxt (Karpathy's net, PPO: 3 epochs × 4
    minibatches a batch) on 2 emulators, 2 episodes a batch cut at 100 steps, the policy
    evaluated 64 rows at a time: snapshotted after 2 batches and resumed, the run plays the
    same episodes and ends with the params, Adam history, iter and PRNG key of the
    uninterrupted run."""
    solver = EXAMPLES / "pong_karpathy_ppo_solver.prototxt"
    t = PolicyGradientTrainer(solver, seed=5, batch_size=2, num_envs=2, horizon=100)
    assert (t.config.update.type, t.config.update.epochs, t.config.update.minibatches) == (
        "PPO", 3, 4)  # fmt: skip
    chunked = dataclasses.replace(t.config.update, chunk_rows=64)
    t.learning = dataclasses.replace(t.learning, settings=chunked)
    whole = t.run(episodes=8)
    part = t.run(episodes=4)
    write_snapshot(t, part, str(tmp_path / "p"))
    assert t.iterations(part.state) == 24  # 2 batches × 12 minibatch updates
    resumed = read_snapshot(t, tmp_path / "p_iter_24.solverstate")
    rest = t.run(episodes=8, resume=resumed)
    assert rest.returns == whole.returns and rest.steps == whole.steps
    for a, b in zip(_arrays(whole.state), _arrays(rest.state)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("callbacks", [False, True])
def test_pong_in_program_resumes_exactly(tmp_path, callbacks):
    """``ale_rollout: "program"`` (the emulators stepped inside the compiled rollout as
    ale-py's custom calls, or through io_callbacks; chunks of 16 agent steps crossing the
    30-step horizon) on 2 emulators, 2 episodes a batch:
    snapshotted after one batch and resumed, the run plays the same episodes and ends with the
    params, RMSProp history, iter and PRNG key of the uninterrupted run."""
    options = {"batch_size": 2, "num_envs": 2, "horizon": 30, "rollout_chunk": 16}
    solver = EXAMPLES / "pong_karpathy_solver.prototxt"
    t = PolicyGradientTrainer(solver, seed=6, ale_rollout="program", **options)
    if callbacks:
        t.driver = AleProgram(t)
    whole = t.run(episodes=4)
    part = t.run(episodes=2)
    write_snapshot(t, part, str(tmp_path / "p"))
    resumed = read_snapshot(t, tmp_path / "p_iter_1.solverstate")
    rest = t.run(episodes=4, resume=resumed)
    assert rest.returns == whole.returns and rest.steps == whole.steps == 120
    for a, b in zip(_arrays(whole.state), _arrays(rest.state)):
        np.testing.assert_array_equal(a, b)
