"""Key-value databases of Datum records: LMDB (``lmdb``) and LevelDB (``plyvel``, optional).

Mirrors Caffe's ``db::DB``/``db::Cursor`` (util/db_lmdb.cpp, util/db_leveldb.cpp): records are
read in key order (``convert_imageset`` writes keys ``"%08d_<path>"``, so key order is list
order); a :class:`Cursor` wraps around to the first record at the end as DataLayer's ``Next()``
does. Writers refuse an existing path (Caffe's LMDB ``mkdir`` fails, its LevelDB sets
``error_if_exists``), commit every 1000 records as ``convert_imageset`` does, and build the
database under a temporary name that is renamed into place only once complete.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.records.watch import Watch, content_id

log = logging.getLogger(__name__)

BACKENDS = ("lmdb", "leveldb")
COMMIT_EVERY = 1000
_LMDB_MAP_SIZE = 1 << 26


def backend_name(value: int | str) -> str:
    """ "lmdb" or "leveldb" from a DataParameter.DB value (LEVELDB = 0, LMDB = 1) or a name."""
    if isinstance(value, int):
        return {0: "leveldb", 1: "lmdb"}.get(value) or _bad_backend(value)
    name = value.lower()
    return name if name in BACKENDS else _bad_backend(value)


def _bad_backend(value: int | str) -> str:
    raise DataError(f"unknown database backend {value!r} (use lmdb or leveldb)")


def _plyvel():
    try:
        import plyvel
    except ImportError as err:
        raise DataError(
            "LevelDB databases need the plyvel package: pip install caffe2jax[leveldb]"
        ) from err
    return plyvel


class Database:
    """A read-only database: ordered iteration and lookup by key."""

    def __init__(self, path: Path, backend: str) -> None:
        self.path = Path(path)
        self.backend = backend_name(backend)
        if not self.path.is_dir():
            raise DataError(f"{self.path}: no such {self.backend} database")
        self._check_kind()
        try:
            if self.backend == "lmdb":
                self._env, self._env_key = _acquire_lmdb(self.path)
                self._txn = self._env.begin(buffers=False)
            else:
                # by absolute name: LevelDB's in-process lock table knows files by the name
                # they were opened with ("db/LOCK" of two folders would collide)
                self._db = _plyvel().DB(str(self.path.resolve()), create_if_missing=False)
        except DataError:
            raise
        except Exception as err:  # lmdb.Error, plyvel.Error: unreadable database
            raise DataError(f"{self.path}: cannot open {self.backend} database ({err})") from err
        self.watch = Watch(self.path, self.backend)

    def check_unchanged(self) -> None:
        """A DataError when the database was deleted, replaced, truncated, rewritten or made
        unreadable since it was opened (see :mod:`.watch`)."""
        self.watch.check()

    def content_id(self) -> dict:
        """The database's identity by content (:func:`.watch.content_id`)."""
        entries = self._txn.stat()["entries"] if self.backend == "lmdb" else None
        return content_id(self.items(), entries)

    def _check_kind(self) -> None:
        is_lmdb = (self.path / "data.mdb").exists()
        if self.backend == "leveldb" and is_lmdb:
            raise DataError(
                f"{self.path} is an LMDB but the backend is LEVELDB (Caffe's default for "
                "DataParameter): set backend: LMDB"
            )
        if self.backend == "lmdb" and not is_lmdb and (self.path / "CURRENT").exists():
            raise DataError(f"{self.path} is a LevelDB but the backend is LMDB")

    def _faults(self):
        """A read failure (a corrupt page, a LevelDB checksum) as a DataError naming the DB."""
        return _db_faults(self.path, self.backend)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """All (key, value) pairs in key order."""
        with self._faults():
            if self.backend == "lmdb":
                yield from self._txn.cursor().iternext(keys=True, values=True)
            else:
                yield from self._db.iterator()

    def keys(self) -> Iterator[bytes]:
        """All keys in key order."""
        with self._faults():
            if self.backend == "lmdb":
                yield from self._txn.cursor().iternext(keys=True, values=False)
            else:
                yield from self._db.iterator(include_value=False)

    def get(self, key: bytes) -> bytes:
        """The value stored under ``key``."""
        self.watch.tick()
        with self._faults():
            value = self._txn.get(key) if self.backend == "lmdb" else self._db.get(key)
        if value is None:
            raise DataError(f"{self.path}: no record {key!r}")
        return value

    def close(self) -> None:
        self.watch.close()
        if self.backend == "lmdb":
            self._txn.abort()
            _release_lmdb(self._env_key)
        else:
            self._db.close()


