"""Writing user files safely: atomically (temp file + rename), never clobbering by surprise."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from caffe2jax.errors import CaffeError


def atomic_write(path: str | os.PathLike, data: bytes | str, *, overwrite: bool = True) -> Path:
    """Write ``data`` to ``path`` through a temp file in the same folder and a rename.

    A reader never sees a half-written file, and an interrupted write leaves the old file (if
    any) intact. With ``overwrite=False`` an existing file is an error, and nothing is written.
    """
    path = Path(path)
    if not overwrite and path.exists():
        raise CaffeError(f"{path} already exists; not overwriting it")
    if not path.parent.exists():
        raise CaffeError(f"{path.parent}: no such directory")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
