"""Each process reads only its own devices' batches (Caffe's ``DataLayer::Skip``), and the
prefetch thread puts each device's batch on that device.

The cases run in tests/runtime/parallel/shard_worker.py, in a subprocess whose JAX sees 4 forced CPU
devices; a second process of a multi-host run is simulated by its local slots (1 and 3).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.runtime.parallel.devices_worker import LMDB
from tests.runtime.parallel.test_data_parallel import ROOT, env_with

READERS = ("Data", "ImageData", "HDF5Data", "MemoryData")
ITEMS = {"Data": 5, "ImageData": 3}  # records decoded per batch read (batch_size)


@pytest.fixture(scope="module")
def worker() -> dict:
    assert LMDB.exists()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.runtime.parallel.shard_worker"],
        capture_output=True, text=True, env=env_with(4), cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    return out


@pytest.mark.parametrize("kind", READERS)
def test_other_processes_batches_are_skipped_undecoded(worker, kind):
    """Of each round of 4, the process owning slots 1 and 3 reads batches 1 and 3 and skips
    0 and 2: a skip parses no Datum, opens no image and transforms nothing."""
    case = worker["sources"][kind]
    assert case["follows_plan"]
    assert case["reads"] >= 3 * 2 and case["skips"] >= 3 * 2 - 2
    assert case["items_per_read"] == ITEMS.get(kind, 0)
    if kind in ITEMS:
        assert case["transforms"] == case["reads"]


@pytest.mark.parametrize("kind", READERS)
def test_each_device_gets_the_one_process_batches(worker, kind):
    """Every local slot's batch equals the batch one process reading everything gives that
    slot (random crops, mirrors and shuffles included), on its own device, and the reader's
    state after a round is the one-process state."""
    case = worker["sources"][kind]
    assert case["equal"] and case["placed"] and case["state"]


@pytest.mark.parametrize("kind", READERS[:3])
def test_resume_and_late_plan_after_skips(worker, kind):
    """A reader restored to the state after a round goes on with the right batches, and so
    does a prefetcher given its plan after reading ahead without one."""
    for case in (worker["sources"][f"{kind}_resume"], worker["sources"][f"{kind}_late"]):
        assert case["equal"] and case["placed"] and case["state"]


def test_short_test_round_reads_the_repeated_batch_only_where_needed(worker):
    """3 test batches on 4 devices: slot 3 repeats batch 2, so the owner of slots 2 and 3
    reads batch 2 only, and the owner of slots 0 and 1 skips it."""
    high, low = worker["padding"]["[2, 3]"], worker["padding"]["[0, 1]"]
    for case in (high, low):
        assert case["equal"] and case["placed"] and case["state"] and case["follows_plan"]
    assert high["reads"] >= 2 and high["items_per_read"] == 5
    assert low["reads"] >= 4 and low["skips"] >= 2


def test_prefetch_thread_puts_each_slice_on_its_device(worker):
    """SolverLoop on 4 devices: every shard of the assembled input sits on its own device
    in the buffer the prefetch thread made; the main thread puts nothing; the rows are the
    one-device reader's 4 batches in slot order."""
    case = worker["placement"]
    assert case["main_thread_puts"] == 0
    assert case["on_own_device"] and case["from_prefetch_thread"] and case["equal"]
