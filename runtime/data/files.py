"""Locating the files a data layer names, and reading Caffe's list files.

Caffe opens every relative path (``source``, ``mean_file``, the files an HDF5 list names) against
the process's working directory. caffe2jax keeps that rule first and then falls back on the
folder of the prototxt (``base_dir``), so a net runs both from Caffe's usual working directory
and from anywhere else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from caffe2jax.frontend.errors import DataError

_LABEL = re.compile(r"[+-]?\d+")


def resolve_input(
    path: str | Path, base_dir: Path | None, what: str, also: Path | None = None
) -> Path:
    """Find an existing file or folder named by a layer: as given (absolute or against the
    working directory, as Caffe does), else against ``base_dir``, else against ``also`` (e.g.
    the folder of the list file naming it). ``what`` names it in errors."""
    if not str(path):
        raise DataError(f"{what}: no path given")
    given = Path(path).expanduser()
    if _exists(given, what):
        return given
    folders = [Path(d) for d in (base_dir, also) if d is not None]
    if not given.is_absolute():
        for folder in folders:
            if _exists(folder / given, what):
                return folder / given
    where = "".join(f" or in {d}" for d in folders) if not given.is_absolute() else ""
    raise DataError(f"{what} not found: {path} (looked in the working directory{where})")


def _exists(path: Path, what: str) -> bool:
    """``path.exists()``, with a name no file can have (too long, a NUL byte) or a folder
    that cannot be searched told as one DataError line naming ``what``."""
    try:
        return path.exists()
    except (OSError, ValueError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        name = str(path) if len(str(path)) <= 60 else str(path)[:57] + "..."
        raise DataError(f"{what}: cannot look up {name!r} ({reason})") from None


@dataclass(frozen=True)
class ListEntry:
    """One ``path label`` line of an image list file (ImageData, convert_imageset)."""

    path: str
    label: int
    line: int


def parse_list_file(path: Path) -> list[ListEntry]:
    """Read an image list as Caffe does: the label is what follows the *last* space of the
    line, so image paths may contain spaces. Blank lines are skipped; a line without an integer
    label raises (Caffe's ``atoi`` would silently read it as label 0)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as err:
        raise DataError(f"{path}: cannot read list file ({err.strerror})") from err
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        name, sep, label = line.rpartition(" ")
        if not sep or not name or not _LABEL.fullmatch(label):
            raise DataError(f"{path}:{number}: expected 'path label', got {line!r}")
        entries.append(ListEntry(name, int(label), number))
    if not entries:
        raise DataError(f"{path}: list file is empty")
    return entries


def parse_hdf5_list(path: Path) -> list[str]:
    """File names of an HDF5Data ``source``: whitespace-separated tokens, as Caffe's
    ``source_file >> line`` reads them (so a name cannot contain spaces)."""
    try:
        names = Path(path).read_text(encoding="utf-8", errors="surrogateescape").split()
    except OSError as err:
        raise DataError(f"{path}: cannot read HDF5 list file ({err.strerror})") from err
    if not names:
        raise DataError(f"{path}: must list at least 1 HDF5 file")
    return names
