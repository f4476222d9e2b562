"""Host-side data sources, one per Caffe data layer type, built from the LayerParameter.

A source knows its tops' shapes before reading a batch (Caffe's ``DataLayerSetUp`` reads one
record for that), then yields float32 batches in Caffe's layout: data (N, C, H, W) and labels
(N,). Relative paths are tried against the working directory first, as Caffe does, then
against ``base_dir`` (the prototxt's folder, passed by the caller).

* ``Data``: LMDB or LevelDB (``backend``, LEVELDB by default as in Caffe) of Datum records,
  read in key order with wrap-around; raw, ``float_data`` or encoded records. ``rand_skip``
  skips ``Rand(rand_skip)`` records once at the start in TRAIN (the behaviour of Caffe before
  its 2017 data-layer rewrite; Caffe's last release ignores ``rand_skip`` for Data, and a TEST
  source always starts at the first record). MyCaffe's label balancing and image boosting are
  opt-in (:mod:`.sampling`).
* ``ImageData``: a list of ``path label`` lines (:func:`.files.parse_list_file`), paths are
  ``root_folder + path`` (string concatenation, as Caffe: give the folder a trailing ``/``),
  optionally shuffled once at the start and again at every wrap-around, ``rand_skip`` applied
  in both phases, images read in colour or gray (``is_color``) and resized with OpenCV's
  bilinear filter to ``new_height`` × ``new_width``.
* ``HDF5Data`` and the ``HDF5Output`` sink live in :mod:`.hdf5`.

Every item of a batch must have the first record's shape: the graph is compiled for it (Caffe
re-shapes per batch, but also requires one shape within a batch).
"""

from __future__ import annotations

import importlib
import logging
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.lowering.data import DATA_LAYERS, data_layers
from caffe2jax.runtime.data.datum import datum_to_array, parse_datum
from caffe2jax.runtime.data.db import Cursor, open_db
from caffe2jax.runtime.data.files import ListEntry, parse_list_file, resolve_input
from caffe2jax.runtime.data.guards import check_image_tops
from caffe2jax.runtime.data.image import read_image
from caffe2jax.runtime.data.memo import Memo
from caffe2jax.runtime.data.sampling import Sampler
from caffe2jax.runtime.data.transform import PHASES, DataTransformer
from caffe2jax.runtime.data.watch import same_database
from caffe2jax.runtime.parallel.memory import check_batches_fit

log = logging.getLogger(__name__)

# The pipeline's data layer types that have a reader (lowering.data.DATA_LAYERS).
SUPPORTED = tuple(t for t in data_layers("pipeline") if DATA_LAYERS[t].reader)


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