@contextlib.contextmanager
def _db_faults(path: Path, backend: str) -> Iterator[None]:
    try:
        yield
    except DataError:
        raise
    except Exception as err:  # lmdb.Error, plyvel.Error and their subclasses
        if type(err).__module__.split(".")[0] not in ("lmdb", "plyvel"):
            raise
        text = " ".join(str(err).split())[:120]
        raise DataError(f"{path}: {backend} database is corrupt ({text})") from None


# py-lmdb opens an environment once per process: sources reading the same LMDB (a TRAIN and a
# TEST net, say) share it, each with its own read transaction.
_LMDB_ENVS: dict[tuple, list] = {}  # (folder, inode of data.mdb) -> [env, users]
_LMDB_LOCK = threading.Lock()


_MDB_MAGIC = 0xBEEFC0DE
_META = struct.Struct("<II16xI2x90xQQ")  # magic, version, (psize @40), last_pg, txnid @136
_PAGE_HEADER = 16


def check_lmdb_file(path: Path) -> None:
    """Check ``data.mdb`` against its meta pages before it is mapped: LMDB reads pages straight
    from the map, so a file shorter than its newest meta page's ``(last_pg + 1) × psize``
    would end the process with SIGBUS on the first read past its end (mdb.c's meta layout:
    ``MDB_meta`` after a 16-byte page header, page size in ``mm_dbs[FREE_DBI].md_pad``)."""
    data = path / "data.mdb"
    if not data.is_file():
        raise DataError(f"{path}: cannot open lmdb database (no data.mdb file in it)")
    try:
        size = data.stat().st_size
        with open(data, "rb") as handle:
            first = handle.read(_PAGE_HEADER + _META.size)
            metas = [_meta(first)]
            if metas[0] is not None:
                handle.seek(metas[0][1])
                metas.append(_meta(handle.read(_PAGE_HEADER + _META.size)))
    except OSError as err:
        raise DataError(f"{path}: cannot open lmdb database ({err.strerror})") from None
    valid = [m for m in metas if m is not None]
    if not valid:
        raise DataError(f"{path}: data.mdb is not an LMDB file (no LMDB meta page)")
    txnid, psize, last_pg = max(valid)
    need = (last_pg + 1) * psize
    if size < need:
        raise DataError(
            f"{path}: data.mdb is truncated ({size} bytes, its header needs {need}); "
            "the database was not copied whole"
        )


def _meta(page: bytes) -> tuple[int, int, int] | None:
    """(txnid, page size, last page) of a meta page, None when it is not one."""
    if len(page) < _PAGE_HEADER + _META.size:
        return None
    magic, version, psize, last_pg, txnid = _META.unpack_from(page, _PAGE_HEADER)
    if magic != _MDB_MAGIC or version != 1 or psize < 512 or psize & (psize - 1):
        return None
    return txnid, psize, last_pg


def _acquire_lmdb(path: Path) -> tuple:
    """The process's one environment of the LMDB at ``path`` (lmdb allows one per file), and
    its key: the folder and its data file's inode, so that a database replaced at the same
    path is opened afresh, never served from the old one's map."""
    import lmdb

    try:
        inode = os.stat(path / "data.mdb").st_ino
    except OSError:
        inode = None
    key = (path.resolve(), inode)
    with _LMDB_LOCK:
        if key not in _LMDB_ENVS:
            check_lmdb_file(key[0])
            env = lmdb.open(str(key[0]), readonly=True, lock=False, readahead=False, max_readers=64)
            _LMDB_ENVS[key] = [env, 0]
        _LMDB_ENVS[key][1] += 1
        return _LMDB_ENVS[key][0], key


