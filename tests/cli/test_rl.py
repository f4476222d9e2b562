"""`caffe2jax rl` on the command line: the progress lines `caffe2jax plot` reads, and a trained
Atari policy tested and drawn into a GIF."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PIL import Image

from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer
from tests.cli_runner import run_cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "rl"
PROGRESS = re.compile(
    r"Episode (\d+), mean return = -?\d+\.\d \(last \d+\), running reward = -?\d+\.\d{3}, "
    r"\d+ env-steps, \d+ env-steps/s, \d+\.\d s"
)


def test_progress_lines_carry_the_running_reward_and_the_time(tmp_path):
    solver = EXAMPLES / "cartpole_softmax_solver.prototxt"
    proc = run_cli("rl", "--solver", solver, "--seed", "0", "--episodes", "30", "--every", "10",
                   cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # the solver's relative snapshot_prefix lands in the working directory, as in Caffe
    assert (tmp_path / "cartpole_softmax_iter_3.caffemodel").is_file()
    lines = [line for line in proc.stdout.splitlines() if line.startswith("Episode")]
    assert [PROGRESS.fullmatch(line).group(1) for line in lines] == ["10", "20", "30"]
    assert re.search(r"Stopped after 30 episodes: .* running reward -?\d+\.\d{3} ", proc.stdout)


def test_an_atari_policy_is_tested_and_drawn(tmp_path):
    solver = EXAMPLES / "pong_karpathy_solver.prototxt"
    trainer = PolicyGradientTrainer(solver, seed=0)
    weights = tmp_path / "pong.caffemodel"
    trainer.save(weights, trainer.init())
    gif = tmp_path / "pong.gif"
    proc = run_cli("rl", "--solver", solver, "--test", "--weights", weights, "--episodes", "2",
                   "--horizon", "40", "--render", gif, "--frames", "25")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.search(
        r"Test: 2 episodes on ALE/Pong-v5 \(greedy\): mean return -?\d+\.\d ± \d+\.\d .*; "
        r"2 stopped at the horizon 40",
        proc.stdout,
    ), proc.stdout
    assert "Wrote " in proc.stdout and "(25 frames)" in proc.stdout
    with Image.open(gif) as image:
        assert image.size == (160, 210)
        # the 25 screens are 67 ms apart (4 of the 2600's 60 frames a second); Pillow may merge
        # identical consecutive screens into one longer frame, and a GIF stores centiseconds
        # (each frame's duration is cut to 10 ms), so the total is checked within that rounding
        durations = []
        for i in range(image.n_frames):
            image.seek(i)
            durations.append(image.info["duration"])
    assert 1 < len(durations) <= 25 and 0 <= 25 * 67 - sum(durations) < 10 * len(durations)


def _solver(tmp_path, rl_extra: str) -> Path:
    """The Cart-Pole example solver with ``rl_extra`` added to its rl_param."""
    for name in ("cartpole_softmax_solver.prototxt", "cartpole_softmax.prototxt"):
        (tmp_path / name).write_text((EXAMPLES / name).read_text())
    solver = tmp_path / "cartpole_softmax_solver.prototxt"
    solver.write_text(solver.read_text().replace("batch_size: 10", f"batch_size: 10 {rl_extra}"))
    return solver


@pytest.mark.parametrize(
    ("extra", "args", "message"),
    [
        ("eps_steps: 4294967295", [], "eps_steps must lie in [0, 2147483647]"),
        ("", ["--seed", str(2**64)], "--seed must fit in 64 bits"),
        ("", ["--test", "--weights", "w.caffemodel", "--episodes", "-1"], "--episodes must be"),
        ("", ["--plot", "p.xyz"], "--plot p.xyz: matplotlib writes"),
        ("", ["--plot", "missing/p.png"], "no such directory"),
    ],
)
def test_bad_settings_are_one_line_before_training(tmp_path, extra, args, message):
    solver = _solver(tmp_path, extra)
    proc = run_cli("rl", "--solver", solver, "--episodes", "10", *args, cwd=tmp_path)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("caffe2jax rl: error: ") and message in line, line
    assert "Environment" not in proc.stdout  # refused before the trainer was built


def test_a_batch_past_memory_is_refused_before_allocating(tmp_path):
    """batch_size 2^31 − 1 reached XLA's 34 GB request; now the episodes' state is weighed
    against the memory budget first."""
    solver = _solver(tmp_path, "").read_text().replace("batch_size: 10", "batch_size: 2147483647")
    (tmp_path / "big.prototxt").write_text(solver)
    proc = run_cli("rl", "--solver", tmp_path / "big.prototxt", "--episodes", "10", cwd=tmp_path)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert "batch_size 2147483647 needs at least 128 GiB" in line, line
