"""Caffe's DataTransformer (src/caffe/data_transformer.cpp), one item at a time, into its row of
a batch.

Per item, exactly as Caffe:

* ``do_mirror = mirror && Rand(2)``: mirroring is random per item in **both** phases (Caffe does
  not look at the phase here; it seeds the transformer's RNG whenever ``mirror`` is set);
* with ``crop_size``: a random offset ``Rand(H − crop + 1)`` per item in TRAIN, the centre
  ``(H − crop) / 2`` (integer division) in TEST;
* ``top[c, h, w] = (pixel[c, h_off + h, w_off + w'] − mean) × scale`` with ``w' = crop − 1 − w``
  when mirrored, in float32; the mean is ``mean_file``'s value at the *same source position*
  (so it is cropped and mirrored with the image), or ``mean_value[c]`` (one value is repeated
  for every channel); without a mean it is ``pixel × scale``.

The pixels are read once, straight from the decoded image (any strides: OpenCV's H×W×C seen
as C×H×W) into the batch row: crop and mirror are views, the subtraction converts to float32
as it writes, and the scale multiplies in place. ``mean_file`` and ``mean_value`` together,
``force_color`` with ``force_gray``, a mean of the wrong shape or a crop larger than the image
are errors, as in Caffe.

Random numbers (beyond Caffe, whose draws follow one RNG stream): an item's mirror flag and
crop offsets are a hash of the reader's key and the item's *position* in the stream of items
the reader hands out (:func:`draws`), so they do not depend on which worker transforms it,
when, or how many batches were skipped, and a resumed reader draws the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.files import resolve_input
from caffe2jax.runtime.data.records.datum import read_blobproto

PHASES = ("TRAIN", "TEST")
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a bijective hash of 64-bit words."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniform_ints(key: int, positions: np.ndarray, stream: int, bound: int) -> np.ndarray:
    """``Rand(bound)`` for each position: integers in ``[0, bound)`` hashed from the key, the
    position and the stream (0: mirror, 1: row offset, 2: column offset)."""
    pos = np.asarray(positions, dtype=np.uint64)
    with np.errstate(over="ignore"):
        words = _mix(np.uint64(key) ^ _mix((pos * np.uint64(3) + np.uint64(stream + 1)) * _GOLDEN))
    return (words % np.uint64(bound)).astype(np.int64)


@dataclass(frozen=True)
class Draws:
    """The random choices of a run of items: mirror flags and crop offsets."""

    flip: np.ndarray
    h_off: np.ndarray
    w_off: np.ndarray

    def __getitem__(self, rows: slice) -> Draws:
        return Draws(self.flip[rows], self.h_off[rows], self.w_off[rows])


class DataTransformer:
    """Crop, mirror, mean subtraction and scaling of C×H×W items into float32 batch rows."""

    def __init__(
        self,
        param: caffe_pb2.TransformationParameter,
        phase: str,
        key: int = 0,
        *,
        base_dir: Path | None = None,
    ) -> None:
        if phase not in PHASES:
            raise ValueError(f"phase must be TRAIN or TEST, not {phase!r}")
        if param.force_color and param.force_gray:
            raise DataError("transform_param: cannot set both force_color and force_gray")
        if param.HasField("mean_file") and len(param.mean_value):
            raise DataError(
                "transform_param: cannot specify mean_file and mean_value at the same time"
            )
        self.phase = phase
        self.key = int(key)
        self.scale = np.float32(param.scale)
        self.crop = int(param.crop_size)
        self.mirror = bool(param.mirror)
        self.decode_mode = (
            "color" if param.force_color else "gray" if param.force_gray else "native"
        )
        self.mean: np.ndarray | None = None
        self.mean_file: Path | None = None
        if param.HasField("mean_file"):
            self.mean_file = resolve_input(param.mean_file, base_dir, "mean_file")
            mean = read_blobproto(self.mean_file)
            self.mean = mean[0] if mean.ndim == 4 and mean.shape[0] == 1 else mean
        self.mean_values = np.asarray(param.mean_value, dtype=np.float32)

    def output_shape(self, item_shape: tuple[int, int, int], where: str = "") -> tuple[int, ...]:
        """Caffe's ``InferBlobShape``: the C×H×W an item of ``item_shape`` becomes, after
        checking the mean and the crop against it."""
        c, h, w = item_shape
        prefix = f"{where}: " if where else ""
        if self.mean is not None and self.mean.shape != (c, h, w):
            raise DataError(
                f"{prefix}mean_file {self.mean_file} has shape {self.mean.shape}, the data "
                f"{(c, h, w)} (Caffe subtracts the mean before cropping)"
            )
        if len(self.mean_values) not in (0, 1, c):
            raise DataError(
                f"{prefix}specify either 1 mean_value or as many as channels: {c} "
                f"(got {len(self.mean_values)})"
            )
        if self.crop and (h < self.crop or w < self.crop):
            raise DataError(f"{prefix}crop_size {self.crop} is larger than the data {h}×{w}")
        return (c, self.crop or h, self.crop or w)

    def draws(self, positions: np.ndarray, item_shape: tuple[int, ...]) -> Draws:
        """The mirror flags and crop offsets of the items at ``positions`` (see the module
        doc): ``Rand(2)``, then ``Rand(H − crop + 1)`` and ``Rand(W − crop + 1)`` in TRAIN or
        the centre in TEST."""
        _, h, w = item_shape
        n = len(positions)
        flip = (uniform_ints(self.key, positions, 0, 2) == 1) if self.mirror else np.zeros(n, bool)
        if not self.crop:
            zeros = np.zeros(n, np.int64)
            return Draws(flip, zeros, zeros)
        if self.phase == "TRAIN":
            h_off = uniform_ints(self.key, positions, 1, h - self.crop + 1)
            w_off = uniform_ints(self.key, positions, 2, w - self.crop + 1)
        else:
            h_off = np.full(n, (h - self.crop) // 2)
            w_off = np.full(n, (w - self.crop) // 2)
        return Draws(flip, h_off, w_off)

    def __call__(self, items: Iterable[np.ndarray], draws: Draws, out: np.ndarray) -> np.ndarray:
        """Transform ``items`` (C×H×W, uint8 or float32, taken one at a time: a generator
        decodes each as it is needed) into the rows of ``out``, a float32 (N, C, h, w) array;
        returns ``out``."""
        count = 0
        for row, item in enumerate(items):
            self.transform_into(item, bool(draws.flip[row]), int(draws.h_off[row]),
                                int(draws.w_off[row]), out[row])  # fmt: skip
            count += 1
        if count != len(out):
            raise ValueError(f"{count} items for {len(out)} rows")
        return out

    def transform_into(self, item: np.ndarray, flip: bool, h_off: int, w_off: int,
                       out: np.ndarray) -> None:  # fmt: skip
        """One item into its float32 C×h×w row, in one pass over its pixels."""
        c, h, w = out.shape
        view = item[:, h_off : h_off + h, w_off : w_off + w]
        if flip:
            view = view[:, :, ::-1]
        if self.mean is not None:
            mean = self.mean[:, h_off : h_off + h, w_off : w_off + w]
            np.subtract(view, mean[:, :, ::-1] if flip else mean, out=out)
        elif len(self.mean_values):
            np.subtract(view, self._channel_means(c), out=out)
        else:
            out[...] = view
        if self.scale != 1:
            np.multiply(out, self.scale, out=out)

    def _channel_means(self, channels: int) -> np.ndarray:
        """``mean_value`` as a (C, 1, 1) array (one value repeated for every channel)."""
        means = getattr(self, "_means", None)
        if means is None or len(means) != channels:
            means = self._means = np.ascontiguousarray(
                np.broadcast_to(self.mean_values, (channels,))[:, None, None])  # fmt: skip
        return means

    def transform(self, batch: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """A whole (N, C, H, W) batch whose items sit at ``positions``, as a new float32
        array (checked against :meth:`output_shape`)."""
        shape = self.output_shape(batch.shape[1:])
        out = np.empty((len(batch), *shape), np.float32)
        return self(iter(batch), self.draws(positions, batch.shape[1:]), out)
