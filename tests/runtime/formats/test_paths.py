"""Names a solver will write, checked when it is set up (runtime/formats/paths.py)."""

from __future__ import annotations

from pathlib import Path

from caffe2jax.runtime.formats.paths import (
    NAME_MAX,
    SNAPSHOT_SUFFIX,
    check_snapshot_prefix,
    existing_ancestor,
    filesystem_of,
    name_problem,
)


def test_a_snapshot_name_must_fit_name_max_with_what_is_added(tmp_path):
    room = NAME_MAX - SNAPSHOT_SUFFIX
    assert check_snapshot_prefix(str(tmp_path / ("p" * room))) == ""
    problem = check_snapshot_prefix(str(tmp_path / ("p" * (room + 1))))
    assert f"has {room + 1} bytes; at most {room} fit ({NAME_MAX} with the" in problem


def test_folders_that_cannot_hold_files(tmp_path):
    (tmp_path / "file").write_text("")
    assert "is a file" in check_snapshot_prefix(str(tmp_path / "file" / "snap"))
    assert "on a proc file system" in check_snapshot_prefix("/proc/self/snap")
    assert "on a proc file system" in check_snapshot_prefix("/proc/self/no/such/folder/snap")
    assert "on a sysfs file system" in check_snapshot_prefix("/sys/snap")
    assert check_snapshot_prefix(str(tmp_path / "new" / "folders" / "snap")) == ""
    assert check_snapshot_prefix("") == ""


def test_helpers():
    assert existing_ancestor(Path("/proc/self/no/such")) == Path("/proc/self")
    assert filesystem_of(Path("/proc")) == "proc"
    assert name_problem("é" * 128) == "it has 256 bytes; at most 255 fit"
    assert name_problem("a/" + "é" * 128).startswith("its part 'éééé")
