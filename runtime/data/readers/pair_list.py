"""What the forks' segmentation data layers share: a list file of ``image label`` pairs walked
as Caffe's ImageDataLayer walks its list, and label maps read without blending classes.

SegNet/ENet's ``DenseImageData`` and DeepLab's ``ImageSegData`` read their list with
``infile >> image >> label`` (two whitespace-separated tokens a line, so paths cannot hold
spaces), optionally shuffle it once at the start and again at every wrap-around, skip
``Rand(rand_skip)`` lines once, and hand out ``batch_size`` pairs a batch. Both read label
maps in gray (OpenCV's ``IMREAD_GRAYSCALE``); SegNet/ENet resize them with
``INTER_NEAREST`` (:func:`~.image.resize_nearest`), DeepLab with the bilinear filter of its images.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import ItemSource, draw_key, make_rngs
from caffe2jax.runtime.data.files import resolve_input
from caffe2jax.runtime.data.transform.image import decode_image, resize, resize_nearest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pair:
    """One line of a pair list: the image path, the label token (a path, or an integer for
    DeepLab's ``label_type: IMAGE``; "" for ``NONE``) and its line number."""

    image: str
    label: str
    line: int


def parse_pair_list(path: Path, tokens: int = 2) -> list[Pair]:
    """Read a pair list: ``tokens`` whitespace-separated tokens per non-blank line (2: image
    and label; 1: image only). A line with another count is an error naming it (Caffe's
    ``>>`` would pair tokens across lines silently)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as err:
        raise DataError(f"{path}: cannot read list file ({err.strerror})") from err
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words:
            continue
        if len(words) != tokens and not (tokens == 1 and len(words) == 2):
            want = "'image label'" if tokens == 2 else "'image'"
            raise DataError(f"{path}:{number}: expected {want}, got {line.strip()!r}")
        pairs.append(Pair(words[0], words[1] if tokens == 2 else "", number))
    if not pairs:
        raise DataError(f"{path}: list file is empty")
    return pairs


def read_gray(path: Path, height: int = 0, width: int = 0, nearest: bool = True) -> np.ndarray:
    """A label map as Caffe's ``ReadImageToCVMat(path, height, width, false[, nearest])``:
    1×H×W uint8, resized when both sizes are non-zero."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise DataError(f"{path}: could not open or find file ({err.strerror})") from err
    label = decode_image(data, "gray", name=str(path))
    if height > 0 and width > 0:
        label = (resize_nearest if nearest else resize)(label, height, width)
    return label


class PairListSource(ItemSource):
    """An item source walking a pair list (see the module doc). Subclasses call
    :meth:`_open_list` and fill their rows themselves (``fill``); the random choices of an
    item are hashed from ``key`` and its position (:func:`~.transform.uniform_ints`)."""

    STATE = ("pos", "order", "position", "key")
    RNGS = ("rng",)

    def _open_list(
        self,
        source: str,
        root: str,
        base_dir: Path | None,
        seed: int | None,
        shuffle: bool,
        rand_skip: int,
        parse=parse_pair_list,
    ) -> None:
        """Read the list (``parse(path)``: its records), shuffle it, skip ``Rand(rand_skip)``."""
        where = f"layer {self.name!r}: source"
        self.list_path = resolve_input(source, base_dir, where)
        self.pairs = parse(self.list_path)
        self.root, self.base_dir, self.shuffle = root, base_dir, shuffle
        self.rng, key_rng = make_rngs(seed, 2)
        self.key = draw_key(key_rng)
        self.order = list(range(len(self.pairs)))
        if shuffle:
            self._shuffle()
        self.pos = 0
        if rand_skip:
            self.pos = int(self.rng.integers(0, rand_skip))
            if self.pos >= len(self.pairs):
                raise DataError(f"{self.list_path}: not enough images to skip {self.pos}")

    def _shuffle(self) -> None:
        self.order = [self.order[i] for i in self.rng.permutation(len(self.order))]

    def _restored(self) -> None:
        self.key = int(self.key)
        self.order = [int(i) for i in self.order]

    def path(self, pair: Pair, token: str) -> Path:
        """``root_folder + token`` found as Caffe opens it (see :func:`resolve_input`)."""
        where = f"{self.list_path}:{pair.line}: image"
        return resolve_input(self.root + token, self.base_dir, where)

    def first(self) -> Pair:
        """The pair DataLayerSetUp reads to learn the shapes."""
        return self.pairs[self.order[self.pos]]

    def _records(self) -> list[Pair]:
        records = []
        for _ in range(self.batch_size):
            records.append(self.pairs[self.order[self.pos]])
            self._advance()
        return records

    def _advance(self) -> None:
        self.pos += 1
        if self.pos >= len(self.order):
            log.debug("%s: restarting data prefetching from start", self.list_path)
            self.pos = 0
            if self.shuffle:
                self._shuffle()

    def _skip_records(self) -> None:
        for _ in range(self.batch_size):
            self._advance()

    def _item(self, record: object) -> tuple[np.ndarray, float]:
        raise NotImplementedError(f"{type(self).__name__} fills its rows itself")

    def check_item(self, pair: Pair, shape: tuple[int, ...], first: tuple[int, ...]) -> None:
        """One batch has one shape: an item whose (resized) image differs is an error."""
        if shape != first:
            raise DataError(
                f"{self.list_path}:{pair.line}: image {pair.image} has shape "
                f"{shape}, the first {first} (set new_height/new_width)"
            )

    def close(self) -> None:
        """Nothing stays open between batches."""