def _release_lmdb(key: tuple) -> None:
    with _LMDB_LOCK:
        entry = _LMDB_ENVS.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            entry[0].close()
            del _LMDB_ENVS[key]


def open_db(path: str | Path, backend: int | str = "lmdb") -> Database:
    """Open an existing database read-only."""
    return Database(Path(path), backend_name(backend))


class Cursor:
    """Caffe's data cursor: reads records in key order and restarts from the first at the end
    ("Restarting data prefetching from start.")."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._items = db.items()
        self._current = self._first()

    def _first(self) -> tuple[bytes, bytes]:
        self.db.check_unchanged()  # at every wrap-around: the database is the one opened
        self._items = self.db.items()
        try:
            return next(self._items)
        except StopIteration:
            raise DataError(f"{self.db.path}: database is empty") from None

    @property
    def key(self) -> bytes:
        return self._current[0]

    @property
    def value(self) -> bytes:
        return self._current[1]

    def next(self) -> None:
        """Advance, wrapping around to the first record after the last."""
        self.db.watch.tick()
        try:
            self._current = next(self._items)
        except StopIteration:
            log.debug("%s: restarting data prefetching from start", self.db.path)
            self._current = self._first()

    def skip(self, count: int) -> None:
        """Advance ``count`` records (wrapping around)."""
        for _ in range(count):
            self.next()


class Writer:
    """Builds a new database; use as a context manager. Existing paths are refused."""

    def __init__(self, path: str | Path, backend: str = "lmdb") -> None:
        self.path = Path(path)
        self.backend = backend_name(backend)
        if self.path.exists():
            raise DataError(f"{self.path} already exists: refusing to overwrite it")
        parent = self.path.parent
        if not parent.is_dir():
            raise DataError(f"{self.path}: folder {parent} does not exist")
        plyvel = _plyvel() if self.backend == "leveldb" else None
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=parent))
        self._tmp.chmod(0o755)  # mkdtemp's 0700 would carry over to the database
        self._pending: list[tuple[bytes, bytes]] = []
        self.count = 0
        if plyvel is None:
            import lmdb

            self._map_size = _LMDB_MAP_SIZE
            self._env = lmdb.open(str(self._tmp), map_size=self._map_size, lock=False)
        else:
            self._db = plyvel.DB(str(self._tmp), create_if_missing=True)

    def put(self, key: str | bytes, value: bytes) -> None:
        """Queue a record; every 1000 records are committed."""
        self._pending.append((key.encode() if isinstance(key, str) else key, value))
        self.count += 1
        if len(self._pending) >= COMMIT_EVERY:
            self.commit()

    def commit(self) -> None:
        if self.backend == "leveldb":
            with self._db.write_batch() as batch:
                for key, value in self._pending:
                    batch.put(key, value)
        else:
            self._commit_lmdb()
        self._pending.clear()

    def _commit_lmdb(self) -> None:
        import lmdb

        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for key, value in self._pending:
                        txn.put(key, value)
                return
            except lmdb.MapFullError:  # Caffe's LMDBTransaction doubles the map and retries
                self._map_size *= 2
                self._env.set_mapsize(self._map_size)

    def close(self) -> None:
        """Commit what is left and move the database into place."""
        self.commit()
        self._shut()
        if self.path.exists():
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise DataError(f"{self.path} appeared while writing: refusing to overwrite it")
        self._tmp.rename(self.path)

    def abort(self) -> None:
        """Drop everything written."""
        self._shut()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _shut(self) -> None:
        if self.backend == "lmdb":
            self._env.close()
        else:
            self._db.close()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
