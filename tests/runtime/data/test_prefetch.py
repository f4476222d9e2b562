"""The background prefetcher: order, depth, error propagation, device transfer, shutdown."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.prefetch import Prefetcher, prefetch_depth
from caffe2jax.runtime.data.sources import DataSource, make_source

from .helpers import data_layer, layer, numbered_items, write_db


class Counting(DataSource):
    """Batch i is [full((2,), i)]; fails with a DataError at batch ``fail_at``."""

    name = "counting"

    def __init__(self, fail_at: int | None = None) -> None:
        self.produced = 0
        self.fail_at = fail_at
        self.closed = False
        self.lock = threading.Lock()

    def top_shapes(self):
        return [(2,)]

    def next_batch(self):
        with self.lock:
            if self.produced == self.fail_at:
                raise DataError(f"db: record '{self.produced:08d}': corrupt Datum")
            self.produced += 1
            return [np.full((2,), self.produced - 1, np.float32)]

    def close(self):
        self.closed = True


def _wait_for(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_batches_arrive_in_order_and_depth_bounds_read_ahead():
    source = Counting()
    prefetcher = Prefetcher(source, depth=3)
    assert prefetcher.top_shapes() == [(2,)]
    assert _wait_for(lambda: source.produced >= 4)
    time.sleep(0.1)
    assert source.produced <= 4  # 3 waiting in the queue + 1 blocked on put
    values = [int(prefetcher.next_batch()[0][0]) for _ in range(20)]
    assert values == list(range(20))
    prefetcher.close()
    assert source.closed
    prefetcher.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        prefetcher.next_batch()


def test_reader_errors_are_reraised_with_their_message():
    prefetcher = Prefetcher(Counting(fail_at=2), depth=4)
    assert [int(prefetcher.next_batch()[0][0]) for _ in range(2)] == [0, 1]
    for _ in range(2):  # and again on every later call
        with pytest.raises(DataError, match=r"db: record '00000002': corrupt Datum"):
            prefetcher.next_batch()
    prefetcher.close()


def test_device_put_in_the_thread():
    import jax

    prefetcher = Prefetcher(Counting(), depth=2, to_device=True)
    first, second = prefetcher.next_batch(), prefetcher.next_batch()
    assert isinstance(first[0], jax.Array)
    assert np.asarray(second[0]).tolist() == [1.0, 1.0]
    prefetcher.close()


def test_prefetching_a_data_source_keeps_its_batches(tmp_path):
    db = write_db(tmp_path / "db", numbered_items(5), list(range(5)))
    text = layer(data_layer(db, 3, extra="prefetch: 2", transform="mirror: true"))
    assert prefetch_depth(text) == 2
    assert prefetch_depth(layer('name: "x" type: "ImageData"')) == 4  # Caffe's default
    direct = make_source(text, "TRAIN", seed=9)
    expected = [direct.next_batch() for _ in range(4)]
    with Prefetcher(make_source(text, "TRAIN", seed=9), prefetch_depth(text)) as prefetcher:
        for batch in expected:
            got = prefetcher.next_batch()
            assert all(np.array_equal(a, b) for a, b in zip(got, batch, strict=True))
    direct.close()
