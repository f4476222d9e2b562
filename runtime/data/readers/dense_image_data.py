"""SegNet's ``DenseImageData`` layer (caffe-segnet dense_image_data_layer.cpp; ENet's copy adds
``label_divide_factor``): images and their label maps, named by a list of ``image label``
lines (:mod:`.pair_list`).

Per item, as SegNet's ``InternalThreadEntry``: the image is read in colour or gray
(``is_color``) and the label map in gray, both resized to ``new_height`` × ``new_width``
when set (the image bilinearly, the label with ``INTER_NEAREST``; ENet's label to
``new_height / f`` × ``new_width / f``, ``f = label_divide_factor``). With
``dense_image_data_param.mirror`` both are flipped left-right at random (in every phase);
then, with ``crop_height``/``crop_width``, both are cut at the same random offset
``Rand(H − crop_height + 1)``, ``Rand(W − crop_width + 1)`` (in every phase: SegNet does not
look at it). The image then goes through Caffe's transformer (``mean_file`` — of the cropped
size —, ``mean_value``, ``scale``); the label keeps its pixel values (``preserve_pixel_vals``:
no mean, no scale). Tops: data (N, C, H, W), label (N, 1, H, W).

``transform_param`` ``crop_size`` and ``mirror`` would crop and flip the image but not its
label (SegNet refuses them: "FIXME: Any stochastic transformation will break layer"); they
are refused here too. The random flips and offsets are hashed from the reader's key and the
item's position (:func:`~.transform.uniform_ints`), not Caffe's RNG stream.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import Planned, check_phase, check_tops, positive_batch_size
from caffe2jax.runtime.data.readers import reader
from caffe2jax.runtime.data.readers.pair_list import Pair, PairListSource, read_gray
from caffe2jax.runtime.data.transform.image import read_image
from caffe2jax.runtime.data.transform.transformer import DataTransformer, uniform_ints


def _both_or_neither(layer, param, a: str, b: str) -> tuple[int, int]:
    va, vb = int(getattr(param, a)), int(getattr(param, b))
    if (va > 0) != (vb > 0):
        raise DataError(
            f"layer {layer.name!r} (DenseImageData): {a} and {b} must be set at the same time"
        )
    return va, vb


@reader("DenseImageData")
class DenseImageDataSource(PairListSource):
    """SegNet/ENet's ``DenseImageData`` layer."""

    def __init__(
        self,
        layer: caffe_pb2.LayerParameter,
        phase: str,
        *,
        base_dir: Path | None = None,
        seed: int | None = None,
    ) -> None:
        check_tops(layer, (2,))
        p, t = layer.dense_image_data_param, layer.transform_param
        self.name = layer.name
        self.batch_size = positive_batch_size(p.batch_size, layer)
        self.size = _both_or_neither(layer, p, "new_height", "new_width")
        self.crop = _both_or_neither(layer, p, "crop_height", "crop_width")
        self.factor, self.mirror, self.is_color = int(p.label_divide_factor), p.mirror, p.is_color
        self._refuse(layer, t)
        self._open_list(p.source, p.root_folder, base_dir, seed, p.shuffle, p.rand_skip)
        self.transformer = DataTransformer(t, check_phase(phase), base_dir=base_dir)
        image, label = self._read(self.first())
        self.item_shape = image.shape
        if self.crop[0] > image.shape[1] or self.crop[1] > image.shape[2]:
            raise DataError(
                f"{self.list_path}: crop {self.crop[0]}×{self.crop[1]} is larger than the "
                f"images {image.shape[1]}×{image.shape[2]}"
            )
        out = self.crop if self.crop[0] else image.shape[1:]
        label_out = self.crop if self.crop[0] else label.shape[1:]
        shape = self.transformer.output_shape((image.shape[0], *out), str(self.list_path))
        self._shapes = [(self.batch_size, *shape), (self.batch_size, 1, *label_out)]

    def _refuse(self, layer: caffe_pb2.LayerParameter, t) -> None:
        if t.crop_size or t.mirror:
            raise DataError(
                f"layer {layer.name!r} (DenseImageData): transform_param crop_size/mirror would "
                "crop or flip the image but not its label; use dense_image_data_param "
                "crop_height/crop_width/mirror"
            )
        if self.factor < 1:
            raise DataError(f"layer {layer.name!r}: label_divide_factor must be positive")
        if self.factor > 1 and (self.crop[0] or not self.size[0]):
            raise DataError(
                f"layer {layer.name!r} (DenseImageData): label_divide_factor {self.factor} "
                "needs new_height/new_width and no crop (ENet's layer)"
            )

    def _read(self, pair: Pair) -> tuple[np.ndarray, np.ndarray]:
        (h, w), f = self.size, self.factor
        image = read_image(self.path(pair, pair.image), height=h, width=w, is_color=self.is_color)
        label = read_gray(self.path(pair, pair.label), h // f, w // f, nearest=True)
        if f == 1 and label.shape[1:] != image.shape[1:]:
            raise DataError(
                f"{self.list_path}:{pair.line}: label {pair.label} is "
                f"{label.shape[1]}×{label.shape[2]}, its image "
                f"{image.shape[1]}×{image.shape[2]} (they must match)"
            )
        return image, label

    def fill(self, planned: Planned, rows: range, out: list[np.ndarray]) -> float:
        """Read, flip, crop and transform each planned pair into its rows."""
        positions = planned.positions[rows.start : rows.stop]
        _, h, w = self.item_shape
        ch, cw = self.crop
        flips = uniform_ints(self.key, positions, 0, 2) == 1
        h_offs = (
            uniform_ints(self.key, positions, 1, h - ch + 1) if ch else np.zeros_like(positions)
        )
        w_offs = (
            uniform_ints(self.key, positions, 2, w - cw + 1) if cw else np.zeros_like(positions)
        )
        for i, row in enumerate(rows):
            pair = planned.records[row]
            image, label = self._read(pair)
            self.check_item(pair, image.shape, self.item_shape)
            if self.mirror and flips[i]:
                image, label = image[:, :, ::-1], label[:, :, ::-1]
            if ch:
                cut = np.s_[:, h_offs[i] : h_offs[i] + ch, w_offs[i] : w_offs[i] + cw]
                image, label = image[cut], label[cut]
            self.transformer.transform_into(image, False, 0, 0, out[0][row])
            out[1][row] = label
        return 0.0
