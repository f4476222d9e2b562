"""One module per data layer type: the host-side class that reads its records (or, for
HDF5Output, writes its bottoms), registered under the layer's exact Caffe type string as
Caffe's layer_factory registers a creator (``@reader("Data")``).

Lowering's one table of data layers (``lowering/registry.py`` ``DATA_LAYERS``, filled by the
registrations' ``feed=``) says how a type's tops are fed (by the caller, from memory, by the
pipeline, or as a sink); this registry says which class does it, so neither side names the
other's classes. A new data layer is a module here with one registered class (an
:class:`~caffe2jax.runtime.data.base.ItemSource` whose ``_records`` walks its records and whose
``_item`` decodes one gets the pipeline's worker threads, slots and exact resume with it) and a
registration with ``feed=`` in lowering.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

_READERS: dict[str, type] = {}
_LOADED: list[bool] = []


def reader(type_name: str) -> Callable[[type], type]:
    """Class decorator: the reader of data layers of type ``type_name``."""

    def register(cls: type) -> type:
        if _READERS.setdefault(type_name, cls) is not cls:
            raise ValueError(f"two readers for data layer type {type_name!r}")
        return cls

    return register


def _load() -> None:
    """Import every reader module (each registers its classes), once."""
    if not _LOADED:
        for info in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{info.name}")
        _LOADED.append(True)


def reader_for(type_name: str) -> type | None:
    """The class registered for ``type_name``; None when caffe2jax has no reader for it."""
    _load()
    return _READERS.get(type_name)


def reader_types() -> tuple[str, ...]:
    """Every data layer type with a reader."""
    _load()
    return tuple(_READERS)
