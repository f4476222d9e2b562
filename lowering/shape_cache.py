"""A bounded cache by shape signature: Caffe reshapes a net on every forward, a compiled
program has fixed shapes, so each new input shape costs a program (built and compiled once,
then reused). At most ``limit`` are kept (``$CAFFE2JAX_MAX_SHAPES``, default 16), the least
recently used dropped; a script that brings a new shape on every call is told so, once."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from caffe2jax.frontend import environment

LIMIT_ENV = "CAFFE2JAX_MAX_SHAPES"
DEFAULT_LIMIT = 16


def default_limit() -> int:
    """``$CAFFE2JAX_MAX_SHAPES`` (at least 1), else 16."""
    try:
        return max(1, int(environment.value(LIMIT_ENV) or DEFAULT_LIMIT))
    except ValueError:
        return DEFAULT_LIMIT


class ShapeCache:
    """Values by shape signature for one net (``what`` names it in the warning)."""

    def __init__(self, what: str, limit: int | None = None):
        self.what = what
        self.limit = default_limit() if limit is None else max(1, limit)
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self.built = 0  # signatures built so far (each one compiled its programs)
        self._new_in_a_row = 0
        self.warned = False

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def put(self, key: Hashable, value: Any) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        self._evict()

    def find(self, match: Callable[[Hashable, Any], bool]) -> Any:
        """The first value ``match(key, value)`` accepts (now the most recently used), None."""
        for key, value in self._entries.items():
            if match(key, value):
                self._new_in_a_row = 0
                self._entries.move_to_end(key)
                return value
        return None

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The value for ``key``, built by ``build()`` on first use."""
        if key in self._entries:
            self._new_in_a_row = 0
            self._entries.move_to_end(key)
            return self._entries[key]
        value = build()
        self.built += 1
        self._new_in_a_row += 1
        self.put(key, value)
        return value

    def _evict(self) -> None:
        while len(self._entries) > self.limit:
            self._entries.popitem(last=False)
            if not self.warned:
                self.warned = True
                warnings.warn(self._message(), RuntimeWarning, stacklevel=4)

    def _message(self) -> str:
        streak = ""
        if self._new_in_a_row > 1:
            streak = f"; the last {self._new_in_a_row} calls each brought a new one"
        return (
            f"{self.what}: {self.built} different input shapes so far, more than the "
            f"{self.limit} kept{streak}. Each new shape builds and compiles the net's programs "
            f"again (the least recently used are dropped): resize or pad inputs to a few "
            f"sizes, or keep more with {LIMIT_ENV}=N."
        )
