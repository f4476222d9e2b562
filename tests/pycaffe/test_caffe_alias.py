"""``caffe`` as a name of caffe2jax (caffe2jax/__init__.py): :func:`caffe2jax.install_as_caffe`
and a plain ``sys.modules['caffe'] = caffe2jax`` make ``import caffe``, ``import caffe.draw``,
``from caffe.proto import caffe_pb2``, ``from caffe.coord_map import crop``… give caffe2jax's
own modules, and BVLC's python/caffe/test suite (tests/pycaffe/bvlc, verbatim) runs with no
import changed. Each case runs in a subprocess: ``caffe`` stays unaliased in this one."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.golden import require
from tests.pycaffe.test_bvlc import BVLC, CAFFE_TREE, MODULES

CHECKS = """
import caffe
import caffe.draw
import caffe.io
import caffe.proto.caffe_pb2 as pb
from caffe.proto import caffe_pb2
from caffe.coord_map import crop
from caffe import layers as L, params as P
from caffe.pycaffe import Net
import caffe2jax
import caffe2jax.frontend.caffe_pb2
import caffe2jax.pycaffe.coord_map
import caffe2jax.pycaffe.draw
import caffe2jax.pycaffe.io

assert caffe is caffe2jax
assert caffe.draw is caffe2jax.pycaffe.draw and caffe.io is caffe2jax.pycaffe.io
assert caffe_pb2 is pb is caffe2jax.frontend.caffe_pb2 and caffe.proto is caffe2jax.proto
assert crop is caffe2jax.pycaffe.coord_map.crop
assert Net is caffe2jax.Net and L is caffe2jax.pycaffe.net_spec.layers
assert str(caffe.TEST) == "TEST" and caffe.TEST == caffe_pb2.TEST
try:
    import caffe.no_such_module
except ModuleNotFoundError as err:
    assert str(err) == "No module named 'caffe.no_such_module'", err
else:
    raise AssertionError("caffe.no_such_module imported")
# one copy of each module: no caffe2jax module loaded a second time under the caffe name
root = caffe2jax.__file__.rsplit("/caffe2jax/", 1)[0]
objects = {}
for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None)
    if path and path.startswith(root):
        objects.setdefault(path, set()).add(id(module))
assert len(objects) > 20 and all(len(ids) == 1 for ids in objects.values()), objects
print("ok")
"""

WAYS = {
    "install_as_caffe": "import sys, caffe2jax\ncaffe2jax.install_as_caffe()\n",
    "sys.modules": "import sys, caffe2jax\nsys.modules['caffe'] = caffe2jax\n",
}


def _python(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=900)  # fmt: skip


@pytest.mark.parametrize("way", WAYS)
def test_caffe_names_give_caffe2jax_modules(way):
    done = _python(WAYS[way] + textwrap.dedent(CHECKS))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_another_caffe_already_imported_is_refused():
    code = (
        "import sys, types, caffe2jax\n"
        "sys.modules['caffe'] = types.ModuleType('caffe')\n"
        "try:\n    caffe2jax.install_as_caffe()\n"
        "except caffe2jax.CaffeError as err:\n    print(err)\n"
    )
    done = _python(code)
    assert "another 'caffe' module is already imported" in done.stdout, done.stderr[-3000:]
    assert "before anything imports caffe" in done.stdout


def test_bvlc_suite_runs_verbatim_through_a_caffe_alias(tmp_path):
    """All ten modules, unchanged, in one process whose only setup is the alias."""
    folder = tmp_path / "python" / "caffe" / "test"
    folder.mkdir(parents=True)
    for tree in ("models", "examples"):
        (tmp_path / tree).symlink_to(require(CAFFE_TREE / tree), target_is_directory=True)
    for name in MODULES:
        shutil.copy(BVLC / f"{name}.py", folder / f"{name}.py")
    code = WAYS["sys.modules"] + (
        f"sys.path.insert(0, '.')\nimport unittest\nunittest.main(module=None, argv=['caffe', "
        f"'-v', *{MODULES!r}])\n"
    )
    done = _python(code, cwd=folder)
    report = done.stderr[-6000:]
    assert done.returncode == 0, report
    ran = re.search(r"Ran (\d+) tests", done.stderr)
    assert ran and int(ran.group(1)) == 52, report  # BVLC's ten modules hold 52 tests
    assert done.stderr.splitlines()[-1] == "OK", report  # no skip, no expected failure
