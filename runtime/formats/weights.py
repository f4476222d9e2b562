"""Weights files: ``load_weights`` / ``save_weights`` for binary caffemodels and Caffe's HDF5.

Loading is Caffe's Net::CopyTrainedLayersFrom (BVLC src/caffe/net.cpp): layers are matched by
name; a net layer the file lacks keeps its value (from the ``params``/``state`` given, else
``model.init(0)``); a file layer the net lacks is ignored (logged at debug level); the blob count
must be equal and every blob must pass Blob::ShapeEquals (legacy 4-D dims padded with leading
1s, see :mod:`caffe2jax.runtime.formats.blobproto`), else
:class:`~caffe2jax.frontend.errors.WeightsError`.
A blob of a layer that shares a param (``param { name }``) lands in the owner's slot, since in Caffe
the two are one storage. The binary format copies into the first net layer of a name, the HDF5
one into the last (Caffe's linear search vs ``layer_names_index_``). The format is recognised by
its bytes (HDF5's signature), not by the file name.

Forks: a binary file is read with the numbers of the fork that wrote it, its *dialect*
(:mod:`caffe2jax.frontend.forks.dialect`): by default the one the net's prototxt points to
(``model.net.dialect``), or ``dialect=``. Only names, types and blobs are read (layer
parameters come from the prototxt); the dialect decides the BlobProto layout (C3D v1.0's 5-D
blobs) and the meaning of V1 type numbers. A blob laid out in another dialect, or a V1 type
number that names the net's layer type only in another fork's numbering, is refused with the
dialect to pass.

Saving writes what Net::ToProto / Net::ToHDF5 write for the same prototxt and weights (see
:mod:`.weights_binary` and :mod:`.weights_hdf5`), streamed to a temporary file that is renamed
over ``path``; the bytes depend only on the net and the values.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from caffe2jax.frontend.errors import CaffeError, WeightsError
from caffe2jax.frontend.forks.dialect import Dialect, dialect_names, get
from caffe2jax.lowering.registry import NetState, carry_of
from caffe2jax.runtime.formats import caffemodel_h5 as weights_hdf5
from caffe2jax.runtime.formats.atomic import atomic_stream
from caffe2jax.runtime.formats.blobproto import (
    LayoutError,
    RawBlob,
    Scanner,
    WireError,
    read_blob,
)
from caffe2jax.runtime.formats.caffemodel import (
    BlobBody,
    SourceLayer,
    caffe_layer_params,
    read_layers,
    v1_type_string,
    write_net,
)

if TYPE_CHECKING:
    from caffe2jax.lowering.graph import Params
    from caffe2jax.lowering.model import Model

log = logging.getLogger(__name__)

BINARY, HDF5 = "binary", "hdf5"
_HDF5_SUFFIXES = (".h5", ".hdf5")


def weights_format(path: str | os.PathLike) -> str:
    """``"hdf5"`` or ``"binary"``, from the file's bytes; a WeightsError if it cannot be read."""
    path = Path(path)
    if not path.exists():
        raise WeightsError(f"{path}: no such weights file")
    if not path.is_file():
        raise WeightsError(f"{path}: not a file")
    try:
        return HDF5 if weights_hdf5.is_hdf5(path) else BINARY
    except OSError as err:
        raise WeightsError(f"{path}: cannot read ({err.strerror})") from None


