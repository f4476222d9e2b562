"""Caffe's ``Phase`` as pycaffe exposes it: ``caffe.TRAIN``, ``caffe.TEST`` and the ``phase``
a Python layer reads (``self.phase``).

pycaffe's ``_caffe.cpp`` exports caffe::Phase as a Boost.Python enum (``bp::enum_<Phase>``,
``export_values``; the only enum pycaffe exposes). Its values are ints (``TRAIN == 0``,
``TEST == 1``, usable as an index, equal to ``caffe_pb2.TRAIN``/``TEST``, hashed as the int),
yet ``str()`` gives the name — py-faster-rcnn's layers key their config by
``cfg[str(self.phase)]`` — and ``repr()`` the qualified name ``caffe._caffe.Phase.TRAIN``. The
type carries Boost's ``names`` (name -> value) and ``values`` (int -> value) tables, each value
its ``name``, and ``Phase(0)`` is ``TRAIN``. Plain data: no JAX, importable from every stage.
"""

from __future__ import annotations

from typing import Any, ClassVar


class Phase(int):
    """One value of Caffe's Phase enum (an ``int`` whose ``str`` is its name)."""

    names: ClassVar[dict[str, Phase]] = {}
    values: ClassVar[dict[int, Phase]] = {}
    _NAMES: ClassVar[dict[int, str]] = {0: "TRAIN", 1: "TEST"}

    def __new__(cls, value: Any = 0) -> Phase:
        """``Phase(0)`` is ``TRAIN``, ``Phase('TEST')`` is ``TEST``; another int is an unnamed
        value, as Boost.Python makes one."""
        if isinstance(value, str):
            if value.upper() not in cls.names:
                raise ValueError(f"unknown phase {value!r}: TRAIN or TEST")
            return cls.names[value.upper()]
        found = cls.values.get(int(value))
        return found if found is not None else int.__new__(cls, int(value))

    @property
    def name(self) -> str:
        """The value's name (Boost's ``.name``); an unnamed value's is its number."""
        return self._NAMES.get(int(self), str(int(self)))

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        named = int(self) in self._NAMES
        return f"caffe._caffe.Phase.{self.name}" if named else f"caffe._caffe.Phase({int(self)})"

    def __format__(self, spec: str) -> str:
        """``f"{phase}"`` is the name (an int subclass formats as its ``str``); a spec such as
        ``d`` formats the number."""
        return str(self) if not spec else format(int(self), spec)

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return Phase, (int(self),)


Phase.values = {v: int.__new__(Phase, v) for v in Phase._NAMES}
Phase.names = {Phase._NAMES[v]: p for v, p in Phase.values.items()}
TRAIN = Phase.values[0]
TEST = Phase.values[1]


def as_phase(value: Any) -> Phase:
    """Caffe's Phase for ``value``: a Phase, 0/1, ``caffe_pb2.TRAIN``/``TEST``, or the IR's
    ``"TRAIN"``/``"TEST"``."""
    return Phase(value)
