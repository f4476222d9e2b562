"""Caffe's ``WindowData`` layer (layers/window_data_layer.cpp): R-CNN's windows of images,
warped to ``crop_size`` squares.

The window file repeats ``# image_index``, the image path (``root_folder`` + path), its
channels, height and width, the number of windows, then one ``class overlap x1 y1 x2 y2``
line per window. A window overlapping its object by at least ``fg_threshold`` is foreground
(its class must be positive); one under ``bg_threshold`` is background (label 0); others are
dropped. Each batch holds ``batch_size − int(batch_size × fg_fraction)`` background windows,
then the foreground ones, each drawn at random from its set and mirrored at random
(``transform_param.mirror``). A window (with ``context_pad`` pixels of context around it
after warping, and made square first with ``crop_mode: "square"``) is cut from the colour
image, clipped to it, resized bilinearly to its share of the ``crop_size`` square and placed
at its padding offset; the rest of the square stays 0. Pixels become ``(pixel − mean) ×
window_data_param.scale``, the mean being ``transform_param.mean_file``'s centre crop at the
same place in the square (not mirrored) or ``mean_value``. Float arithmetic and rounding
(``round``: half away from zero) as Caffe's, in float32.

The random window choices and mirrors are hashed from the reader's key and the item's
position (:mod:`.transform`), so workers and resume give the same batches; they are not
Caffe's RNG stream.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import (
    ItemSource,
    Planned,
    check_phase,
    check_tops,
    draw_key,
    make_rngs,
    positive_batch_size,
)
from caffe2jax.runtime.data.files import resolve_input
from caffe2jax.runtime.data.readers import reader
from caffe2jax.runtime.data.records.datum import read_blobproto
from caffe2jax.runtime.data.transform.image import decode_image, resize
from caffe2jax.runtime.data.transform.transformer import uniform_ints

log = logging.getLogger(__name__)
_F = np.float32


def _round(x: np.float32) -> int:
    """C's ``round`` of a float: half away from zero (in double: exact for a float)."""
    return int(math.copysign(math.floor(abs(float(x)) + 0.5), float(x)))


def parse_window_file(path: Path, root: str) -> tuple[list[tuple[str, int]], list[tuple]]:
    """The images (path, channels) and windows ``(image, label, overlap, x1, y1, x2, y2)``
    of a window file, read as Caffe's ``infile >>`` reads it (whitespace-separated)."""
    try:
        words = path.read_text(encoding="utf-8", errors="surrogateescape").split()
    except OSError as err:
        raise DataError(f"Failed to open window file {path} ({err.strerror})") from None
    if len(words) < 2:
        raise DataError(f"{path}: window file is empty")
    images, windows, at = {}, [], 0
    try:
        while at < len(words):
            if words[at] != "#":
                raise DataError(f"{path}: expected '#' before image {len(images)}, got "
                                f"{words[at]!r}")  # fmt: skip
            index, image_path = int(words[at + 1]), root + words[at + 2]
            images[index] = (image_path, int(words[at + 3]))
            count, at = int(words[at + 6]), at + 7
            for _ in range(count):
                label, overlap = int(words[at]), float(words[at + 1])
                x1, y1, x2, y2 = (int(w) for w in words[at + 2 : at + 6])
                windows.append((index, label, overlap, x1, y1, x2, y2))
                at += 6
    except (IndexError, ValueError):
        raise DataError(f"{path}: truncated or malformed window file near word {at}") from None
    return [images[i] for i in sorted(images)], windows