class Target:
    """The params/state trees being filled, with Caffe's lookup and shape rules."""

    def __init__(self, model: Model, params: Params | None, state: Params | None, where: str):
        self.graph = model.graph
        self.model = model
        self.where = where
        self.trees = {False: _copy_tree(params), True: _copy_tree(state)}
        self.carry = carry_of(state)  # values a layer carries: kept as they are
        self.layers = {layer.name: layer for layer in self.graph.net.layers}
        self.by_name: dict[str, list[str]] = {}
        for key, layer in self.layers.items():
            self.by_name.setdefault(layer.param.name, []).append(key)

    def find(self, name: str, *, last: bool = False) -> str | None:
        """The key of the first (or last) net layer whose Caffe name is ``name``."""
        keys = self.by_name.get(name)
        return (keys[-1] if last else keys[0]) if keys else None

    def ignored(self, name: str) -> None:
        log.debug("%s: ignoring source layer %s (not in the net)", self.where, name)

    def blob_count(self, key: str) -> int:
        return len(self.graph.decls.get(key, []))

    def is_shared(self, key: str, j: int) -> bool:
        return (key, j) in self.graph.shared

    def _describe(self, key: str) -> str:
        layer = self.layers[key]
        return f"layer '{layer.param.name}' (type {layer.type})"

    def count_mismatch(self, key: str, found: int, source_type: str) -> None:
        kind = f" (its layer there has type {source_type})" if source_type else ""
        raise WeightsError(
            f"{self.where}: {self._describe(key)} has {self.blob_count(key)} blob(s), "
            f"the file gives it {found}{kind}"
        )

    def put(self, key: str, j: int, raw: RawBlob, *, exact: bool = False) -> None:
        """Blob::FromProto of blob ``j`` (after Caffe's ShapeEquals / HDF5 dims check)."""
        decls = self.graph.decls[key]
        shape = decls[j].shape
        fits = raw.dims == tuple(shape) if exact else raw.shape_equals(shape)
        if not fits:
            raise WeightsError(
                f"{self.where}: {self._describe(key)} blob {j}: shape mismatch, the file has "
                f"{_dims_text(raw)}, the net expects {list(shape)}"
            )
        if raw.values.size != raw.count:
            raise WeightsError(
                f"{self.where}: {self._describe(key)} blob {j}: {raw.values.size} value(s) "
                f"stored for shape {list(raw.dims)} ({raw.count} values)"
            )
        owner, oj = self.graph.shared.get((key, j), (key, j))
        decl = self.graph.decls[owner][oj]
        tree = self.trees[decl.state]
        slots = tree.setdefault(owner, [])
        slots += [None] * (len(self.graph.decls[owner]) - len(slots))
        values = raw.values.reshape(decl.shape)
        if values.dtype != self.graph.dtype:
            values = values.astype(self.graph.dtype)
        slots[oj] = jax.device_put(values)  # adopts the freshly read buffer where it can

    def finish(self) -> tuple[Params, Params]:
        """Both trees in net order; slots still empty get ``model.init(0)``'s values."""
        fresh: tuple[Params, Params] | None = None
        out: tuple[Params, Params] = ({}, {})
        for key, decls in self.graph.decls.items():
            for is_state, result in ((False, out[0]), (True, out[1])):
                slots = list(self.trees[is_state].get(key, [None] * len(decls)))
                slots += [None] * (len(decls) - len(slots))
                for j, decl in enumerate(decls):
                    if decl.state != is_state or (key, j) in self.graph.shared:
                        slots[j] = None
                    elif slots[j] is None:
                        fresh = fresh or self.model.init(0)
                        slots[j] = fresh[int(is_state)][key][j]
                if any(v is not None for v in slots):
                    result[key] = slots
        carry = {}
        for name in self.graph.carries:  # carried values: not in weight files
            carried = self.carry.get(name)
            if carried is None:
                fresh = fresh or self.model.init(0)
                carried = carry_of(fresh[1])[name]
            carry[name] = list(carried)
        return out[0], NetState(out[1], carry)


def _copy_tree(tree: Params | None) -> Params:
    return {key: list(values) for key, values in (tree or {}).items()}


def _dims_text(raw: RawBlob) -> str:
    if raw.legacy:
        return f"legacy num/channels/height/width {list(raw.dims)}"
    return str(list(raw.dims))


def load_weights(
    path: str | os.PathLike,
    model: Model,
    params: Params | None = None,
    state: Params | None = None,
    *,
    dialect: str | Dialect | None = None,
) -> tuple[Params, Params]:
    """Copy a .caffemodel (binary or HDF5) into ``(params, state)`` for ``model``.

    ``params``/``state`` are the starting values (default ``model.init(0)``) and are not
    modified. ``dialect`` is the fork numbering the binary file was written with (default:
    the net's, ``model.net.dialect``). Raises WeightsError naming the layer, blob index and
    shapes on any mismatch.
    """
    path = Path(path)
    target = Target(model, params, state, str(path))
    if weights_format(path) == HDF5:
        weights_hdf5.copy_from_hdf5(path, target)
    else:
        _copy_from_binary(path, target, weights_dialect(model, dialect))
    return target.finish()


def weights_dialect(model: Model, dialect: str | Dialect | None) -> Dialect:
    """``dialect`` (a user's value), else the one the model's prototxt points to."""
    try:
        return get(dialect if dialect is not None else getattr(model.net, "dialect", None))
    except CaffeError as err:
        raise WeightsError(str(err)) from None


@contextlib.contextmanager
def open_caffemodel(
    path: Path, dialect: Dialect | None = None
) -> Iterator[tuple[Scanner, str, list]]:
    """``(scanner, net name, layers)`` of a binary NetParameter, blobs left unread (V1 type
    numbers named in ``dialect``'s numbering); a clear WeightsError when the file is not one."""
    with open(path, "rb") as handle:
        scan = Scanner(handle, path.stat().st_size)
        try:
            name, layers = read_layers(scan, dialect)
        except WireError as err:
            raise WeightsError(f"{path}: not a binary NetParameter (caffemodel): {err}") from None
        if not layers:
            raise WeightsError(f"{path}: no layers in it: not a caffemodel")
        yield scan, name, layers


