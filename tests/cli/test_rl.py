"""`caffe2jax rl` on the command line: the progress lines `caffe2jax plot` reads, and a trained
Atari policy tested and drawn into a GIF."""

from __future__ import annotations

import re
from pathlib import Path

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
