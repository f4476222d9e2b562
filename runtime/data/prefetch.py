"""Background prefetching of batches, as Caffe's BasePrefetchingDataLayer does.

Caffe's prefetching data layers (Data, ImageData) run a thread that keeps
``data_param.prefetch`` batches (4 by default, read from ``data_param`` whatever the layer type)
loaded ahead of the net. :class:`Prefetcher` does the same for any :class:`DataSource`; with
``to_device`` it also calls ``jax.device_put`` in the thread, so the host→device copy overlaps
the computation. Batches come out in the order the source produced them. An exception raised
by the source is re-raised, unchanged, by the consumer's next ``next_batch`` call (and every
later one).
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from typing import Any

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.runtime.data.sources import DataSource

_POLL_S = 0.05


def prefetch_depth(layer: caffe_pb2.LayerParameter) -> int:
    """Batches Caffe prefetches for a layer: ``data_param.prefetch`` (default 4)."""
    return max(1, int(layer.data_param.prefetch))


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher(DataSource):
    """Reads batches from ``source`` in a background thread, up to ``depth`` ahead. Owns the
    source: :meth:`close` stops the thread, then closes the source."""

    def __init__(
        self,
        source: DataSource,
        depth: int = 4,
        *,
        to_device: bool = False,
        device: Any = None,
    ) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, not {depth}")
        self.source = source
        self.name = getattr(source, "name", "")
        self._to_device = to_device or device is not None
        self._device = device
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._failure: _Failure | None = None
        self._closed = False
        self._state = source.get_state()
        self._start()
        # A daemon thread still inside a read or a device transfer when the interpreter
        # finalizes can abort the process: stop it first.
        atexit.register(_close_at_exit, weakref.ref(self))

    def _start(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"prefetch-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batch: Any = self.source.next_batch()
                state = self.source.get_state()
                if self._to_device:
                    import jax

                    batch = jax.device_put(batch, self._device)
                if not self._put((batch, state)):
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
        return False

    def top_shapes(self) -> list[tuple[int, ...]]:
        return self.source.top_shapes()

    def next_batch(self) -> list[np.ndarray]:
        """The next batch, in order (numpy arrays, or jax arrays with ``to_device``)."""
        if self._failure is not None:
            raise self._failure.error
        if self._closed:
            raise RuntimeError("the prefetcher is closed")
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the prefetch thread stopped unexpectedly") from None
        if isinstance(item, _Failure):
            self._failure = item
            raise item.error
        batch, self._state = item
        return batch

    def get_state(self) -> dict:
        """The source's state after the last batch handed out (not the thread's, which reads
        ahead)."""
        return self._state

    def set_state(self, state: dict) -> None:
        """Go on from ``state``: batches read ahead are dropped and the source is moved."""
        self._halt()
        self.source.set_state(state)
        self._state = self.source.get_state()
        self._start()

    def _halt(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            self._drain()
            self._thread.join(timeout=_POLL_S)
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

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