def _copy_from_binary(path: Path, target: Target, dialect: Dialect) -> None:
    """Net::CopyTrainedLayersFrom(NetParameter) over the layers of the file."""
    with open_caffemodel(path, dialect) as (scan, _, layers):
        for source in layers:
            key = target.find(source.name)
            if key is None:
                target.ignored(source.name)
                continue
            if source.v1_type is not None:
                _check_v1_type(path, source, target.layers[key].type, dialect)
            if len(source.blobs) != target.blob_count(key):
                target.count_mismatch(key, len(source.blobs), source.type)
            for j, (start, end) in enumerate(source.blobs):
                target.put(key, j, _read(scan, path, source.name, j, (start, end), dialect))


def _read(scan: Scanner, path: Path, layer: str, j: int, where, dialect: Dialect) -> RawBlob:
    try:
        return read_blob(scan, *where, layout=dialect.blob_layout)
    except LayoutError as err:
        raise WeightsError(
            f"{path}: layer '{layer}' blob {j}: {err}; the net's dialect is {dialect.key} "
            f"({dialect.name})"
        ) from None
    except WireError as err:
        raise WeightsError(f"{path}: layer '{layer}' blob {j} is corrupt: {err}") from None


def _check_v1_type(path: Path, source: SourceLayer, net_type: str, dialect: Dialect) -> None:
    """A V1 type number means different layers in BVLC, C3D v1.0 and DeepLab v1: refuse a
    file whose number names the net's layer type only in another fork's numbering (Caffe
    itself never compares types; a mismatch no dialect explains is left alone, as there)."""
    if source.type == net_type:
        return
    for key in dialect_names():
        other = get(key)
        if v1_type_string(source.v1_type, other.v1_types()) == net_type:
            raise WeightsError(
                f"{path}: layer '{source.name}': the file's V1 type number {source.v1_type} "
                f"is {source.type} in {dialect.name}'s numbering but {net_type} in "
                f"{other.name}'s, the net's type for it; pass dialect='{other.key}'"
            )


# ---------------------------------------------------------------------------------------------
# Saving


def format_for(path: Path, fmt: str | None) -> str:
    """The format to write: ``fmt`` if given, else HDF5 for a ``.h5``/``.hdf5`` name."""
    if fmt is None:
        return HDF5 if path.suffix.lower() in _HDF5_SUFFIXES else BINARY
    if fmt not in (BINARY, HDF5):
        raise WeightsError(f"unknown weights format {fmt!r}; use 'binary' or 'hdf5'")
    return fmt


def _blob_sources(model: Model, key: str, params: Params, state: Params):
    """``(index, shape, get, shared)`` for each blob of layer ``key``, checked against the net."""
    graph = model.graph
    decls = graph.decls.get(key, [])
    out = []
    for j, decl in enumerate(decls):
        owner, oj = graph.shared.get((key, j), (key, j))
        odecl = graph.decls[owner][oj]
        tree, tree_name = (state, "state") if odecl.state else (params, "params")
        slots = tree.get(owner) or []
        value = slots[oj] if oj < len(slots) else None
        if value is None:
            raise WeightsError(f"{tree_name}['{owner}'][{oj}] is missing (layer '{key}' blob {j})")
        if tuple(np.shape(value)) != tuple(odecl.shape):
            raise WeightsError(
                f"{tree_name}['{owner}'][{oj}] has shape {list(np.shape(value))}, "
                f"the net's blob is {list(odecl.shape)}"
            )
        out.append((j, decl.shape, _getter(value, decl.shape), (key, j) in graph.shared))
    return out


def _getter(value: Any, shape: tuple[int, ...]) -> Callable[[], np.ndarray]:
    return lambda: np.asarray(value).reshape(shape)


def save_weights(
    path: str | os.PathLike,
    model: Model,
    params: Params,
    state: Params,
    *,
    format: str | None = None,  # noqa: A002 - the natural name for the option
) -> Path:
    """Write ``params`` and ``state`` as Caffe would save this net: binary NetParameter, or
    Caffe's HDF5 with ``format="hdf5"`` or a ``.h5``/``.hdf5`` file name. Atomic."""
    path = Path(path)
    fmt = format_for(path, format)
    layers = caffe_layer_params(model.net, {k: len(d) for k, d in model.graph.decls.items()})
    blobs = {key: _blob_sources(model, key, params, state) for _, key in layers if key is not None}
    if fmt == HDF5:
        weights_hdf5.write_hdf5(
            path,
            (
                (param.name, [(j, g) for j, _, g, shared in blobs.get(key, []) if not shared])
                for param, key in layers
            ),
        )
        return path
    with atomic_stream(path) as handle:
        write_net(
            handle,
            model.net.name,
            (
                (param, [BlobBody.floats(s, g) for _, s, g, _ in blobs.get(key, [])])
                for param, key in layers
            ),
        )
    return path
