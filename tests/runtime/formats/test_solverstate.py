"""Iteration counters and weights names at the edges (runtime/formats/solverstate.py): a
.solverstate or .solverstate.h5 whose ``iter`` or ``current_step`` lies outside Caffe's
0..INT_MAX, or whose ``learned_net`` no file can have, is refused in one line naming the file
and the field; the edges themselves (0, INT_MAX) read as Caffe writes them."""

from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest

from caffe2jax.frontend.errors import MAX_MESSAGE, WeightsError
from caffe2jax.runtime.formats.solverstate import read_solverstate, write_solverstate
from tests.golden import GOLDEN, require

STATE = GOLDEN / "solvers" / "sgd_fixed" / "sgd_fixed_iter_5.solverstate"


def _with(tmp_path, hdf5: bool, **changes):
    path = tmp_path / ("s.solverstate" + (".h5" if hdf5 else ""))
    write_solverstate(path, dataclasses.replace(read_solverstate(require(STATE)), **changes), hdf5)
    return path


@pytest.mark.parametrize("hdf5", [False, True])
@pytest.mark.parametrize("value", [0, 2**31 - 1])
def test_counters_at_the_edges_read(tmp_path, hdf5, value):
    state = read_solverstate(_with(tmp_path, hdf5, iter=value, current_step=value))
    assert (state.iter, state.current_step) == (value, value)


@pytest.mark.parametrize("field", ["iter", "current_step"])
@pytest.mark.parametrize("value", [-1, -(2**31)])
def test_negative_counters_are_refused(tmp_path, field, value):
    path = _with(tmp_path, False, **{field: value})
    with pytest.raises(WeightsError) as err:
        read_solverstate(path)
    assert str(err.value) == f"{path}: {field} {value} is outside 0..2147483647; not a snapshot"


@pytest.mark.parametrize("value", [2**31, 2**62, -(2**40)])
def test_hdf5_counters_past_int_are_refused(tmp_path, value):
    path = _with(tmp_path, True)
    with h5py.File(path, "r+") as f:
        del f["iter"]
        f["iter"] = np.array([value], np.int64)
    with pytest.raises(WeightsError, match=rf"iter {value} is outside 0\.\.2147483647"):
        read_solverstate(path)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("x" * 300, ": it has 300 bytes; at most 255 fit"),
        ("a/" * 2100, "is 4200 bytes long; a path may have at most 4096"),
        ("/proc/self/mem", "is on a proc file system"),
        ("/proc/self/fd/0", "is on a proc file system"),
        ("a\0b", "contains a NUL byte"),
    ],
)
def test_learned_net_names_no_file_can_have_are_refused(tmp_path, name, problem):
    path = _with(tmp_path, False, learned_net=name)
    with pytest.raises(WeightsError) as err:
        read_solverstate(path)
    assert str(err.value).startswith(f"{path}: learned_net ")
    assert problem in str(err.value)
    assert len(str(err.value)) <= MAX_MESSAGE
