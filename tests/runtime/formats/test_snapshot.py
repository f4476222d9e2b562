"""The one snapshot and resume record (runtime/formats/snapshot.py): its schema, and that the
records of both trainers written before it (version 1: the solver loop's and the RL
trainer's, each with its own schema and key encoding) still resume exactly."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from caffe2jax.frontend.errors import SolverError
from caffe2jax.runtime.formats.snapshot import (
    ResumeRecord,
    encode_array,
    parse_record,
    read_snapshot,
    record_text,
    resume_path,
)

ROOT = Path(__file__).resolve().parents[3]

# Written by the code before the merge (HEAD 8a89fae): the solver loop's record of LeNet on
# the digits LMDBs at iteration 20, and the RL trainer's of MyCaffe's Cart-Pole at 2.
V1_SOLVER = (
    '{"caffe2jax_resume": 1, "iter": 20, "seed": 1701, "train": {"digits": {"fields": {"r'
    'ecords_read": 1280, "position": 1280, "key": 5302411617914485751, "source_id": {"ent'
    'ries": 1437, "head": "32d9ee4b82046796"}}, "rngs": []}}, "tests": [{"digits": {"fiel'
    'ds": {"records_read": 360, "position": 360, "key": 5302411617914485751, "source_id":'
    ' {"entries": 360, "head": "bf0417ca3f6496b7"}}, "rngs": []}}], "test_keys": [[338174'
    "8668, 205795482]]}"
)
V1_RL = (
    '{"caffe2jax_rl_resume": 1, "iter": 2, "env": "cartpole-mycaffe", "seed": 2, "key": {'
    '"dtype": "<u4", "shape": [2], "data": "q5EqdTH3D/Q="}, "lanes": {"last": {"dtype": "'
    '<f4", "shape": [3, 4], "data": "TpDYPVpbeT/WH46+XiUAwKjbQb42fVi/Ad2RPgYPxz9GI/w9JO24'
    'vl40p765eEu/"}, "has_last": {"dtype": "|b1", "shape": [3], "data": "AQEB"}, "episode'
    's": {"dtype": "<i4", "shape": [], "data": "BgAAAA=="}}, "returns": [29.0, 24.0, 19.0'
    ', 21.0, 14.0, 38.0], "running": 28.718032299500003, "steps": 145, "seconds": 0.02484'
    "388499999568}"
)


def v1_solver_text(record: ResumeRecord) -> str:
    """What the solver loop wrote before the merge, for the same state."""
    tests = record.values["tests"]
    keys = [np.asarray(jax.random.key_data(record.keys[f"test_{i}"])).tolist()
            for i in range(len(tests))]  # fmt: skip
    return json.dumps(
        {
            "caffe2jax_resume": 1,
            "iter": record.iteration,
            "seed": record.seed,
            "train": record.values["train"],
            "tests": tests,
            "test_keys": keys,
        }
    )


def v1_rl_text(record: ResumeRecord) -> str:
    """What the RL trainer wrote before the merge, for the same state."""
    v = record.values
    return json.dumps({
        "caffe2jax_rl_resume": 1, "iter": record.iteration, "env": v["env"],
        "seed": record.seed, "key": encode_array(jax.random.key_data(record.keys["run"])),
        "lanes": {k: encode_array(a) for k, a in record.arrays.items()},
        "returns": v["returns"], "running": v["running"], "steps": v["steps"],
        "seconds": v["seconds"],
    })  # fmt: skip


def test_a_v1_solver_record_reads_as_the_one_record():
    record = parse_record(V1_SOLVER)
    assert (record.kind, record.iteration, record.seed) == ("solver", 20, 1701)
    assert list(record.keys) == ["test_0"] and not record.arrays
    np.testing.assert_array_equal(jax.random.key_data(record.keys["test_0"]),
                                  [3381748668, 205795482])  # fmt: skip
    assert record.values["train"]["digits"]["fields"]["position"] == 1280
    assert record.values["tests"][0]["digits"]["fields"]["position"] == 360
    assert parse_record(v1_solver_text(record)) == record


def test_a_v1_rl_record_reads_as_the_one_record():
    record = parse_record(V1_RL)
    assert (record.kind, record.iteration, record.seed) == ("rl", 2, 2)
    assert jax.random.key_data(record.keys["run"]).shape == (2,)
    assert {k: (v.dtype.str, v.shape) for k, v in record.arrays.items()} == {
        "last": ("<f4", (3, 4)),
        "has_last": ("|b1", (3,)),
        "episodes": ("<i4", ()),
    }
    assert record.arrays["has_last"].all() and int(record.arrays["episodes"]) == 6
    assert record.values["env"] == "cartpole-mycaffe" and record.values["steps"] == 145
    assert record.values["returns"] == [29.0, 24.0, 19.0, 21.0, 14.0, 38.0]
    again = parse_record(v1_rl_text(record))
    assert again.values == record.values
    for name in record.arrays:
        np.testing.assert_array_equal(again.arrays[name], record.arrays[name])


def test_the_record_round_trips_one_encoding_for_keys_and_arrays():
    record = ResumeRecord(
        "rl", 7, 3, {"run": jax.random.key(5)},
        {"last": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(4, np.int32)},
        {"returns": [1.0, 2.5], "running": None},
    )  # fmt: skip
    text = record_text(record)
    saved = json.loads(text)
    assert saved["caffe2jax_resume"] == 2 and saved["kind"] == "rl"
    assert saved["keys"]["run"].keys() == saved["arrays"]["last"].keys()  # one encoding
    back = parse_record(text)
    assert (back.kind, back.iteration, back.seed, back.values) == ("rl", 7, 3, record.values)
    np.testing.assert_array_equal(jax.random.key_data(back.keys["run"]),
                                  jax.random.key_data(record.keys["run"]))  # fmt: skip
    assert back.arrays["n"].shape == () and back.arrays["last"].dtype == np.float32
    np.testing.assert_array_equal(back.arrays["last"], record.arrays["last"])


@pytest.mark.parametrize("text", ['{"caffe2jax_resume": 3}', '{"kind": "solver"}', "[1]"])
def test_other_json_is_not_a_record(text):
    with pytest.raises((ValueError, KeyError, TypeError, AttributeError)):
        parse_record(text)


def _digits(where: Path, max_iter: int, snapshot: int) -> Path:
    shutil.copytree(ROOT / "examples" / "digits", where)
    solver = (where / "lenet_solver.prototxt").read_text()
    for name, value in (("max_iter", max_iter), ("snapshot", snapshot), ("display", 0),
                        ("test_interval", snapshot), ("test_iter", 1)):  # fmt: skip
        solver = re.sub(rf"^{name}: .*$", f"{name}: {value}", solver, flags=re.M)
    (where / "lenet_solver.prototxt").write_text(solver)
    return where / "lenet_solver.prototxt"


@pytest.mark.parametrize("version", [2, 1])
def test_the_solver_resumes_exactly_from_either_version(tmp_path, monkeypatch, version):
    """LeNet on the digits LMDBs, 8 iterations straight, or resumed at 4 from a record in
    version's schema: the same weights, byte for byte (the train reader's position and the
    test net's key come back)."""
    from caffe2jax.runtime import SolverLoop

    solver = _digits(tmp_path / "w", 8, 4)
    monkeypatch.chdir(solver.parent)
    SolverLoop(solver).solve()
    state = Path("lenet_digits_iter_4.solverstate")
    if version == 1:
        resume_path(state).write_text(v1_solver_text(parse_record(resume_path(state).read_text())))
    straight = Path("lenet_digits_iter_8.caffemodel").read_bytes()
    Path("lenet_digits_iter_8.caffemodel").unlink()
    SolverLoop(solver).solve(state)
    assert Path("lenet_digits_iter_8.caffemodel").read_bytes() == straight


def test_a_record_of_another_kind_or_iteration_is_refused(tmp_path, monkeypatch):
    from caffe2jax.runtime import SolverLoop

    solver = _digits(tmp_path / "w", 4, 4)
    monkeypatch.chdir(solver.parent)
    SolverLoop(solver).solve()
    state = Path("lenet_digits_iter_4.solverstate")
    assert read_snapshot(state, "solver").record.iteration == 4
    with pytest.raises(SolverError, match="not the rl resume record of iteration 4"):
        read_snapshot(state, "rl")
    record = parse_record(resume_path(state).read_text())
    record.iteration = 3
    resume_path(state).write_text(record_text(record))
    with pytest.raises(SolverError, match="not the solver resume record of iteration 4"):
        read_snapshot(state, "solver")
    resume_path(state).write_text("{")
    with pytest.raises(SolverError, match="not a usable resume record"):
        read_snapshot(state, "solver")