@reader("WindowData")
class WindowDataSource(ItemSource):
    """Caffe's ``WindowData`` layer."""

    STATE = ("position", "key")

    def __init__(
        self,
        layer: caffe_pb2.LayerParameter,
        phase: str,
        *,
        base_dir: Path | None = None,
        seed: int | None = None,
    ) -> None:
        check_tops(layer, (2,))
        check_phase(phase)
        param, transform = layer.window_data_param, layer.transform_param
        self.name, self.param = layer.name, param
        self.batch_size = positive_batch_size(param.batch_size, layer)
        self.crop = int(transform.crop_size)
        if self.crop <= 0:
            raise DataError(f"layer {layer.name!r} (WindowData): transform_param.crop_size "
                            "must be positive")  # fmt: skip
        self.mirror, self.scale = bool(transform.mirror), _F(param.scale)
        self.key = draw_key(make_rngs(seed, 1)[0])
        where = f"layer {layer.name!r}: window_data_param.source"
        self.window_file = resolve_input(param.source, base_dir, where)
        images, windows = parse_window_file(self.window_file, param.root_folder)
        self.images = [(Path(p), c) for p, c in images]
        self.base_dir = base_dir
        self._split(windows)
        self._means(transform, base_dir)
        self.cache = [self._bytes(i) for i in range(len(self.images))] if (
            param.cache_images) else None  # fmt: skip
        self.item_shape = (3, self.crop, self.crop)
        self._shapes = [(self.batch_size, *self.item_shape), (self.batch_size,)]

    def _split(self, windows: list[tuple]) -> None:
        """Foreground and background windows, by overlap, as Caffe's DataLayerSetUp."""
        fg, bg = [], []
        for window in windows:
            index, label, overlap = window[:3]
            if index >= len(self.images) or index < 0:
                raise DataError(f"{self.window_file}: a window names image {index}, not listed")
            if overlap >= self.param.fg_threshold:
                if label <= 0:
                    raise DataError(f"{self.window_file}: foreground window of image {index} "
                                    f"has label {label} (must be > 0)")  # fmt: skip
                fg.append(window)
            elif overlap < self.param.bg_threshold:
                bg.append((index, 0, 0.0, *window[3:]))
        self.fg, self.bg = fg, bg
        self.num_fg = int(_F(self.batch_size) * _F(self.param.fg_fraction))
        for name, kept, count in (("foreground", fg, self.num_fg),
                                  ("background", bg, self.batch_size - self.num_fg)):  # fmt: skip
            if count and not kept:
                raise DataError(f"{self.window_file}: no {name} windows, and a batch needs "
                                f"{count}")  # fmt: skip

    def _means(self, transform: caffe_pb2.TransformationParameter, base_dir: Path | None) -> None:
        self.mean: np.ndarray | None = None
        if transform.HasField("mean_file") and len(transform.mean_value):
            raise DataError("transform_param: cannot specify mean_file and mean_value at the "
                            "same time")  # fmt: skip
        if transform.HasField("mean_file"):
            mean = read_blobproto(resolve_input(transform.mean_file, base_dir, "mean_file"))
            self.mean = mean.reshape(mean.shape[-3:])
            off = (self.mean.shape[2] - self.crop) // 2
            if self.mean.shape[0] != 3 or min(self.mean.shape[1:]) < self.crop + off:
                raise DataError(f"layer {self.name!r}: mean_file of shape {self.mean.shape} "
                                f"does not hold a 3×{self.crop}×{self.crop} centre")  # fmt: skip
            self.mean = self.mean[:, off : off + self.crop, off : off + self.crop]
        values = np.asarray(transform.mean_value, _F)
        if len(values) not in (0, 1, 3):
            raise DataError(f"specify either 1 mean_value or as many as channels: 3 "
                            f"(got {len(values)})")  # fmt: skip
        self.mean_values = np.broadcast_to(values, (3,))[:, None, None] if len(values) else None

    def _bytes(self, index: int) -> bytes:
        path = self.images[index][0]
        where = f"{self.window_file}: image {index}"
        try:
            return resolve_input(path, self.base_dir, where).read_bytes()
        except OSError as err:
            raise DataError(f"{where}: could not open or find file {path}") from err

    def _records(self) -> list[tuple]:
        """Background windows, then foreground ones, each drawn from its set, and whether
        each is mirrored (drawn from the positions this batch takes)."""
        positions = np.arange(self.position, self.position + self.batch_size)
        picks = uniform_ints(self.key, positions, 3, 2**62)
        flips = uniform_ints(self.key, positions, 0, 2) == 1
        out = []
        for row in range(self.batch_size):
            kept = self.fg if row >= self.batch_size - self.num_fg else self.bg
            out.append((kept[int(picks[row]) % len(kept)], self.mirror and bool(flips[row])))
        return out

    def _skip_records(self) -> None:
        """Nothing to move: the windows are drawn from the positions."""

    def _item(self, record: tuple) -> tuple[np.ndarray, float]:
        raise NotImplementedError("WindowData fills its rows itself")

    def fill(self, planned: Planned, rows: range, out: list[np.ndarray]) -> float:
        """Warp each planned window into its row (zeros around it) and set its label."""
        for row in rows:
            window, flip = planned.records[row]
            out[0][row] = 0
            self._warp(window, flip, out[0][row])
            out[1][row] = window[1]
        return 0.0

    def _warp(self, window: tuple, flip: bool, out: np.ndarray) -> None:
        index = window[0]
        data = self.cache[index] if self.cache is not None else self._bytes(index)
        image = decode_image(data, "color", name=f"{self.window_file}: image {index}")
        (x1, y1, x2, y2), (ch, cw), (pad_h, pad_w) = self._region(window[3:], image.shape, flip)
        warped = resize(image[:, y1 : y2 + 1, x1 : x2 + 1], ch, cw)
        if flip:
            warped = warped[:, :, ::-1]
        rows, cols = slice(pad_h, pad_h + ch), slice(pad_w, pad_w + cw)
        target = out[:, rows, cols]
        if self.mean is not None:
            np.subtract(warped, self.mean[:, rows, cols], out=target)
        elif self.mean_values is not None:
            np.subtract(warped, self.mean_values, out=target)
        else:
            target[...] = warped
        if self.scale != 1:
            np.multiply(target, self.scale, out=target)

    def _region(self, box: tuple, shape: tuple, flip: bool) -> tuple:
        """Caffe's window geometry: the clipped source region, the size it is warped to and
        the padding offset in the crop square."""
        x1, y1, x2, y2 = box
        crop, pad = self.crop, int(self.param.context_pad)
        size, offsets = (crop, crop), (0, 0)
        if pad > 0 or self.param.crop_mode == "square":
            context = _F(crop) / _F(crop - 2 * pad)
            half_h, half_w = _F(y2 - y1 + 1) / _F(2), _F(x2 - x1 + 1) / _F(2)
            cx, cy = _F(x1) + half_w, _F(y1) + half_h
            if self.param.crop_mode == "square":
                half_h = half_w = max(half_h, half_w)
            x1, x2 = _round(cx - half_w * context), _round(cx + half_w * context)
            y1, y2 = _round(cy - half_h * context), _round(cy + half_h * context)
            sx, sy = _F(crop) / _F(x2 - x1 + 1), _F(crop) / _F(y2 - y1 + 1)
            px1, py1 = max(0, -x1), max(0, -y1)
            px2, py2 = max(0, x2 - shape[2] + 1), max(0, y2 - shape[1] + 1)
            x1, x2, y1, y2 = x1 + px1, x2 - px2, y1 + py1, y2 - py2
            height = _round(_F(y2 - y1 + 1) * sy)
            width = _round(_F(x2 - x1 + 1) * sx)
            pad_h = _round(_F(py1) * sy)
            pad_w = _round(_F(px2 if flip else px1) * sx)
            size, offsets = (min(height, crop - pad_h), min(width, crop - pad_w)), (pad_h, pad_w)
        if not (0 <= x1 <= x2 < shape[2] and 0 <= y1 <= y2 < shape[1]):
            raise DataError(f"{self.window_file}: window {box} lies outside its "
                            f"{shape[2]}×{shape[1]} image")  # fmt: skip
        return (x1, y1, x2, y2), size, offsets

    def close(self) -> None:
        """Nothing stays open between batches."""
