"""Writing user files safely: atomically (temp file + rename), never clobbering by surprise.

Every file caffe2jax writes (weights, solver states, mean files, exports, prototxts) goes
through here: a reader never sees a half-written file, an interrupted write leaves the old
file (if any) intact and no temp file behind, and new files get the usual 0666 & ~umask mode.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from caffe2jax.frontend.errors import CaffeError


def temp_beside(path: Path) -> Path:
    """A fresh hidden temporary name in ``path``'s folder, for writing then renaming."""
    if not path.name or path.name in (".", ".."):  # "", ".", "/": no file can be written there
        raise CaffeError(f"'{path}': not a file name to write (an empty or folder name)")
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def remove_stale_temps(folder: Path, prefix: str = "") -> list[Path]:
    """Remove temp files (:func:`temp_beside`) for names starting with ``prefix`` in
    ``folder`` whose writing process is gone: what a killed run left behind."""
    removed = []
    if not folder.is_dir():
        return removed
    for tmp in folder.glob(f".{prefix}*.tmp"):
        parts = tmp.name.rsplit(".", 3)  # .<name>.<pid>.<hex>.tmp
        if len(parts) != 4 or not parts[1].isdigit():
            continue
        if _alive(int(parts[1])):
            continue
        with contextlib.suppress(OSError):
            tmp.unlink()
            removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _check(path: Path, overwrite: bool) -> None:
    if path.is_dir():
        raise CaffeError(f"{path}: is a directory; give a file name to write")
    if not overwrite and path.exists():
        raise CaffeError(f"{path} already exists; not overwriting it")
    if not path.parent.is_dir():
        raise CaffeError(f"{path.parent}: no such directory")


def refuse_overwrite(path: str | os.PathLike, force: bool) -> None:
    """A command's pre-flight check: an existing output is replaced only with ``--force``."""
    if not force and Path(path).exists():
        raise CaffeError(f"{path} already exists; pass --force to overwrite it")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, overwrite: bool = True) -> Iterator[Path]:
    """``with atomic_path(p) as tmp``: write the file at ``tmp`` (any library, e.g. h5py); on
    success it is fsynced and renamed to ``p``, on any error removed."""
    path = Path(path)
    tmp = temp_beside(path)
    _check(path, overwrite)
    try:
        yield tmp
        if tmp.exists():
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:  # name the user's path, not the hidden temp file (/proc/…, a full disk)
        raise CaffeError(f"{path}: cannot write it ({err.strerror or err})") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_stream(path: str | os.PathLike, *, overwrite: bool = True) -> Iterator[BinaryIO]:
    """``with atomic_stream(p) as f``: a binary file to stream into, renamed to ``p`` at the
    end (so large files never need to be held in memory whole)."""
    with atomic_path(path, overwrite=overwrite) as tmp:
        # O_EXCL: a fresh file of our own; mode 0o666 & ~umask like any ordinary file.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as handle:
            yield handle


def atomic_write(path: str | os.PathLike, data: bytes | str, *, overwrite: bool = True) -> Path:
    """Write ``data`` (text is UTF-8 encoded) to ``path`` atomically."""
    with atomic_stream(path, overwrite=overwrite) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)
