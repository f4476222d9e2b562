"""The solver's edges (runtime/train/setup.py, solvers.py, state.py, loop.py): snapshot names
no file can have and test_iter outside 0..INT_MAX refused when the solver is set up, through
the API as through the CLI; test_iter 0 tests nothing (as in Caffe); a very long test pass
says so and stops on a stop request; the iteration counter ends at INT_MAX."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import pytest

import caffe2jax
from caffe2jax.frontend.errors import SolverError
from caffe2jax.runtime.formats.solverstate import read_solverstate, write_solverstate
from tests.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[3]
DIGITS = ROOT / "examples" / "digits"


def _digits(tmp_path: Path, **fields) -> Path:
    work = tmp_path / "digits"
    shutil.copytree(DIGITS, work)
    text = (work / "lenet_solver.prototxt").read_text()
    for field, value in {"max_iter": 2, "display": 1, "snapshot": 0, **fields}.items():
        text = re.sub(rf"^{field}: .*$", f"{field}: {value}", text, flags=re.M)
    (work / "lenet_solver.prototxt").write_text(text)
    return work / "lenet_solver.prototxt"


@pytest.mark.parametrize(
    ("prefix", "problem"),
    [
        ('"' + "x" * 300 + '"', "it has 300 bytes; at most 193 fit"),
        ('"/proc/self/snap"', "its folder '/proc/self' is on a proc file system"),
        ('"/proc/self/x/y"', "its folder '/proc/self' is on a proc file system"),
    ],
)
def test_snapshot_prefix_no_file_can_have_is_refused_through_api_and_cli(tmp_path, prefix, problem):
    solver = _digits(tmp_path, snapshot_prefix=prefix)
    with pytest.raises(SolverError) as err:
        caffe2jax.get_solver(str(solver))
    assert problem in str(err.value) and str(err.value).startswith(f"{solver}: snapshot_prefix")
    proc = run_cli("train", "--solver", solver, cwd=solver.parent)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == f"caffe2jax train: error: {err.value}"


@pytest.mark.parametrize("value", [-1, -2147483648])
def test_negative_test_iter_is_refused(tmp_path, value):
    solver = _digits(tmp_path, test_iter=value)
    with pytest.raises(SolverError, match=rf"test_iter {value} \(test net #0\) must be >= 0"):
        caffe2jax.get_solver(str(solver))


def test_test_iter_zero_tests_nothing_as_in_caffe(tmp_path, caplog):
    solver = caffe2jax.get_solver(str(_digits(tmp_path, test_iter=0, test_interval=1)))
    with caplog.at_level(logging.INFO, logger="caffe2jax"):
        solver.step(1)
    assert "Testing net (#0)" in caplog.text
    assert "Test net output" not in caplog.text


def test_a_very_long_test_pass_is_announced_and_stops_on_request(tmp_path, caplog):
    path = _digits(tmp_path, test_iter=2147483647, test_interval=1)
    with caplog.at_level(logging.INFO, logger="caffe2jax"):
        loop = caffe2jax.get_solver(str(path))
        assert (
            "test_iter 2147483647 (test net #0): every test pass runs 2147483647 batches, as "
            "Caffe does; Ctrl-C (SIGINT) stops it after the current batch"
        ) in caplog.text
        inner = loop._loop if hasattr(loop, "_loop") else loop
        inner.request_stop()
        assert inner.test(0) == {}
    assert "Test interrupted." in caplog.text


def test_the_iteration_counter_ends_at_int_max(tmp_path, monkeypatch):
    path = _digits(tmp_path, snapshot_prefix='"s"')
    monkeypatch.chdir(path.parent)  # a relative snapshot_prefix is relative to the cwd
    solver = caffe2jax.get_solver(str(path))
    solver.step(1)
    solver.snapshot()
    state = path.parent / "s_iter_1.solverstate"
    saved = read_solverstate(state)
    write_solverstate(state, saved.__class__(2**31 - 1, saved.learned_net, 0, saved.history),
                      hdf5=False)  # fmt: skip
    (path.parent / "s_iter_1.solverstate.resume.json").unlink()
    solver.restore(str(state))
    assert solver.iter == 2**31 - 1
    with pytest.raises(SolverError, match="iteration 2147483647: Caffe's iteration counter is an "
                       "int and ends at 2147483647"):  # fmt: skip
        solver.step(1)
