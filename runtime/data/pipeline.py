"""The prefetch thread of an item source (Data, ImageData…) with worker threads.

The prefetch thread plans batches in order (:meth:`~.base.ItemSource.plan`: the cursor, the
list, the shuffles) and hands runs of each batch's rows to the worker threads
(:mod:`.workers`), which decode and transform every item straight into its row of a batch
slot preallocated once. Two batches are filled at a time, so the workers go on with the next
while the thread finishes the first: puts it on its device (or devices, by the mesh's read
plan; the copy overlaps the step running on the device), waits for the copy, and frees the
slot for the batch after next. Without a device the batch is handed out as it is, in a new
slot each time (nothing copies it); so is a slot a CPU device took without copying.

The batches and the reader states handed out are those of the reader alone, in the same
order, byte for byte: items sit at fixed rows, and their random crops and mirrors depend on
their positions only (:mod:`.transform`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from caffe2jax.runtime.data.base import ItemSource, Planned
from caffe2jax.runtime.data.shards import ReadPlan
from caffe2jax.runtime.data.workers import worker_pool

AHEAD = 2  # batches being filled at once


@dataclass
class Stats:
    """Seconds spent per stage, summed over the batches so far (decode and transform are
    the workers' time, summed over the workers)."""

    batches: int = 0
    items: int = 0
    plan_s: float = 0.0
    decode_s: float = 0.0
    transform_s: float = 0.0
    put_s: float = 0.0
    waited_s: float = 0.0  # the consumer's wait for a batch (input-bound time)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **seconds: float) -> None:
        with self.lock:
            for name, value in seconds.items():
                setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> dict[str, float]:
        with self.lock:
            return {k: v for k, v in vars(self).items() if k != "lock"}


@dataclass
class Job:
    """One planned batch: the reader's state after it, where it goes ((tag, device) pairs;
    a tag is ``(position in the period, slot)`` with a read plan, else None) and, once
    submitted, its slot and the workers' futures."""

    planned: Planned | None
    state: dict
    targets: list[tuple[Any, Any]]
    error: BaseException | None = None
    out: list | None = None
    futures: list = field(default_factory=list)


def jobs(reader: ItemSource, plan: ReadPlan | None, device: Any) -> Iterator[Job]:
    """The reader's batches in order; with ``plan``, only this process's, the others skipped
    undecoded (the state handed with a batch includes the skips after it up to the next read
    or the period's end, as :class:`~.prefetch.Prefetcher` does). A planning error ends the
    stream as a job that carries it, after the batches planned before."""
    position = 0
    try:
        while True:
            if plan is None:
                yield Job(reader.plan(), reader.get_state(), [(None, device)])
                continue
            while not plan.targets[position]:
                reader.skip(1)
                position = (position + 1) % plan.period
            planned, read = reader.plan(), position
            position += 1
            while position < plan.period and not plan.targets[position]:
                reader.skip(1)
                position += 1
            position %= plan.period
            targets = [((read, slot), plan.devices[slot]) for slot in plan.targets[read]]
            yield Job(planned, reader.get_state(), targets)
    except Exception as err:  # handed to the consumer after the batches before it
        yield Job(None, {}, [], error=err)


def chunks(rows: int, workers: int) -> list[range]:
    """Runs of rows for the workers: about four per worker, so they finish together."""
    size = max(1, -(-rows // (4 * workers)))
    return [range(start, min(rows, start + size)) for start in range(0, rows, size)]


class Filler:
    """Fills the batches of ``reader`` with ``workers`` threads for a prefetcher: ``put``
    queues one ``(batch, state, tag)`` item and returns False once the prefetcher stops."""

    def __init__(self, reader: ItemSource, workers: int, *, to_device: bool, stats: Stats):
        self.reader, self.to_device, self.stats = reader, to_device, stats
        self.pool = worker_pool(workers)
        self.workers = workers
        self.free: list[list] = []

    def run(self, stream: Iterator[Job], put: Any, stop: threading.Event) -> None:
        """Submit up to :data:`AHEAD` batches, hand out the oldest when it is filled."""
        inflight: deque[Job] = deque()
        try:
            while not stop.is_set():
                while len(inflight) < AHEAD and (not inflight or inflight[-1].error is None):
                    start = time.perf_counter()
                    job = next(stream)
                    self.stats.add(plan_s=time.perf_counter() - start)
                    if job.error is None:
                        self._submit(job)
                    inflight.append(job)
                job = inflight.popleft()
                if job.error is not None:
                    raise job.error
                if not self._hand_out(job, put):
                    return
        finally:
            for job in inflight:  # nothing may write into a slot once the thread is gone
                for future in job.futures:
                    future.cancel()
                for future in job.futures:
                    if not future.cancelled():
                        future.exception()

    def _submit(self, job: Job) -> None:
        reader = self.reader
        job.out = self.free.pop() if self.free else reader.empty_batch()
        job.futures = [self.pool.submit(_fill, reader, job.planned, rows, job.out)
                       for rows in chunks(reader.batch_size, self.workers)]  # fmt: skip

    def _hand_out(self, job: Job, put: Any) -> bool:
        for future in job.futures:
            decode, total = future.result()  # re-raises a worker's error
            self.stats.add(decode_s=decode, transform_s=total - decode)
        self.stats.add(batches=1, items=self.reader.batch_size)
        batch = self.reader.batch_of(job.planned, job.out)
        if not self.to_device:
            return put((batch, job.state, job.targets[0][0]))
        import jax

        start = time.perf_counter()
        placed = [(jax.device_put(batch, device), tag) for tag, device in job.targets]
        jax.block_until_ready([batch for batch, _ in placed])  # the slot is read: free it
        self.stats.add(put_s=time.perf_counter() - start)
        if not _aliased([batch for batch, _ in placed], job.out):
            self.free.append(job.out)
        return all(put((batch, job.state, tag)) for batch, tag in placed)


def _aliased(placed: list, host: list) -> bool:
    """Whether a device array uses the host slot's memory (a CPU device may take an aligned
    numpy array as it is, with no copy: the slot then belongs to it and is not reused)."""
    import jax

    pointers = {array.ctypes.data for array in host}
    for leaf in jax.tree.leaves(placed):
        if len(leaf.devices()) == 1 and leaf.unsafe_buffer_pointer() in pointers:
            return True
    return False


def _fill(reader: ItemSource, planned: Planned, rows: range, out: list) -> tuple[float, float]:
    start = time.perf_counter()
    decode = reader.fill(planned, rows, out)
    return decode, time.perf_counter() - start
