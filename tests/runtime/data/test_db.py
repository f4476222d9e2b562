"""LMDB/LevelDB databases: key order, Caffe's wrap-around cursor, writers that never
overwrite."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.records import db as dbmod
from caffe2jax.runtime.data.records.db import Cursor, Writer, backend_name, open_db

from .helpers import numbered_items, write_db


def _cursor_keys(cursor: Cursor, count: int) -> list[bytes]:
    keys = []
    for _ in range(count):
        keys.append(cursor.key)
        cursor.next()
    return keys


def test_keys_come_back_in_key_order(tmp_path):
    with Writer(tmp_path / "db") as writer:
        for key in ("00000002_c", "00000000_a", "00000001_b"):
            writer.put(key, key.encode())
    db = open_db(tmp_path / "db")
    assert list(db.keys()) == [b"00000000_a", b"00000001_b", b"00000002_c"]
    assert db.get(b"00000001_b") == b"00000001_b"
    with pytest.raises(DataError, match="no record"):
        db.get(b"nope")
    db.close()


def test_cursor_wraps_around_and_skips(tmp_path):
    write_db(tmp_path / "db", numbered_items(3), [0, 1, 2])
    db = open_db(tmp_path / "db")
    cursor = Cursor(db)
    keys = [k[:8] for k in _cursor_keys(cursor, 7)]
    assert keys == [b"00000000", b"00000001", b"00000002"] * 2 + [b"00000000"]
    cursor.skip(4)  # at record 1 now; 4 more: 2, 0, 1, 2
    assert cursor.key.startswith(b"00000002")
    db.close()


def test_writer_refuses_an_existing_path(tmp_path):
    (tmp_path / "db").mkdir()
    with pytest.raises(DataError, match="already exists: refusing to overwrite"):
        Writer(tmp_path / "db")
    with pytest.raises(DataError, match="does not exist"):
        Writer(tmp_path / "no" / "db")


def test_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), Writer(tmp_path / "db") as writer:
        writer.put("k", b"v")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_lmdb_map_grows_like_caffe(tmp_path, monkeypatch):
    monkeypatch.setattr(dbmod, "_LMDB_MAP_SIZE", 1 << 16)
    payload = bytes(range(256)) * 64  # 16 KiB per record, 40 records > 64 KiB map
    with Writer(tmp_path / "db") as writer:
        for i in range(40):
            writer.put(f"{i:08d}", payload)
    db = open_db(tmp_path / "db")
    assert sum(1 for _ in db.items()) == 40
    db.close()


def test_missing_empty_and_mismatched_databases(tmp_path):
    with pytest.raises(DataError, match="no such lmdb database"):
        open_db(tmp_path / "missing", "lmdb")
    with Writer(tmp_path / "empty"):
        pass
    db = open_db(tmp_path / "empty")
    with pytest.raises(DataError, match="database is empty"):
        Cursor(db)
    db.close()
    with pytest.raises(DataError, match="is an LMDB but the backend is LEVELDB"):
        open_db(tmp_path / "empty", 0)  # DataParameter.LEVELDB, Caffe's default
    (tmp_path / "notdb").mkdir()
    with pytest.raises(DataError, match="cannot open lmdb database"):
        open_db(tmp_path / "notdb", "lmdb")


def test_backend_names():
    assert backend_name(1) == "lmdb" and backend_name(0) == "leveldb"
    assert backend_name("LMDB") == "lmdb"
    with pytest.raises(DataError, match="unknown database backend"):
        backend_name("rocksdb")


def test_leveldb_roundtrip(tmp_path):
    pytest.importorskip("plyvel")
    items = numbered_items(3)
    write_db(tmp_path / "ldb", items, [4, 5, 6], backend="leveldb")
    db = open_db(tmp_path / "ldb", "leveldb")
    cursor = Cursor(db)
    assert [k[:8] for k in _cursor_keys(cursor, 4)] == [
        b"00000000",
        b"00000001",
        b"00000002",
        b"00000000",
    ]
    db.close()
    with pytest.raises(DataError, match="already exists"):
        Writer(tmp_path / "ldb", "leveldb")
    with pytest.raises(DataError, match="is a LevelDB but the backend is LMDB"):
        open_db(tmp_path / "ldb", "lmdb")


def test_leveldb_without_plyvel_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "plyvel", None)
    (tmp_path / "ldb").mkdir()
    with pytest.raises(DataError, match=r"pip install caffe2jax\[leveldb\]"):
        open_db(tmp_path / "ldb", "leveldb")
    with pytest.raises(DataError, match=r"pip install caffe2jax\[leveldb\]"):
        Writer(tmp_path / "new", "leveldb")
    assert not (tmp_path / "new").exists()
    assert np.all([not p.name.startswith(".new") for p in tmp_path.iterdir()])


def test_truncated_lmdb_is_refused_before_mapping(tmp_path):
    """A data.mdb cut short (an interrupted copy) would end the process with SIGBUS on the
    first read past its end: its header is checked first."""
    write_db(tmp_path / "db", numbered_items(250, (3, 16, 16)), [0] * 250, "lmdb")
    data = tmp_path / "db" / "data.mdb"
    full = data.stat().st_size
    os.truncate(data, full // 2)
    with pytest.raises(DataError, match=r"data\.mdb is truncated \(\d+ bytes, its header needs"):
        open_db(tmp_path / "db", "lmdb")
    os.truncate(data, 100)
    with pytest.raises(DataError, match="not an LMDB file"):
        open_db(tmp_path / "db", "lmdb")