def make_rngs(seed: int | None, count: int) -> list[np.random.Generator]:
    """Independent generators derived from one seed (``None``: fresh entropy)."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(count)]


def check_phase(phase: str | int) -> str:
    """ "TRAIN" or "TEST", also from caffe_pb2.TRAIN (0) / caffe_pb2.TEST (1)."""
    if isinstance(phase, int) and not isinstance(phase, bool) and phase in (0, 1):
        return PHASES[phase]
    if phase not in PHASES:
        raise ValueError(f"phase must be 'TRAIN' or 'TEST', not {phase!r}")
    return phase


def _check_tops(layer: caffe_pb2.LayerParameter, allowed: tuple[int, ...]) -> None:
    if len(layer.top) not in allowed:
        want = " or ".join(str(n) for n in allowed)
        raise DataError(f"layer {layer.name!r} ({layer.type}) needs {want} tops")


def positive_batch_size(value: int, layer: caffe_pb2.LayerParameter) -> int:
    """``batch_size``, which Caffe requires to be positive."""
    if value <= 0:
        raise DataError(f"layer {layer.name!r} ({layer.type}): batch_size must be positive")
    return int(value)


def _warn_deprecated(layer: caffe_pb2.LayerParameter) -> None:
    """Caffe moves data_param's scale/mean_file/crop_size/mirror into transform_param only when
    upgrading V1 nets; in a V2 ``layer {}`` they are ignored, here as there."""
    param = layer.data_param
    old = [f for f in ("scale", "mean_file", "crop_size", "mirror") if param.HasField(f)]
    if old:
        log.warning(
            "layer %s: data_param.%s ignored (deprecated; use transform_param)",
            layer.name,
            "/".join(old),
        )


class DataLayerSource(DataSource):
    """Caffe's ``Data`` layer over an LMDB or LevelDB of Datum records."""

    STATE = ("records_read", "source_id")
    RNGS = ("transformer.rng", "sampler.rng")
    records_read = 0  # records the cursor has moved past (rand_skip included)
    source_id: dict | None = None  # the database's content identity (a position is in it)

    def __init__(
        self,
        layer: caffe_pb2.LayerParameter,
        phase: str,
        *,
        base_dir: Path | None = None,
        seed: int | None = None,
    ) -> None:
        _check_tops(layer, (1, 2))
        phase = check_phase(phase)
        param = layer.data_param
        self.name = layer.name
        _warn_deprecated(layer)
        self.batch_size = positive_batch_size(param.batch_size, layer)
        self.labels = len(layer.top) == 2
        path = resolve_input(param.source, base_dir, f"layer {layer.name!r}: data_param.source")
        order_rng, transform_rng = make_rngs(seed, 2)
        self.transformer = DataTransformer(
            layer.transform_param, phase, transform_rng, base_dir=base_dir
        )
        self.db = open_db(path, param.backend)
        try:
            self.source_id = self.db.content_id()
            self._setup(param, phase, order_rng)
        except BaseException:
            self.db.close()
            raise

    def _setup(self, param: caffe_pb2.DataParameter, phase: str, rng: np.random.Generator) -> None:
        """Infer the top shapes from the first record, then position the reader."""
        first = next(self.db.items(), None)
        if first is None:
            raise DataError(f"{self.db.path}: database is empty")
        self.item_shape = self._decode(*first)[0].shape
        out = self.transformer.output_shape(self.item_shape, self._where(first[0]))
        self._shapes = [(self.batch_size, *out)] + ([(self.batch_size,)] if self.labels else [])
        self.sampler: Sampler | None = None
        if param.enable_label_balancing or param.super_boost_probability > 0:
            self._index(param, rng)
            return
        self.cursor = Cursor(self.db)
        if param.rand_skip and phase == "TRAIN":
            skip = int(rng.integers(0, param.rand_skip))
            log.info("layer %s: skipping first %d data points", self.name, skip)
            self.cursor.skip(skip)
            self.records_read = skip

    def _where(self, key: bytes) -> str:
        return f"{self.db.path}: record {key.decode(errors='replace')!r}"

    def _decode(self, key: bytes, value: bytes) -> tuple[np.ndarray, int]:
        datum = parse_datum(value, where=self._where(key))
        mode = self.transformer.decode_mode
        return datum_to_array(datum, mode=mode, where=self._where(key)), datum.label

    def _index(self, param: caffe_pb2.DataParameter, rng: np.random.Generator) -> None:
        """Read every record's label and boost for MyCaffe's random selection."""
        keys, labels, boosts = [], [], []
        for key, value in self.db.items():
            datum = parse_datum(value, where=self._where(key))
            keys.append(key)
            labels.append(datum.label)
            boosts.append(datum.boost)
        self.keys = keys
        self.sampler = Sampler(
            np.array(labels),
            np.array(boosts),
            balance_labels=param.enable_label_balancing,
            super_boost_probability=param.super_boost_probability,
            rng=rng,
        )

    def _records(self) -> list[tuple[bytes, bytes]]:
        if self.sampler is not None:
            picks = [self.keys[i] for i in self.sampler.draw(self.batch_size)]
            return [(key, self.db.get(key)) for key in picks]
        records = []
        for _ in range(self.batch_size):
            records.append((self.cursor.key, self.cursor.value))
            self.cursor.next()
        self.records_read += self.batch_size
        return records

    def skip(self, batches: int = 1) -> None:
        """Advance the cursor (or draw the sampler's picks) and the transformer's random
        numbers; no Datum is parsed."""
        for _ in range(batches):
            if self.sampler is not None:
                self.sampler.draw(self.batch_size)
            else:
                self.cursor.skip(self.batch_size)
                self.records_read += self.batch_size
            self.transformer.skip(self.batch_size, self.item_shape)

    def check_unchanged(self) -> None:
        self.db.check_unchanged()

    def _restored(self) -> None:
        self.source_id, same = same_database(self.source_id, self.db, self.name)
        self.records_read = self.records_read if same else 0
        if self.sampler is None:
            count = sum(1 for _ in self.db.items())
            self.cursor = Cursor(self.db)
            self.cursor.skip(self.records_read % count)

    def top_shapes(self) -> list[tuple[int, ...]]:
        return list(self._shapes)

    def next_batch(self) -> list[np.ndarray]:
        items, labels = [], []
        for key, value in self._records():
            array, label = self._decode(key, value)
            if array.shape != self.item_shape:
                raise DataError(
                    f"{self._where(key)}: shape {array.shape} differs from the first "
                    f"record's {self.item_shape} (a batch has one shape)"
                )
            items.append(array)
            labels.append(label)
        data = self.transformer(np.stack(items))
        return [data, np.asarray(labels, dtype=np.float32)] if self.labels else [data]

    def close(self) -> None:
        self.db.close()


