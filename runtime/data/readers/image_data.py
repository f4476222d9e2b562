"""Caffe's ``ImageData`` layer: image files named by a list of ``path label`` lines.

Paths are ``root_folder + path`` (string concatenation, as Caffe: give the folder a trailing
``/``), optionally shuffled once at the start and again at every wrap-around, ``rand_skip``
applied in both phases, images read in colour or gray (``is_color``) and resized with OpenCV's
bilinear filter to ``new_height`` × ``new_width``. :meth:`plan` walks the list; the files are
read, decoded, resized and transformed in ``fill``.
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
from caffe2jax.runtime.data.files import ListEntry, parse_list_file, resolve_input
from caffe2jax.runtime.data.memo import Memo
from caffe2jax.runtime.data.readers import reader
from caffe2jax.runtime.data.transform.guards import check_image_tops
from caffe2jax.runtime.data.transform.image import read_image
from caffe2jax.runtime.data.transform.transformer import DataTransformer

log = logging.getLogger(__name__)


@reader("ImageData")
class ImageDataSource(ItemSource):
    """Caffe's ``ImageData`` layer: image files named by a list file."""

    STATE = ("pos", "lines", "position", "key")
    RNGS = ("rng",)

    def __init__(
        self,
        layer: caffe_pb2.LayerParameter,
        phase: str,
        *,
        base_dir: Path | None = None,
        seed: int | None = None,
    ) -> None:
        check_tops(layer, (2,))
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
        self.key = draw_key(transform_rng)
        self.transformer = DataTransformer(
            layer.transform_param, check_phase(phase), self.key, base_dir=base_dir
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
        self.transformer.key = self.key = int(self.key)
        self.lines = [self._listed[int(line)] for line in self.lines]  # saved: line numbers

    def _where(self, entry: ListEntry) -> str:
        return f"{self.list_path}:{entry.line}: image {entry.path}"

    def _read(self, entry: ListEntry) -> np.ndarray:
        return self._memo.get(entry.path, lambda: self._read_file(entry))  # data/memo.py

    def _read_file(self, entry: ListEntry) -> np.ndarray:
        where = f"{self.list_path}:{entry.line}: image"
        path = resolve_input(self.root + entry.path, self.base_dir, where)
        height, width = self.size
        return read_image(path, height=height, width=width, is_color=self.is_color)

    def _item(self, entry: ListEntry) -> tuple[np.ndarray, int]:
        image = self._read(entry)
        if image.shape != self.item_shape:
            raise DataError(
                f"{self._where(entry)} has shape {image.shape}, the first {self.item_shape} "
                "(set new_height/new_width)"
            )
        return image, entry.label

    def _records(self) -> list[ListEntry]:
        records = []
        for _ in range(self.batch_size):
            records.append(self.lines[self.pos])
            self._advance()
        return records

    def _advance(self) -> None:
        """Next line; after the last, the first again, reshuffled with ``shuffle``."""
        self.pos += 1
        if self.pos >= len(self.lines):
            log.debug("%s: restarting data prefetching from start", self.list_path)
            self.pos = 0
            if self.shuffle:
                self._shuffle()

    def _skip_records(self) -> None:
        """Advance the list position (reshuffling at each wrap-around); no image is read."""
        for _ in range(self.batch_size):
            self._advance()

    def close(self) -> None:
        """Nothing stays open between batches."""
