"""A database that changes under a running reader: noticed, told, never trusted.

Caffe opens a Data layer's database once and reads it to the end of the run: an LMDB it has
mapped keeps serving the old pages after the folder is replaced, and dies with SIGBUS once the
file is truncated under the map. Here the reader stamps the files it opened (device, inode,
size, modification time, read permission) and compares them every few records and at every
wrap-around, so a database deleted, replaced, truncated, rewritten or made unreadable during
a run stops it with one line before the next record is read. A read past a truncated map
would fault: an LMDB's data file is held under a read lease (:class:`Lease`), so that another
process's truncation or write waits until the reader has seen it coming and stopped.
:func:`content_id` names a database's contents (its record count and a hash of its first
records), which a reader's saved position carries so that a resumed run never applies a
position to another database.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import signal
import stat
from dataclasses import dataclass
from pathlib import Path

from caffe2jax.frontend.errors import DataError

try:  # POSIX only; leases are Linux's (F_SETLEASE)
    import fcntl
except ImportError:  # Windows: no leases (said once, by leases_supported)
    fcntl = None

log = logging.getLogger(__name__)

CHECK_EVERY = 16  # records read between two checks of the folder
HEAD_RECORDS = 16  # records hashed into a database's content identity


@dataclass(frozen=True)
class Stamp:
    dev: int
    ino: int
    size: int
    mtime_ns: int
    mode: int


def stamp(path: Path) -> Stamp | None:
    """The file's identity and state now (None when it is gone)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError:  # a folder above it lost its permissions: it cannot be read either
        return Stamp(-1, -1, -1, -1, 0)
    return Stamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))


def _readable(mode: int) -> bool:
    return bool(mode & (stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH))


def describe(path: Path, before: Stamp, now: Stamp | None, is_dir: bool) -> str:
    """How the file at ``path`` changed between two stamps ("" when it did not, for a
    reader). Read permission counts by its mode bits as well as by ``access``: a superuser
    is refused nothing, yet a database made unreadable is one the run's owner took away."""
    if now is None:
        return "was deleted"
    if now.ino == -1:
        return "can no longer be reached (a folder above it lost its permissions)"
    if (now.dev, now.ino) != (before.dev, before.ino):
        return f"was replaced by another file (inode {before.ino} -> {now.ino})"
    if _readable(before.mode) and not _readable(now.mode) or not os.access(path, os.R_OK):
        return f"lost its read permission (mode {before.mode:04o} -> {now.mode:04o})"
    if is_dir:
        return ""
    if now.size < before.size:
        return f"was truncated ({before.size} -> {now.size} bytes)"
    if (now.size, now.mtime_ns) != (before.size, before.mtime_ns):
        return f"was rewritten ({before.size} -> {now.size} bytes)"
    return ""


@functools.cache
def leases_supported() -> bool:
    """Whether this platform has Linux's file leases (``fcntl.F_SETLEASE``); where not, a
    database replaced under a running reader is still noticed by its stamps, but a truncation
    is not held off: said once in the log."""
    if fcntl is not None and hasattr(fcntl, "F_SETLEASE") and hasattr(signal, "SIGURG"):
        return True
    log.info("database leases: not on this platform; a database truncated during a run is "
             "noticed by its stamps only")  # fmt: skip
    return False


class Lease:
    """A read lease on a file (Linux ``F_SETLEASE``): another process's open for writing or
    truncation of it waits (up to ``/proc/sys/fs/lease-break-time``) until the holder lets go,
    and the holder sees the break pending with ``F_GETLEASE``. Its signal is SIGURG, which is
    ignored unless a program asks for it. Where no lease can be taken (not the file's owner,
    a network file system) :attr:`held` is false."""

    def __init__(self, path: Path) -> None:
        self.fd: int | None = None
        if not leases_supported():
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
            fcntl.fcntl(fd, fcntl.F_SETOWN, 0)  # and signal no one
            self.fd = fd
        except (OSError, AttributeError):
            os.close(fd)

    @property
    def held(self) -> bool:
        return self.fd is not None

    def broken(self) -> bool:
        """True when another process waits to write or truncate the file."""
        try:
            return fcntl.fcntl(self.fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK
        except OSError:
            return True

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            os.close(self.fd)
            self.fd = None


class Watch:
    """Stamps of a database's folder and main file, taken when it was opened, and a lease on
    an LMDB's data file (it is read through a memory map)."""

    def __init__(self, path: Path, backend: str) -> None:
        self.path = path
        main = path / ("data.mdb" if backend == "lmdb" else "CURRENT")
        self.files = [(path, True), (main, False)]
        self.stamps = {f: stamp(f) for f, _ in self.files}
        self.reads = 0
        self.lease = Lease(main) if backend == "lmdb" else None

    def close(self) -> None:
        if self.lease is not None:
            self.lease.release()

    def change(self) -> str:
        """What changed since the database was opened ("" when nothing)."""
        for path, is_dir in self.files:
            before = self.stamps[path]
            if before is None:
                continue
            what = describe(path, before, stamp(path), is_dir)
            if what:
                return f"{path.name if path != self.path else 'its folder'} {what}"
        return ""

    def check(self) -> None:
        """Raise a DataError when the database changed since it was opened."""
        what = self.change()
        if what:
            raise DataError(
                f"{self.path}: the database changed during the run ({what}); restore it and "
                "resume from the last snapshot"
            )

    def tick(self) -> None:
        """Before a record is read: the main file is checked every time (an LMDB read past a
        truncated map is a SIGBUS, not an error), the folder every :data:`CHECK_EVERY`."""
        self.reads += 1
        if self.lease is not None and self.lease.held:
            if self.lease.broken():  # its truncation waits until we let go: never read on
                self.lease.release()
                raise DataError(
                    f"{self.path}: another process is writing or truncating data.mdb during "
                    "the run; restore the database and resume from the last snapshot"
                )
        elif self.stamps[self.files[1][0]] != stamp(self.files[1][0]):
            self.check()
        if self.reads % CHECK_EVERY == 0:
            self.check()


def content_id(records, entries: int | None) -> dict:
    """A database's identity by content: its record count (None where it costs a full scan)
    and a hash of the keys and values of its first records (``records``: an iterator of
    ``(key, value)`` in key order)."""
    digest = hashlib.sha256()
    for i, (key, value) in enumerate(records):
        if i == HEAD_RECORDS:
            break
        digest.update(len(key).to_bytes(4, "little") + key + len(value).to_bytes(8, "little"))
        digest.update(value)
    return {"entries": entries, "head": digest.hexdigest()[:16]}


def same_database(saved: dict | None, db, layer: str) -> tuple[dict, bool]:
    """``(db's content identity, whether a position saved with identity ``saved`` applies to
    it)``; warns, naming the layer, when it does not (the reader starts at the top)."""
    current = db.content_id()
    if saved is None or saved == current:
        return current, True
    log.warning(
        "layer %s: %s is not the database the saved position was taken in (its first records "
        "or count differ); reading it from its first record", layer, db.path,
    )  # fmt: skip
    return current, False
