"""Checks on the file names a solver will write or read, made when the solver is set up.

Caffe finds out at its first snapshot that ``snapshot_prefix`` names a file it cannot create
(a name longer than the file system allows, a folder under ``/proc``); here the same is told
at once, as one CaffeError line, through the API as through the CLI. The longest name a
snapshot writes is the resume record's temporary file, ``.<prefix>_iter_<N>.solverstate.
resume.json.<pid>.<hex>.tmp``; that is what must fit in ``NAME_MAX``.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

NAME_MAX = 255  # bytes of one path component (Linux file systems; statvfs may say less)
PATH_MAX = 4096
# the longest snapshot file name beyond the prefix's last part (iteration up to INT_MAX,
# the resume record, and the temporary name atomic writes use: ".{name}.{pid}.{hex8}.tmp")
SNAPSHOT_SUFFIX = len("_iter_2147483647.solverstate.resume.json") + len("..4194304.12345678.tmp")
PSEUDO_FILESYSTEMS = {
    "proc", "sysfs", "cgroup", "cgroup2", "devpts", "debugfs", "tracefs", "securityfs",
    "configfs", "bpf", "pstore", "efivarfs", "mqueue", "fusectl", "binfmt_misc",
}  # fmt: skip


def short(text: str) -> str:
    """A name cut to 60 characters for a message (its start and its end kept)."""
    return text if len(text) <= 60 else text[:40] + "..." + text[-12:]


def existing_ancestor(path: Path) -> Path:
    """The nearest folder of ``path`` (itself included) that exists."""
    path = Path(os.path.abspath(path))
    while True:
        try:
            if path.exists():
                return path
        except OSError:
            pass
        if path.parent == path:
            return path
        path = path.parent


def filesystem_of(path: Path) -> str:
    """The type of the file system ``path`` lies on: the longest mount point above it in
    psutil's ``disk_partitions(all=True)`` (every OS); "" if unknown."""
    try:
        real = os.path.realpath(path)
        mounts = psutil.disk_partitions(all=True)
    except (OSError, ValueError, RuntimeError):
        return ""
    best, kind = "", ""
    for mount in mounts:
        point = mount.mountpoint
        inside = real == point or real.startswith(point.rstrip(os.sep) + os.sep)
        if inside and len(point) >= len(best):
            best, kind = point, mount.fstype
    return kind


def name_problem(path: str, extra: int = 0) -> str:
    """What makes ``path`` a name no file can have ("" when nothing): a NUL byte, more than
    PATH_MAX bytes, or a part longer than NAME_MAX (the last part with ``extra`` bytes
    more)."""
    if "\0" in path:
        return "contains a NUL byte"
    raw = os.fsencode(path)
    if len(raw) + extra > PATH_MAX:
        return f"is {len(raw)} bytes long; a path may have at most {PATH_MAX}"
    parts = raw.split(b"/")
    for i, part in enumerate(parts):
        more = extra if i == len(parts) - 1 else 0
        if len(part) + more > NAME_MAX:
            added = f" ({NAME_MAX} with the {more} bytes added to it)" if more else ""
            which = f"its part {short(os.fsdecode(part))!r}" if len(parts) > 1 else "it"
            return f"{which} has {len(part)} bytes; at most {NAME_MAX - more} fit{added}"
    return ""


def output_problem(path: str, extra: int = 0) -> str:
    """What stops files named ``path`` (plus up to ``extra`` bytes) from being created ("" when
    nothing): its name, a part of its folder that is a file, or a folder on a pseudo file
    system such as /proc or /sys."""
    problem = name_problem(path, extra)
    if problem:
        return problem
    folder = existing_ancestor(Path(path).parent)
    if not folder.is_dir():
        return f"its folder '{short(str(folder))}' is a file"
    kind = filesystem_of(folder)
    if kind in PSEUDO_FILESYSTEMS:
        return f"its folder '{short(str(folder))}' is on a {kind} file system, not for files"
    return ""


def check_snapshot_prefix(prefix: str) -> str:
    """The problem with a solver's ``snapshot_prefix`` ("" when none or unset)."""
    if not prefix:
        return ""
    return output_problem(prefix, SNAPSHOT_SUFFIX)
