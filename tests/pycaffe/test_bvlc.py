"""BVLC Caffe's own pycaffe test suite (python/caffe/test, kept verbatim in tests/pycaffe/bvlc)
through ``import caffe2jax as caffe``: every module, every test, passing.

Each module is copied into a temporary ``python/caffe/test`` folder with its ``caffe``
imports changed to ``caffe2jax`` (nothing else) and run by ``unittest`` in a subprocess from
that folder, as BVLC's ``make pytest`` does (the Python-layer tests import their module by
name from there, the solver test writes its snapshot there). Beside it, ``models`` and
``examples`` are Caffe's own (../shared/caffe/models), which ``test_draw`` draws every net
prototxt of (rendering needs Graphviz's ``dot``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.golden import require

BVLC = Path(__file__).resolve().parent / "bvlc"
CAFFE_TREE = Path(__file__).resolve().parents[2].parent / "shared" / "caffe" / "models"
MODULES = sorted(p.stem for p in BVLC.glob("test_*.py"))

IMPORTS = [
    (r"^import caffe\.draw$", "import caffe2jax as caffe"),
    (r"^import caffe$", "import caffe2jax as caffe"),
    (r"^from caffe\.(\w+) import", r"from caffe2jax.\1 import"),
    (r"^from caffe import", "from caffe2jax import"),
]


def ported(source: str) -> str:
    """``source`` with the one change a user makes: the ``caffe`` imports."""
    for pattern, replacement in IMPORTS:
        source = re.sub(pattern, replacement, source, flags=re.MULTILINE)
    return source


def test_the_ten_modules_are_all_here():
    assert len(MODULES) == 10, MODULES


def test_only_the_imports_change():
    for module in MODULES:
        source = (BVLC / f"{module}.py").read_text()
        changed = [(a, b) for a, b in zip(source.splitlines(), ported(source).splitlines())
                   if a != b]  # fmt: skip
        assert changed and all("caffe" in a and "import" in a for a, _ in changed), module
        assert all("caffe2jax" in b for _, b in changed)


@pytest.mark.parametrize("module", MODULES)
def test_bvlc_module_passes(module, tmp_path):
    folder = tmp_path / "python" / "caffe" / "test"
    folder.mkdir(parents=True)
    for tree in ("models", "examples"):
        (tmp_path / tree).symlink_to(require(CAFFE_TREE / tree), target_is_directory=True)
    for name in MODULES:  # test_solver imports test_net's net file helper
        (folder / f"{name}.py").write_text(ported((BVLC / f"{name}.py").read_text()))
    done = subprocess.run(
        [sys.executable, "-m", "unittest", "-v", module],
        cwd=folder, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    report = done.stderr[-6000:]
    assert done.returncode == 0, report
    ran = re.search(r"Ran (\d+) tests?", done.stderr)
    assert ran and int(ran.group(1)) > 0, report
    assert "skipped" not in done.stderr.splitlines()[-1], report
