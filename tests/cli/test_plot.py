"""`caffe2jax plot` on a `caffe2jax rl` log: the progress lines parsed, both panels drawn."""

from __future__ import annotations

from caffe2jax.cli.plot import parse_log
from tests.cli_runner import run_cli

RL_LOG = (
    "Environment ALE/Pong-v5, sigmoid policy with 2 actions, 10 episodes per update, seed 0\n"
    "Episode 10, mean return = -20.7 (last 10), running reward = -20.067, 9808 env-steps, "
    "501 env-steps/s, 19.6 s\n"
    "Snapshotting to binary proto file snap/pong_iter_50.caffemodel\n"
    "Episode 20, mean return = -20.4 (last 20), running reward = -20.061, 20157 env-steps, "
    "895 env-steps/s, 3631.1 s\n"
)


def test_parses_the_rl_progress_lines():
    log = parse_log(RL_LOG)
    assert log.rl == [(10, -20.7, -20.067, 19.6), (20, -20.4, -20.061, 3631.1)]
    assert not log.train and not log.test


def test_plots_an_rl_log(tmp_path):
    (tmp_path / "pong.log").write_text(RL_LOG)
    proc = run_cli("plot", tmp_path / "pong.log", tmp_path / "pong.png")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "pong.png").read_bytes().startswith(b"\x89PNG")
