"""CRNN's train net (../shared/forks/models/crnn_train.prototxt, read in place: CtcLoss,
LabelsequenceAccuracy, ContinuationIndicator, LSTM, Permute) trained by ``caffe2jax train`` on
examples/crnn/make_textlines.py's synthetic digit lines (HDF5Data, as the fork's net reads): the CTC
loss falls, the sequence accuracy rises, and a run resumed from its half-way snapshot ends
byte-identical to the uninterrupted one. Small on purpose (the 1/4-width net, 16-line batches,
240 iterations: about 30 s of it is XLA compiling the train step, the resumed run loads it from
the compilation cache); the fixed seeds make the run deterministic, so the thresholds below
hold with the margins noted. examples/crnn/make_textlines.py's defaults train to 94.9 % test
accuracy in 2000 iterations."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[2]
# display 25 does not divide 240: no extra forward (its own compile) after the last step
ITERS, SNAPSHOT, BATCH = 240, 200, 16


def _log(stderr: str, name: str) -> list[tuple[int, float]]:
    """(iteration, value) of each ``Train net output #k: name = v`` line."""
    found, iteration = [], None
    for line in stderr.splitlines():
        match = re.search(r"Iteration (\d+) \(", line)
        if match:
            iteration = int(match.group(1))
        match = re.search(rf"Train net output #\d+: {name} = ([-\d.e+]+)", line)
        if match and iteration is not None:
            found.append((iteration, float(match.group(1))))
    return found


@pytest.mark.heavy  # minutes on 2 cores: outside the 30-minute CI budget (pytest -m heavy)
def test_crnn_learns_digit_lines_and_resumes_exactly(tmp_path):
    made = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "crnn" / "make_textlines.py"), str(tmp_path),
         "--train", "1024", "--batch", str(BATCH), "--iters", str(ITERS), "--lr", "0.002",
         "--test-interval", "0", "--display", "25", "--snapshot", str(SNAPSHOT)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    solver = tmp_path / "crnn_solver.prototxt"
    done = run_cli("train", "--solver", solver, "--progress", "log", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    loss, accuracy = _log(done.stderr, "ctc_loss"), _log(done.stderr, "accuracy")
    first = sum(v for _, v in loss[:2]) / 2
    last = sum(v for _, v in loss[-3:]) / 3
    assert last < 0.6 * first, loss  # 17.2 → 5.9 measured (the blank plateau is ~12)
    # 7 of 16 lines exactly right at iteration 225 measured; chance is 10^-3 or less
    assert max(v for _, v in accuracy[-3:]) >= 2 / BATCH, accuracy

    final = tmp_path / f"crnn_iter_{ITERS}"
    reference = {s: Path(f"{final}{s}").read_bytes() for s in (".caffemodel", ".solverstate")}
    for suffix in reference:
        Path(f"{final}{suffix}").unlink()
    resume = tmp_path / f"crnn_iter_{SNAPSHOT}.solverstate"
    resumed = run_cli("train", "--solver", solver, "--snapshot", resume, "--progress", "log",
                      cwd=tmp_path)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for suffix, data in reference.items():
        assert Path(f"{final}{suffix}").read_bytes() == data, suffix
