"""A database changed under a running ``train`` (runtime/data/records/watch.py): deleted, replaced,
truncated to half or made unreadable while the solver reads it. Each is told in one DataError
line within one epoch (of 16 batches; the prefetch queue holds 4), and a snapshot asked for
after the change is refused: no snapshot names a position in a database that is no longer the
one read. A resumed run whose database was replaced starts it from its first record, saying
so. Through the CLI the same is one line on stderr and exit 1."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import MAX_MESSAGE, DataError
from caffe2jax.runtime.data.records.db import open_db
from tests.runtime.data.helpers import write_db

RECORDS, BATCH = 64, 4  # an epoch is 16 batches
NET = """name: "watched"
layer { name: "d" type: "Data" top: "data" top: "label"
        data_param { source: "db" backend: BACKEND batch_size: 4 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""
SOLVER = """net: "net.prototxt"
base_lr: 0.01
lr_policy: "fixed"
max_iter: {max_iter}
display: 1
snapshot: {snapshot}
snapshot_prefix: "snap"
"""


def _items(count: int, value: int = 0) -> tuple[list[np.ndarray], list[int]]:
    rng = np.random.default_rng(value)
    items = [rng.integers(0, 255, (1, 4, 4)).astype(np.uint8) for _ in range(count)]
    return items, [i % 3 for i in range(count)]


def _run_folder(tmp_path: Path, max_iter: int = 1000, snapshot: int = 0, backend="lmdb") -> Path:
    write_db(tmp_path / "db", *_items(RECORDS), backend=backend)
    (tmp_path / "net.prototxt").write_text(NET.replace("BACKEND", backend.upper()))
    (tmp_path / "solver.prototxt").write_text(SOLVER.format(max_iter=max_iter, snapshot=snapshot))
    return tmp_path / "solver.prototxt"


def _delete(db: Path) -> None:
    shutil.rmtree(db)


def _replace(db: Path) -> None:
    other = db.with_name("db.new")
    write_db(other, *_items(RECORDS, value=7))
    shutil.rmtree(db)
    os.rename(other, db)


def _truncate(db: Path) -> subprocess.Popen:
    """Truncate data.mdb to half from another process, as a user's shell would: it waits on
    the reader's lease until the reader has let go (and stopped reading)."""
    data = db / "data.mdb"
    size = data.stat().st_size
    code = f"import os; os.truncate({str(data)!r}, {size // 2})"
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:  # until it waits on the lease
        if "BREAKING" in Path("/proc/locks").read_text():
            break
        time.sleep(0.05)
    return proc


def _unreadable(db: Path) -> None:
    (db / "data.mdb").chmod(0)


CHANGES = {"deleted": _delete, "replaced": _replace, "truncated": _truncate,
           "unreadable": _unreadable}  # fmt: skip
TOLD = {
    "deleted": "was deleted",
    "replaced": "was replaced by another file",
    "truncated": "truncat",  # "was truncated", or, under the lease, "is ... truncating"
    "unreadable": "lost its read permission",
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_database_changed_under_train_is_told_within_an_epoch(tmp_path, monkeypatch, change):
    monkeypatch.chdir(tmp_path)
    solver = caffe2jax.get_solver(str(_run_folder(tmp_path)))
    solver.step(2)
    pending = CHANGES[change](tmp_path / "db")
    try:
        with pytest.raises(DataError) as err:
            solver.step(RECORDS // BATCH)  # one epoch
        message = str(err.value)
        assert "\n" not in message and len(message) <= MAX_MESSAGE, message
        assert TOLD[change] in message, message
        if change != "truncated":  # the lease: told before the truncation happens
            assert message.startswith("db: the database changed during the run ("), message
        before = sorted(p.name for p in tmp_path.glob("snap_*"))
        with pytest.raises(DataError):
            solver.snapshot()  # no snapshot records a position in the changed database
        assert sorted(p.name for p in tmp_path.glob("snap_*")) == before == []
    finally:
        if isinstance(pending, subprocess.Popen):
            assert pending.wait(timeout=120) == 0


@pytest.mark.parametrize("change", ["deleted", "replaced"])
def test_a_leveldb_changed_under_train_is_told_too(tmp_path, monkeypatch, change):
    monkeypatch.chdir(tmp_path)
    solver = caffe2jax.get_solver(str(_run_folder(tmp_path, backend="leveldb")))
    solver.step(2)
    if change == "deleted":
        shutil.rmtree(tmp_path / "db")
    else:
        write_db(tmp_path / "db.new", *_items(RECORDS, value=7), backend="leveldb")
        shutil.rmtree(tmp_path / "db")
        os.rename(tmp_path / "db.new", tmp_path / "db")
    with pytest.raises(DataError, match=r"^db: the database changed during the run \("):
        solver.step(RECORDS // BATCH)
    with pytest.raises(DataError):
        solver.snapshot()
    assert not list(tmp_path.glob("snap_*"))


def test_a_resume_over_a_replaced_database_starts_it_from_the_top(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    solver = caffe2jax.get_solver(str(_run_folder(tmp_path)))
    solver.step(3)
    solver.snapshot()
    del solver
    _replace(tmp_path / "db")
    solver = caffe2jax.get_solver(str(tmp_path / "solver.prototxt"))
    with caplog.at_level(logging.WARNING, logger="caffe2jax"):
        solver.restore(str(tmp_path / "snap_iter_3.solverstate"))
    assert (
        "is not the database the saved position was taken in (its first records or count "
        "differ); reading it from its first record"
    ) in caplog.text
    solver.step(1)  # reads the new database from its first record
    assert solver.iter == 4


def test_the_cli_says_it_in_one_line_and_writes_no_later_snapshot(tmp_path):
    solver = _run_folder(tmp_path, max_iter=100000, snapshot=5)
    db = open_db(tmp_path / "db")
    original = db.content_id()["head"]
    db.close()
    log = tmp_path / "run.log"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "caffe2jax", "train", "--solver", str(solver), "--log", str(log)],
        cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while "Iteration 10," not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, "train did not start"
            time.sleep(0.2)
        _replace(tmp_path / "db")
        changed_at = time.monotonic()
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-2000:]
    assert time.monotonic() - changed_at < 120
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("caffe2jax train: error: ") and "was replaced by another file" in last
    assert len(last) <= 300, last
    for resume in tmp_path.glob("snap_iter_*.resume.json"):  # each names the first database
        assert original in resume.read_text(), resume.name
