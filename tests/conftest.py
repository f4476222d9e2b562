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


def pytest_configure(config):
    """``pytest -n 2`` (the README's command) schedules with xdist's ``worksteal``, not its
    default ``load``: each worker starts on one half of the suite in order and an idle worker
    takes half of the other's remaining tests, so a module's tests stay on one worker (its
    module-scoped fixtures, e.g. the fuzz run or a compiled net, are built once, not once per
    worker) and neither worker idles at the end. An explicit ``--dist`` is left as given."""
    explicit = any(a == "--dist" or a.startswith("--dist=") for a in config.invocation_params.args)
    if getattr(config.option, "dist", None) == "load" and not explicit:
        config.option.dist = "worksteal"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``heavy`` (minutes each on 2 cores: longer than the CI budget allows) run
    only when asked for (``pytest -m heavy``); otherwise they are deselected (a run without
    xdist counts them, "N deselected"; ``pytest --co -q -m heavy`` lists them)."""
    if "heavy" in (config.getoption("markexpr") or ""):
        return
    heavy = [item for item in items if item.get_closest_marker("heavy")]
    if heavy:
        config.hook.pytest_deselected(items=heavy)
        items[:] = [item for item in items if not item.get_closest_marker("heavy")]
