"""Caffe's DataTransformer (src/caffe/data_transformer.cpp), applied to whole batches.

Per item, exactly as Caffe:

* ``do_mirror = mirror && Rand(2)``: mirroring is random per item in **both** phases (Caffe does
  not look at the phase here; it seeds the transformer's RNG whenever ``mirror`` is set);
* with ``crop_size``: a random offset ``Rand(H − crop + 1)`` per item in TRAIN, the centre
  ``(H − crop) / 2`` (integer division) in TEST;
* ``top[c, h, w] = (pixel[c, h_off + h, w_off + w'] − mean) × scale`` with ``w' = crop − 1 − w``
  when mirrored, in float32; the mean is ``mean_file``'s value at the *same source position*
  (so it is cropped and mirrored with the image), or ``mean_value[c]`` (one value is repeated
  for every channel); without a mean it is ``pixel × scale``.

``mean_file`` and ``mean_value`` together, ``force_color`` with ``force_gray``, a mean of the
wrong shape or a crop larger than the image are errors, as in Caffe. The RNG is a seeded numpy
Generator, so runs are reproducible (not bit-identical to Caffe's own RNG stream).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.datum import read_blobproto
from caffe2jax.runtime.data.files import resolve_input

PHASES = ("TRAIN", "TEST")


class DataTransformer:
    """Crop, mirror, mean subtraction and scaling of (N, C, H, W) batches."""

    def __init__(
        self,
        param: caffe_pb2.TransformationParameter,
        phase: str,
        rng: np.random.Generator,
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
        self.rng = rng
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

    def _indices(self, n: int, h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-item mirror flags and the source rows/columns each output pixel reads."""
        flips = self.rng.integers(0, 2, n).astype(bool) if self.mirror else np.zeros(n, bool)
        if not self.crop:
            rows = np.broadcast_to(np.arange(h), (n, h))
            cols = np.broadcast_to(np.arange(w), (n, w))
        else:
            if self.phase == "TRAIN":
                h_off = self.rng.integers(0, h - self.crop + 1, n)
                w_off = self.rng.integers(0, w - self.crop + 1, n)
            else:
                h_off = np.full(n, (h - self.crop) // 2)
                w_off = np.full(n, (w - self.crop) // 2)
            rows = h_off[:, None] + np.arange(self.crop)
            cols = w_off[:, None] + np.arange(self.crop)
        cols = np.where(flips[:, None], cols[:, ::-1], cols)
        return flips, rows, cols

    def skip(self, n: int, item_shape: tuple[int, ...]) -> None:
        """Draw the random numbers a batch of ``n`` items of ``item_shape`` would draw, without
        touching pixels: a batch skipped for another device leaves the RNG where
        transforming it would have (the draws depend on the shape alone, never on the data)."""
        _, h, w = item_shape
        self._indices(n, h, w)

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        """Transform a (N, C, H, W) uint8 or float32 batch into a float32 batch."""
        n, c, h, w = batch.shape
        self.output_shape((c, h, w))
        flips, rows, cols = self._indices(n, h, w)
        if not self.crop and not flips.any():
            pixels = batch.astype(np.float32)
        else:
            chan = np.arange(c)[None, :, None, None]
            r, q = rows[:, None, :, None], cols[:, None, None, :]
            pixels = batch[np.arange(n)[:, None, None, None], chan, r, q].astype(np.float32)
        if self.mean is not None:
            chan = np.arange(c)[None, :, None, None]
            mean = self.mean[chan, rows[:, None, :, None], cols[:, None, None, :]]
            return (pixels - mean) * self.scale
        if len(self.mean_values):
            means = np.broadcast_to(self.mean_values, (c,))[None, :, None, None]
            return (pixels - means) * self.scale
        return pixels * self.scale
