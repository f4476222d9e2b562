"""Seeded, bounded fuzzing of every Caffe file caffe2jax reads and of its entry points:
mutated nets, solvers, binary and HDF5 weights, solverstates (binary and HDF5), binaryprotos,
LMDB and LevelDB databases (raw and encoded-image Datums), ImageData and HDF5Data lists, the
CLI verbs, the pycaffe entry points, the fork layers' parameters and the newer verbs (detect,
convert_annoset, rl fields; tests/fuzz/fork_cases.py).

Every case must end in a result or a one-line CaffeError (at most 240 characters): no other
exception, none over its time limit (60 s), none past the worker's 4 GiB address-space limit
(RLIMIT_AS: an allocation beyond it is a MemoryError, counted as a failure), no crash.
``CAFFE2JAX_FUZZ_SCALE`` multiplies the case counts (the CI run: ~2,000 cases, under two
minutes); the long run is ``python scripts/fuzz.py --cases 10000``.
"""

from __future__ import annotations

import os

import pytest

from tests.fuzz.runner import Report, run

SCALE = float(os.environ.get("CAFFE2JAX_FUZZ_SCALE", "1"))
SEED = int(os.environ.get("CAFFE2JAX_FUZZ_SEED", "20261122"))
COUNTS = {
    "net": 300,
    "solver": 200,
    "weights": 250,
    "weights_h5": 250,
    "solverstate": 300,
    "binaryproto": 200,
    "lmdb": 250,
    "lmdb_images": 80,
    "leveldb": 40,
    "imagedata": 100,
    "hdf5data": 100,
    "cli": 4,
    "pycaffe": 4,
    "fork_params": 12,
    "new_verbs": 3,
}
# kinds whose few CI cases may all be refusals (the long run reaches both outcomes)
REFUSALS_ONLY = {"binaryproto", "cli", "pycaffe", "hdf5data", "leveldb", "lmdb_images", "new_verbs"}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Report:
    counts = {kind: max(1, int(n * SCALE)) for kind, n in COUNTS.items()}
    light = os.environ.get("CAFFE2JAX_FUZZ_LIGHT")
    os.environ["CAFFE2JAX_FUZZ_LIGHT"] = "1"  # no 100000-item batches (data_cases.HEAVY_BATCH)
    try:
        return run(counts, SEED, tmp_path_factory.mktemp("fuzz"))
    finally:
        if light is None:
            del os.environ["CAFFE2JAX_FUZZ_LIGHT"]


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
    if kind not in REFUSALS_ONLY:
        assert "ok" in statuses, kind
