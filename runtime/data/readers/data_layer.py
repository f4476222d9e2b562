"""Caffe's ``Data`` layer: an LMDB or LevelDB (``backend``, LEVELDB by default as in Caffe) of
Datum records, read in key order with wrap-around; raw, ``float_data`` or encoded records.

``rand_skip`` skips ``Rand(rand_skip)`` records once at the start in TRAIN (the behaviour of
Caffe before its 2017 data-layer rewrite; Caffe's last release ignores ``rand_skip`` for Data,
and a TEST source always starts at the first record). MyCaffe's label balancing and image
boosting are opt-in (:mod:`.sampling`). Records are read in order by :meth:`plan` (the cursor
hands each value over as bytes); parsing, decoding and transforming happen in ``fill``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import (
    ItemSource,
    check_phase,
    check_tops,
    draw_key,
    make_rngs,
    positive_batch_size,
)
from caffe2jax.runtime.data.files import resolve_input
from caffe2jax.runtime.data.memo import Memo
from caffe2jax.runtime.data.readers import reader
from caffe2jax.runtime.data.records.datum import datum_to_array, parse_datum
from caffe2jax.runtime.data.records.db import Cursor, open_db
from caffe2jax.runtime.data.records.selection import Sampler
from caffe2jax.runtime.data.records.watch import same_database
from caffe2jax.runtime.data.transform.transformer import DataTransformer

log = logging.getLogger(__name__)


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


@reader("Data")
class DataLayerSource(ItemSource):
    """Caffe's ``Data`` layer over an LMDB or LevelDB of Datum records."""

    STATE = ("records_read", "position", "key", "source_id")
    RNGS = ("sampler.rng",)
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
        check_tops(layer, (1, 2))
        phase = check_phase(phase)
        param = layer.data_param
        self.name = layer.name
        _warn_deprecated(layer)
        self.batch_size = positive_batch_size(param.batch_size, layer)
        self.labels = len(layer.top) == 2
        path = resolve_input(param.source, base_dir, f"layer {layer.name!r}: data_param.source")
        order_rng, transform_rng = make_rngs(seed, 2)
        self.key = draw_key(transform_rng)
        self.transformer = DataTransformer(
            layer.transform_param, phase, self.key, base_dir=base_dir
        )
        self.db = open_db(path, param.backend)
        self._memo = Memo()  # a batch larger than the database decodes each record once
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
        out = self.transformer.output_shape(self.item_shape, self._where(first))
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

    def _where(self, record: tuple[bytes, bytes]) -> str:
        return f"{self.db.path}: record {record[0].decode(errors='replace')!r}"

    def _decode(self, key: bytes, value: bytes) -> tuple[np.ndarray, int]:
        where = self._where((key, value))
        datum = parse_datum(value, where=where)
        mode = self.transformer.decode_mode
        return datum_to_array(datum, mode=mode, where=where), datum.label

    def _item(self, record: tuple[bytes, bytes]) -> tuple[np.ndarray, int]:
        return self._memo.get(record[0], lambda: self._decode(*record))  # data/memo.py

    def _index(self, param: caffe_pb2.DataParameter, rng: np.random.Generator) -> None:
        """Read every record's label and boost for MyCaffe's random selection."""
        keys, labels, boosts = [], [], []
        for key, value in self.db.items():
            datum = parse_datum(value, where=self._where((key, value)))
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

    def _skip_records(self) -> None:
        """Advance the cursor (or draw the sampler's picks); no Datum is parsed."""
        if self.sampler is not None:
            self.sampler.draw(self.batch_size)
        else:
            self.cursor.skip(self.batch_size)
            self.records_read += self.batch_size

    def check_unchanged(self) -> None:
        """A DataError when the database changed since it was opened (:mod:`.watch`)."""
        self.db.check_unchanged()

    def _restored(self) -> None:
        self.transformer.key = self.key = int(self.key)
        self.source_id, same = same_database(self.source_id, self.db, self.name)
        if not same:
            self.records_read = 0
        if self.sampler is None:
            count = sum(1 for _ in self.db.keys())
            self.cursor = Cursor(self.db)
            self.cursor.skip(self.records_read % count)

    def close(self) -> None:
        self.db.close()
