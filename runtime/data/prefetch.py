"""Background prefetching of batches, as Caffe's BasePrefetchingDataLayer does.

Caffe's prefetching data layers (Data, ImageData) run a thread that keeps
``data_param.prefetch`` batches (4 by default, read from ``data_param`` whatever the layer type)
loaded ahead of the net. :class:`Prefetcher` does the same for any :class:`DataSource`; with
``to_device`` it also calls ``jax.device_put`` in the thread, so the host→device copy overlaps
the computation. Batches come out in the order the source produced them. An exception raised
by the source is re-raised, unchanged, by the consumer's next ``next_batch`` call (and every
later one).

On several devices, as Caffe gives each solver's data layer its own prefetch thread, the
thread follows a :class:`~.shards.ReadPlan`: it skips (without decoding) the batches of other
processes' devices and puts each batch it reads straight onto the device whose turn it is,
so the consumer (:meth:`Prefetcher.next_slot`) copies nothing.

With ``workers`` (item sources: Data, ImageData…) the thread plans the batches and worker
threads decode and transform their items in parallel into preallocated slots
(:mod:`.pipeline`); the batches, their order and the states are the same, byte for byte.
:attr:`Prefetcher.stats` has the seconds spent per stage, and how long the consumer waited.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from typing import Any

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import DataSource, ItemSource
from caffe2jax.runtime.data.pipeline import Filler, Stats, jobs
from caffe2jax.runtime.data.shards import Backlog, ReadPlan

_POLL_S = 0.05


def prefetch_depth(layer: caffe_pb2.LayerParameter) -> int:
    """Batches Caffe prefetches for a layer: ``data_param.prefetch`` (default 4)."""
    return max(1, int(layer.data_param.prefetch))


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher(DataSource):
    """Reads batches from ``source`` in a background thread, up to ``depth`` ahead. Owns the
    source: :meth:`close` stops the thread, then closes the source. With ``plan`` (or after
    :meth:`shard`) it reads for a device mesh (:meth:`next_slot`). ``workers`` > 0 decodes
    and transforms an item source's batches in that many worker threads."""

    def __init__(
        self,
        source: DataSource,
        depth: int = 4,
        *,
        to_device: bool = False,
        device: Any = None,
        plan: ReadPlan | None = None,
        workers: int = 0,
    ) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, not {depth}")
        self.source = source
        self.name = getattr(source, "name", "")
        self._to_device = to_device or device is not None
        self._device = device
        self.plan = plan
        self.workers = workers if isinstance(source, ItemSource) else 0
        self.stats = Stats()
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._failure: _Failure | None = None
        self._closed = False
        self._unsent: Any = None
        self._state = source.get_state()
        self._start(source)
        # A daemon thread still inside a read or a device transfer when the interpreter
        # finalizes can abort the process: stop it first.
        atexit.register(_close_at_exit, weakref.ref(self))

    def _start(self, reader: Any) -> None:
        self._stop = threading.Event()
        run = self._run if self.plan is None else self._run_plan
        if self.workers:
            run = self._run_items
        self._thread = threading.Thread(target=run, args=(reader,), name=f"prefetch-{self.name}",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def _run(self, reader: Any) -> None:
        try:
            while not self._stop.is_set():
                batch: Any = reader.next_batch()
                state = reader.get_state()
                if self._to_device:
                    import jax

                    batch = jax.device_put(batch, self._device)
                if not self._put((batch, state, None)):
                    return
        except BaseException as err:  # handed to the consumer, which re-raises it
            self._put(_Failure(err))

    def _run_items(self, reader: ItemSource) -> None:
        filler = Filler(reader, self.workers, to_device=self._to_device, stats=self.stats)
        try:
            stream = jobs(reader, self.plan, self._device)
            filler.run(stream, self._put, self._stop)
        except BaseException as err:  # handed to the consumer, which re-raises it
            self._put(_Failure(err))

    def _run_plan(self, reader: Any) -> None:
        """The plan's batches from its first position on: other processes' batches skipped,
        each batch read put on the device of every local slot it fills. The state handed
        with a batch includes the skips after it up to the next read or the period's end,
        so the state after a period's last batch is the period's end on every process."""
        import jax

        plan, position = self.plan, 0
        try:
            while not self._stop.is_set():
                while not plan.targets[position]:
                    reader.skip(1)
                    position = (position + 1) % plan.period
                batch, read = reader.next_batch(), position
                position += 1
                while position < plan.period and not plan.targets[position]:
                    reader.skip(1)
                    position += 1
                position %= plan.period
                state = reader.get_state()
                for slot in plan.targets[read]:
                    placed = jax.device_put(batch, plan.devices[slot])
                    if not self._put((placed, state, (read, slot))):
                        return
        except BaseException as err:  # handed to the consumer, which re-raises it
            self._put(_Failure(err))

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        self._unsent = item
        return False

    def top_shapes(self) -> list[tuple[int, ...]]:
        return self.source.top_shapes()

    def pad_to(self, batch: list, shapes: list[tuple[int, ...]]) -> list:
        return self.source.pad_to(batch, shapes)

    def next_batch(self) -> list[np.ndarray]:
        """The next batch, in order (numpy arrays, or jax arrays with ``to_device``)."""
        if self.plan is not None:
            raise DataError(
                f"layer {self.name!r} is read per device on a mesh: its batches go to the "
                "devices in turn and cannot be taken one at a time"
            )
        return self._take()[0]

    def next_slot(self) -> tuple[tuple[int, int], list]:
        """With a plan: the next ``(position in the period, slot)`` and the batch for that
        slot, already on its device."""
        batch, tag = self._take()
        return tag, batch

    def _take(self) -> tuple[Any, Any]:
        if self._failure is not None:
            raise self._failure.error
        if self._closed:
            raise RuntimeError("the prefetcher is closed")
        start = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                self.stats.add(waited_s=time.perf_counter() - start)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the prefetch thread stopped unexpectedly") from None
        if isinstance(item, _Failure):
            self._failure = item
            raise item.error
        batch, self._state, tag = item
        return batch, tag

    def shard(self, plan: ReadPlan) -> None:
        """Read by ``plan`` from now on (a no-op when it is the plan already). The batches
        read ahead so far are not lost: the plan starts with them, from the reader's
        position after the last batch handed out, which must begin a period."""
        if plan == self.plan:
            return
        if self.plan is not None or self.workers:  # start over at our state
            self._halt()
            self.plan = plan
            self.source.set_state(self._state)
            self._start(self.source)
            return
        self._stop.set()
        self._thread.join()
        items = [item.error if isinstance(item, _Failure) else item[:2]
                 for item in [*self._drain(), self._unsent] if item is not None]  # fmt: skip
        self._unsent, self.plan = None, plan
        self._start(Backlog(self.source, items))

    def get_state(self) -> dict:
        """The source's state after the last batch handed out (not the thread's, which reads
        ahead); checked against the source first (a snapshot never records a position in a
        database that changed under the run)."""
        check = getattr(self.source, "check_unchanged", None)  # databases (data/watch.py)
        if check is not None:
            check()
        return self._state

    def set_state(self, state: dict) -> None:
        """Go on from ``state``: batches read ahead are dropped and the source is moved (with
        a plan, ``state`` is taken at the end of a period and the plan starts over)."""
        self._halt()
        self.source.set_state(state)
        self._state = self.source.get_state()
        self._start(self.source)

    def _halt(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            self._drain()
            self._thread.join(timeout=_POLL_S)
        self._drain()
        self._unsent = None

    def _drain(self) -> list:
        """Empty the queue; what it held, in order."""
        items = []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return items

    def close(self) -> None:
        """Stop the thread (waiting for the batch it is reading) and close the source."""
        if self._closed:
            return
        self._closed = True
        self._halt()
        self.source.close()


def _close_at_exit(ref: weakref.ref) -> None:
    prefetcher = ref()
    if prefetcher is not None:
        prefetcher.close()
