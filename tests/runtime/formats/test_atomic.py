"""Atomic writes (runtime/formats/atomic.py): an output name no file can have (empty, a
folder's) is one CaffeError line, not a ValueError from pathlib."""

from __future__ import annotations

from pathlib import Path

import pytest

from caffe2jax.frontend.errors import CaffeError
from caffe2jax.runtime.formats.atomic import atomic_write


@pytest.mark.parametrize("name", ["", ".", "/"])
def test_an_empty_or_folder_name_is_one_line(name):
    with pytest.raises(CaffeError, match="not a file name to write"):
        atomic_write(Path(name), "x")
