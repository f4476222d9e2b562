"""Exact resume after kill -9 (beyond Caffe): a snapshot's resume record puts every data
reader (LMDB here) and the PRNG where they stood, so a run killed at any point and resumed
from its last snapshot writes byte-identical snapshots to an uninterrupted run."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[3]
DIGITS = ROOT / "examples" / "digits"
MAX_ITER, SNAPSHOT, DISPLAY = 240, 20, 10
KILLS = 10


def _workdir(where: Path) -> Path:
    shutil.copytree(DIGITS, where)
    solver = (where / "lenet_solver.prototxt").read_text()
    for field, value in (("max_iter", MAX_ITER), ("snapshot", SNAPSHOT), ("display", DISPLAY),
                         ("test_interval", 60)):  # fmt: skip
        solver = re.sub(rf"^{field}: .*$", f"{field}: {value}", solver, flags=re.M)
    (where / "lenet_solver.prototxt").write_text(solver)
    return where


def _start(work: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "caffe2jax", "train", "--solver", "lenet_solver.prototxt",
         "--progress", "log", *extra],
        cwd=work, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def _kill_after(proc: subprocess.Popen, iteration: int, delay: float) -> bool:
    """SIGKILL once the log shows ``iteration`` (plus ``delay`` s); False if it finished."""
    for line in proc.stderr:
        match = re.search(r"Iteration (\d+) \(", line)
        if match and int(match.group(1)) >= iteration:
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
    proc.wait()
    return False


def _latest_snapshot(work: Path) -> Path | None:
    states = sorted(work.glob("lenet_digits_iter_*.solverstate"),
                    key=lambda p: int(p.stem.rsplit("_", 1)[1]))  # fmt: skip
    return states[-1] if states else None


@pytest.mark.heavy  # minutes on 2 cores: outside the 30-minute CI budget (pytest -m heavy)
def test_kill_9_at_ten_points_resumes_byte_identically(tmp_path):
    reference = _workdir(tmp_path / "reference")
    done = run_cli("train", "--solver", "lenet_solver.prototxt", "--progress", "log",
                   cwd=reference)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]

    work = _workdir(tmp_path / "killed")
    rng = np.random.default_rng(20261122)
    points = np.sort(rng.choice(np.arange(DISPLAY, MAX_ITER, DISPLAY), KILLS, replace=False))
    killed = 0
    for point in points:
        resume = _latest_snapshot(work)
        # with no snapshot yet, the killed run's log is all there is: start over (--force)
        extra = ("--snapshot", resume.name) if resume is not None else ("--force",)
        proc = _start(work, *extra)
        if _kill_after(proc, int(point), float(rng.uniform(0, 0.05))):
            killed += 1
    assert killed >= KILLS - 2, f"only {killed} of {KILLS} runs were killed mid-training"
    resume = _latest_snapshot(work)
    final = run_cli("train", "--solver", "lenet_solver.prototxt", "--progress", "log",
                    *(("--snapshot", resume.name) if resume else ()), cwd=work)  # fmt: skip
    assert final.returncode == 0, final.stderr[-2000:]
    assert not list(work.glob(".*.tmp")), "temp files from interrupted writes remain"
    compared = 0
    for theirs in sorted(reference.glob("lenet_digits_iter_*")):
        ours = work / theirs.name
        if ours.exists() and not theirs.name.endswith(".json"):
            assert ours.read_bytes() == theirs.read_bytes(), theirs.name
            compared += 1
    assert (work / f"lenet_digits_iter_{MAX_ITER}.caffemodel").exists()
    assert compared >= 2 * (MAX_ITER // SNAPSHOT) - 2
