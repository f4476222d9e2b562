"""Which batches of a data layer this process reads, and for which devices (Caffe's
``DataLayer::Skip``).

Caffe's multi-GPU data layers share one reader: each solver keeps the records of its own
turn and moves its cursor past the others' without parsing them (``DataLayer::Skip`` /
``Next`` since Caffe 1.0). caffe2jax hands out whole batches: in a round of as many batches
as devices, batch ``k`` belongs to the device at position ``k`` of the mesh. A
:class:`ReadPlan` spells that out for one process over a *period* of batches (a training
round, or a test pass of ``test_iter`` batches read in rounds): for each batch, the mesh
positions (slots) of this process's devices it fills; a batch no local device needs is
skipped (:meth:`DataSource.skip`), leaving the reader exactly where reading it would have.

Every process follows the same period over the same reader, so the batches each device gets
are those it gets when one process reads everything, and a reader's state at the end of a
period is the same on every process (the state snapshots record).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from caffe2jax.frontend.errors import DataError


@dataclass(frozen=True)
class ReadPlan:
    """For each batch of a period, the slots (mesh positions) of the local devices it fills;
    ``()``: another process's batch, skipped. ``devices`` are the mesh's, by slot."""

    targets: tuple[tuple[int, ...], ...]
    devices: tuple[Any, ...]

    def __post_init__(self) -> None:
        if not any(self.targets):
            raise ValueError("a read plan must give this process at least one batch")

    @property
    def period(self) -> int:
        return len(self.targets)


def round_targets(count: int, size: int, local: Sequence[int]) -> list[tuple[int, ...]]:
    """One round of ``count`` real batches over ``size`` devices: batch ``k`` fills slot
    ``k`` when it is local; slots ``count..size-1`` (a short last round) repeat the last
    batch, so that batch also fills the local ones among them."""
    if not 1 <= count <= size:
        raise ValueError(f"a round has 1..{size} batches, not {count}")
    mine = set(local)
    out = [(k,) if k in mine else () for k in range(count)]
    out[-1] += tuple(s for s in sorted(mine) if s >= count)
    return out


def period_plan(batches: int, size: int, local: Sequence[int], devices: Sequence[Any]) -> ReadPlan:
    """The plan of ``batches`` batches read in rounds of ``size`` (the last one short when
    ``size`` does not divide ``batches``)."""
    targets: list[tuple[int, ...]] = []
    for done in range(0, batches, size):
        targets += round_targets(min(size, batches - done), size, local)
    return ReadPlan(tuple(targets), tuple(devices))


def follow(source: Any, plan: ReadPlan, start: int, stop: int) -> Iterator[tuple[int, Any]]:
    """Positions ``start..stop-1`` of ``plan`` read from ``source`` in the calling thread:
    ``(slot, batch)`` for each local slot, skipping the batches no local device needs."""
    for position in range(start, stop):
        slots = plan.targets[position]
        if not slots:
            source.skip(1)
            continue
        batch = source.next_batch()
        for slot in slots:
            yield slot, batch


class Backlog:
    """A source whose first batches are the ones a prefetch thread had already read ahead
    (``(batch, state)`` pairs, in order, or the error reading stopped at), so installing a
    plan loses and repeats nothing."""

    def __init__(self, source: Any, items: Iterable[tuple[Any, dict] | BaseException]) -> None:
        self.source, self._items, self._state = source, deque(items), None

    def _pop(self) -> tuple[Any, dict]:
        item = self._items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    def next_batch(self) -> Any:
        if not self._items:
            self._state = None
            return self.source.next_batch()
        batch, self._state = self._pop()
        return batch

    def skip(self, batches: int = 1) -> None:
        for _ in range(batches):
            if not self._items:
                self._state = None
                self.source.skip(1)
            else:
                self._state = self._pop()[1]

    def get_state(self) -> dict:
        return self.source.get_state() if self._state is None else self._state


def check_turn(name: str, got: tuple[int, int], want: tuple[int, int]) -> None:
    """A batch must reach the slot its position in the period gives it: anything else would
    move records between devices, so it stops the run."""
    if got != want:
        raise DataError(
            f"layer {name!r}: the data-parallel reader handed out batch {got[0]} for device "
            f"slot {got[1]} where batch {want[0]} for slot {want[1]} was due (a batch was "
            "taken outside the solver's read round, e.g. by Net.forward on a multi-device net)"
        )
