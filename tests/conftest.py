"""Suite-wide fixtures."""

import os

import pytest

# the suite compiles each net once: a big program's quick first executable
# (runtime/host/first_run.py) would compile it twice; tests/runtime/host/test_first_run.py
# turns it on where it is tested
os.environ.setdefault("CAFFE2JAX_QUICK_FIRST_RUN", "0")


@pytest.fixture(autouse=True)
def _restore_cwd():
    """Every test ends in the folder it started in: a test that moves into a copied Caffe
    folder (solver paths are relative to the working directory, as in Caffe) must not make a
    later test in the same worker read that folder's files."""
    cwd = os.getcwd()
    yield
    os.chdir(cwd)
