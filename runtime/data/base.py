"""What every host-side data source is (:class:`DataSource`), and the shape of those whose
batch items are decoded and transformed one by one (:class:`ItemSource`: Data, ImageData, and
the forks' image layers), which the pipeline's worker threads fill in parallel.

An item source splits reading a batch in two: :meth:`ItemSource.plan` walks the records in
order in one thread (database cursor, list position, shuffles: cheap, sequential, the
reader's whole state), and :meth:`ItemSource.fill` decodes and transforms any run of the
planned items into its rows of a batch, in any thread, touching nothing shared but the rows
it writes. Random crops and mirrors come from the items' positions in the stream
(:mod:`.transform`), so a batch is the same bytes whoever fills which rows, and when.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.files import ListEntry
from caffe2jax.runtime.data.transform.transformer import PHASES, DataTransformer


class DataSource(ABC):
    """What a data layer feeds the net: fixed top shapes, then batches."""

    name: str

    @abstractmethod
    def top_shapes(self) -> list[tuple[int, ...]]:
        """The shape of every top, batch axis included."""

    @abstractmethod
    def next_batch(self) -> list[np.ndarray]:
        """One float32 array per top."""

    @abstractmethod
    def close(self) -> None:
        """Release files and databases."""

    def pad_to(self, batch: list, shapes: list[tuple[int, ...]]) -> list:
        """``batch`` at ``shapes`` (each at least the batch's own): a source whose tops are
        sized per batch (AnnotatedData's label rows) pads them, where one shape is needed
        across batches (a device mesh, iter_size passes); others have one shape already."""
        return list(batch)

    def skip(self, batches: int = 1) -> None:
        """Move past ``batches`` batches as Caffe's ``DataLayer::Skip`` moves past the records
        of other solvers: the reader ends exactly where reading them would leave it (cursor,
        random state, :meth:`get_state`), but nothing is decoded. Readers override this;
        the fallback reads and drops."""
        for _ in range(batches):
            self.next_batch()

    # Where a reader stands, for exact resume (beyond Caffe, whose snapshots do not record
    # it): plain fields and numpy Generators, by attribute path; JSON-friendly.
    STATE: tuple[str, ...] = ()
    RNGS: tuple[str, ...] = ()

    def get_state(self) -> dict:
        """The reader's position and random state after the batches it has produced.

        Cheap enough to take after every batch: fields are taken by reference (readers
        replace, never mutate, the arrays and lists named in ``STATE``); :func:`plain`
        turns a state into JSON values when it is written."""
        fields = {name: getattr(self, name) for name in self.STATE}
        rngs = [_attr(self, path).bit_generator.state for path in self.RNGS
                if _attr(self, path) is not None]  # fmt: skip
        return {"fields": fields, "rngs": rngs}

    def set_state(self, saved: dict) -> None:
        """Continue exactly where :meth:`get_state` was taken."""
        for name, value in saved["fields"].items():
            current = getattr(self, name)
            setattr(self, name, np.asarray(value, current.dtype)
                    if isinstance(current, np.ndarray) else value)  # fmt: skip
        live = [_attr(self, path) for path in self.RNGS if _attr(self, path) is not None]
        for rng, state in zip(live, saved["rngs"], strict=True):
            rng.bit_generator.state = state
        self._restored()

    def _restored(self) -> None:  # noqa: B027 - most readers have nothing to re-derive
        """Re-derive what the saved fields imply (files to reopen, cursors to move)."""

    def __enter__(self) -> DataSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Planned:
    """One batch as :meth:`ItemSource.plan` read it: a record per item (what ``fill``
    decodes: a key and value, a list entry…) and the items' positions in the stream."""

    records: Sequence[object]
    positions: np.ndarray


class ItemSource(DataSource):
    """A source of (data, label) batches whose items are decoded and transformed one by one.

    Subclasses set ``batch_size``, ``labels`` (whether there is a label top), ``transformer``,
    ``item_shape`` and ``_shapes``, and implement :meth:`_records` (the next batch's records,
    moving the reader), :meth:`_skip_records` and :meth:`_item` (decode one record). The
    position of the next item is ``position``: part of the state, it keys the random crops
    and mirrors.

    A layer whose items are more than one image and a scalar label (an image and its label
    map, a clip of frames, a warped window) overrides :meth:`fill` instead of ``_item``: it
    writes its rows of every top, drawing crops and mirrors for all of an item's parts from
    ``self.transformer.draws(planned.positions[...])`` (see :class:`~.window_data.
    WindowDataSource`). Planning, skips, worker threads, slots and exact resume stay as
    they are."""

    batch_size: int
    labels: bool = True
    transformer: DataTransformer
    item_shape: tuple[int, ...]
    _shapes: list[tuple[int, ...]]
    position = 0

    @abstractmethod
    def _records(self) -> Sequence[object]:
        """The next ``batch_size`` records, in order; the reader moves past them."""

    @abstractmethod
    def _skip_records(self) -> None:
        """Move past the next ``batch_size`` records without reading them."""

    @abstractmethod
    def _item(self, record: object) -> tuple[np.ndarray, float]:
        """One record decoded: its C×H×W pixels (uint8 or float32) and its label."""

    def _where(self, record: object) -> str:
        return f"layer {self.name!r}"

    def top_shapes(self) -> list[tuple[int, ...]]:
        return list(self._shapes)

    def plan(self) -> Planned:
        """The next batch's records and positions; the reader moves past them. The batch is
        checked first (:func:`checked_batch`): no list of 2^31 records is built for it."""
        checked_batch(self.name, self.top_shapes())
        start = self.position
        records = self._records()
        self.position = start + self.batch_size
        return Planned(records, np.arange(start, start + self.batch_size, dtype=np.int64))

    def empty_batch(self) -> list[np.ndarray]:
        """Uninitialised float32 arrays, one per top, for :meth:`fill` to write (aligned
        so that a CPU device takes them as they are, without a copy); checked first against
        Caffe's blob limits and the memory this process may use."""
        return [aligned_empty(shape) for shape in checked_batch(self.name, self.top_shapes())]

    def fill(self, planned: Planned, rows: range, out: list[np.ndarray]) -> float:
        """Decode and transform the items ``rows`` of ``planned`` into those rows of ``out``
        (one array per top), in one pass per item. Safe to call from several threads on
        different rows. Returns the seconds spent decoding (the rest transformed)."""
        decoding = [0.0]
        labels = out[1] if self.labels else None

        def items() -> Iterator[np.ndarray]:
            for row in rows:
                start = time.perf_counter()
                record = planned.records[row]
                pixels, label = self._item(record)
                if pixels.shape != self.item_shape:
                    raise DataError(
                        f"{self._where(record)}: shape {pixels.shape} differs from the first "
                        f"item's {self.item_shape} (a batch has one shape)"
                    )
                if labels is not None:
                    labels[row] = label
                decoding[0] += time.perf_counter() - start
                yield pixels

        draws = self.transformer.draws(planned.positions[rows.start : rows.stop], self.item_shape)
        self.transformer(items(), draws, out[0][rows.start : rows.stop])
        return decoding[0]

    def batch_of(self, planned: Planned, out: list[np.ndarray]) -> list[np.ndarray]:
        """The arrays handed to the net once ``out`` (a slot of :meth:`empty_batch`'s shapes)
        holds ``planned``: ``out`` itself, or views of its heads where a top is sized per
        batch (AnnotatedData's label)."""
        return out

    def next_batch(self) -> list[np.ndarray]:
        planned = self.plan()
        out = self.empty_batch()
        self.fill(planned, range(self.batch_size), out)
        return self.batch_of(planned, out)

    def skip(self, batches: int = 1) -> None:
        """Move past ``batches`` batches: the records are not read, nothing is decoded, and
        the positions (so the crops and mirrors of the batches after) move on."""
        for _ in range(batches):
            self._skip_records()
            self.position += self.batch_size


def checked_batch(layer: str, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """``shapes``, once one batch of them is known to be shapes Caffe allows that fit in
    memory (a DataError naming ``layer`` otherwise, before anything is allocated)."""
    from caffe2jax.runtime.host.memory import check_batches_fit

    check_batches_fit(layer, [f"#{i}" for i in range(len(shapes))], shapes, 1)
    return shapes


def aligned_empty(shape: tuple[int, ...], align: int = 64) -> np.ndarray:
    """An uninitialised float32 array whose data starts on an ``align``-byte boundary: XLA's
    CPU client then uses the array's memory as a device buffer instead of copying it
    (measured on a 158 MB batch: ~1 ms, against 0.45 s for the copy of an unaligned one on
    this shared 2-core machine)."""
    size = int(np.prod(shape, dtype=np.int64)) * 4
    raw = np.empty(size + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start : start + size].view(np.float32).reshape(shape)


def make_rngs(seed: int | None, count: int) -> list[np.random.Generator]:
    """Independent generators derived from one seed (``None``: fresh entropy)."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(count)]


def draw_key(rng: np.random.Generator) -> int:
    """The key of a reader's per-item random crops and mirrors, drawn from its seed."""
    return int(rng.integers(0, 2**63))


def check_phase(phase: str | int) -> str:
    """ "TRAIN" or "TEST", also from caffe_pb2.TRAIN (0) / caffe_pb2.TEST (1)."""
    if isinstance(phase, int) and not isinstance(phase, bool) and phase in (0, 1):
        return PHASES[phase]
    if phase not in PHASES:
        raise ValueError(f"phase must be 'TRAIN' or 'TEST', not {phase!r}")
    return phase


def check_tops(layer: caffe_pb2.LayerParameter, allowed: tuple[int, ...]) -> None:
    """Caffe's ExactNumTopBlobs / MinTopBlobs checks of a data layer."""
    if len(layer.top) not in allowed:
        want = " or ".join(str(n) for n in allowed)
        raise DataError(f"layer {layer.name!r} ({layer.type}) needs {want} tops")


def positive_batch_size(value: int, layer: caffe_pb2.LayerParameter) -> int:
    """``batch_size``, which Caffe requires to be positive."""
    if value <= 0:
        raise DataError(f"layer {layer.name!r} ({layer.type}): batch_size must be positive")
    return int(value)


def plain(state: object) -> object:
    """A reader state (:meth:`DataSource.get_state`) as JSON values: arrays as lists, image
    list entries as their line numbers."""
    if isinstance(state, dict):
        return {k: plain(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return [plain(v) for v in state]
    if isinstance(state, np.ndarray):
        return state.tolist()
    if isinstance(state, np.integer | np.floating):
        return state.item()
    if isinstance(state, ListEntry):
        return state.line
    return state


def _attr(obj: object, path: str) -> object:
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return obj