class ImageDataSource(DataSource):
    """Caffe's ``ImageData`` layer: image files named by a list file."""

    STATE = ("pos", "lines")
    RNGS = ("rng", "transformer.rng")

    def __init__(
        self,
        layer: caffe_pb2.LayerParameter,
        phase: str,
        *,
        base_dir: Path | None = None,
        seed: int | None = None,
    ) -> None:
        _check_tops(layer, (2,))
        param = layer.image_data_param
        self.name = layer.name
        self.batch_size = positive_batch_size(param.batch_size, layer)
        if (param.new_height > 0) != (param.new_width > 0):
            raise DataError(
                f"layer {layer.name!r}: new_height and new_width must be set at the same time"
            )
        self.size = (int(param.new_height), int(param.new_width))
        if all(self.size):
            check_image_tops(layer.name, self.batch_size, 3 if param.is_color else 1, *self.size)
        self.is_color, self._memo = bool(param.is_color), Memo()
        self.root, self.base_dir, self.shuffle = param.root_folder, base_dir, param.shuffle
        where = f"layer {layer.name!r}: image_data_param.source"
        self.list_path = resolve_input(param.source, base_dir, where)
        self.lines = parse_list_file(self.list_path)
        self._listed = {entry.line: entry for entry in self.lines}
        self.rng, transform_rng = make_rngs(seed, 2)
        self.transformer = DataTransformer(
            layer.transform_param, check_phase(phase), transform_rng, base_dir=base_dir
        )
        if self.shuffle:
            self._shuffle()
        self.pos = 0
        if param.rand_skip:
            self.pos = int(self.rng.integers(0, param.rand_skip))
            if self.pos >= len(self.lines):
                raise DataError(f"{self.list_path}: not enough images to skip {self.pos}")
        self.item_shape = self._read(self.lines[self.pos]).shape
        out = self.transformer.output_shape(self.item_shape, str(self.list_path))
        self._shapes = [(self.batch_size, *out), (self.batch_size,)]

    def _shuffle(self) -> None:
        self.lines = [self.lines[i] for i in self.rng.permutation(len(self.lines))]

    def _restored(self) -> None:
        self.lines = [self._listed[int(line)] for line in self.lines]  # saved: line numbers

    def _read(self, entry: ListEntry) -> np.ndarray:
        return self._memo.get(entry.path, lambda: self._read_file(entry))  # data/memo.py

    def _read_file(self, entry: ListEntry) -> np.ndarray:
        where = f"{self.list_path}:{entry.line}: image"
        path = resolve_input(self.root + entry.path, self.base_dir, where)
        height, width = self.size
        return read_image(path, height=height, width=width, is_color=self.is_color)

    def top_shapes(self) -> list[tuple[int, ...]]:
        return list(self._shapes)

    def next_batch(self) -> list[np.ndarray]:
        items, labels = [], []
        for _ in range(self.batch_size):
            entry = self.lines[self.pos]
            image = self._read(entry)
            if image.shape != self.item_shape:
                raise DataError(
                    f"{self.list_path}:{entry.line}: image {entry.path} has shape {image.shape}, "
                    f"the first {self.item_shape} (set new_height/new_width)"
                )
            items.append(image)
            labels.append(entry.label)
            self._advance()
        return [self.transformer(np.stack(items)), np.asarray(labels, dtype=np.float32)]

    def _advance(self) -> None:
        """Next line; after the last, the first again, reshuffled with ``shuffle``."""
        self.pos += 1
        if self.pos >= len(self.lines):
            log.debug("%s: restarting data prefetching from start", self.list_path)
            self.pos = 0
            if self.shuffle:
                self._shuffle()

    def skip(self, batches: int = 1) -> None:
        """Advance the list position (reshuffling at each wrap-around) and the transformer's
        random numbers; no image is read."""
        for _ in range(batches):
            for _ in range(self.batch_size):
                self._advance()
            self.transformer.skip(self.batch_size, self.item_shape)

    def close(self) -> None:
        """Nothing stays open between batches."""


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


def reader_class(layer: caffe_pb2.LayerParameter, feed: str) -> type:
    """The runtime class lowering's data-layer table (``DATA_LAYERS``) names for ``layer``,
    which must be fed as ``feed`` (``"pipeline"``, ``"memory"`` or ``"sink"``)."""
    kind = DATA_LAYERS.get(layer.type)
    readable = ", ".join(t for t in data_layers(feed) if DATA_LAYERS[t].reader)
    if kind is None or kind.feed != feed:
        what = "a data layer" if kind is None else f"a {feed} data layer"
        raise DataError(f"layer {layer.name!r}: {layer.type!r} is not {what} ({readable})")
    if kind.reader is None:
        raise DataError(
            f"layer {layer.name!r}: {layer.type} is not supported (supported data layers: "
            f"{readable}; HDF5Output as a sink)"
        )
    module, name = kind.reader.split(":")
    return getattr(importlib.import_module(module), name)


def make_source(
    layer: caffe_pb2.LayerParameter,
    phase: str,
    *,
    base_dir: Path | None = None,
    seed: int | None = None,
) -> DataSource:
    """The host-side source of a data layer the pipeline reads (Data, ImageData, HDF5Data…)."""
    if layer.type == "HDF5Output":
        raise DataError(f"layer {layer.name!r}: HDF5Output is a sink (use make_sink)")
    source = reader_class(layer, "pipeline")(layer, phase, base_dir=base_dir, seed=seed)
    try:  # a batch it would read must be a shape Caffe allows and fit in memory
        check_batches_fit(layer.name, tuple(layer.top), source.top_shapes(), 2)
    except DataError:
        source.close()
        raise
    return source
