"""Seeded, bounded fuzzing of every Caffe file caffe2jax reads: mutated nets, solvers, binary
and HDF5 weights, solverstates (binary and HDF5), binaryprotos and LMDB databases.

Every case must end in a result or a one-line CaffeError (at most 400 characters): no other
exception, none over its time limit (10 s), none past the worker's 2 GiB address-space limit
(RLIMIT_AS: an allocation beyond it is a MemoryError, counted as a failure), no crash.
``CAFFE2JAX_FUZZ_SCALE`` multiplies the case counts (the CI run: ~3,000 cases); the larger
run is ``python scripts/fuzz.py``.
"""

from __future__ import annotations

import os

import pytest

from tests.fuzz.runner import Report, run

SCALE = float(os.environ.get("CAFFE2JAX_FUZZ_SCALE", "1"))
SEED = int(os.environ.get("CAFFE2JAX_FUZZ_SEED", "20261122"))
COUNTS = {
    "net": 600,
    "solver": 300,
    "weights": 400,
    "weights_h5": 500,
    "solverstate": 400,
    "binaryproto": 300,
    "lmdb": 400,
}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Report:
    counts = {kind: max(1, int(n * SCALE)) for kind, n in COUNTS.items()}
    return run(counts, SEED, tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize("kind", sorted(COUNTS))
def test_every_case_ends_clean(report, kind):
    results = [r for r in report.results if r.kind == kind]
    assert len(results) == max(1, int(COUNTS[kind] * SCALE))
    failures = [r for r in results if r.status not in ("ok", "clean")]
    assert not failures, "\n".join(
        f"{r.kind} case {r.index} (seed {SEED}): {r.status}: {r.message}" for r in failures[:10]
    )
    # the cases reach both outcomes: files that still read, and files refused in one line
    statuses = {r.status for r in results}
    assert "clean" in statuses, kind
    if kind not in ("binaryproto",):
        assert "ok" in statuses, kind
