"""Suite-wide fixtures."""

import os

import pytest


@pytest.fixture(autouse=True)
def _restore_cwd():
    """Every test ends in the folder it started in: a test that moves into a copied Caffe
    folder (solver paths are relative to the working directory, as in Caffe) must not make a
    later test in the same worker read that folder's files."""
    cwd = os.getcwd()
    yield
    os.chdir(cwd)
