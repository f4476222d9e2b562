"""DeepLab's ``ImageSegData`` layer (DeepLab v2 image_seg_data_layer.cpp and
``DataTransformer::TransformImgAndSeg``; DeepLab v1's V1 ``IMAGE_SEG_DATA``, form
``"deeplab-v1"``): images and their segmentation label maps, named by a list of
``image label`` lines (:mod:`.pair_list`), read through ``image_data_param``.

Per item, as DeepLab's ``load_batch``:

* the image is read in colour or gray (``is_color``) and resized bilinearly to
  ``new_height`` × ``new_width`` when set; the label, by ``label_type``: ``PIXEL`` a gray label
  image resized the same (bilinearly: DeepLab's ``ReadImageToCVMat`` default), ``IMAGE`` (the
  default) the integer of the line's second token everywhere, ``NONE`` ``ignore_label``
  everywhere (both stored as uint8, saturated). DeepLab v1 always reads a label image.
* v2's ``scale_factors``: one drawn at random rescales both (image bilinear, label nearest)
  to ``int(H · s)`` × ``int(W · s)``.
* a crop (``crop_size``, or v2's ``crop_height``/``crop_width``) larger than the image pads
  it at the bottom and right, the image with ``mean_value`` (so padded pixels become 0) and
  the label with ``ignore_label`` (255 in v1); the crop is then cut at ``Rand(H − crop + 1)``,
  ``Rand(W − crop + 1)`` in TRAIN, at the centre in TEST, the same for image and label.
* ``mirror`` flips both at random; the image becomes ``(pixel − mean_value[c]) × scale``, the
  label keeps its values. ``mean_file`` is refused, as DeepLab does.
* v2's optional third top ``data_dim`` (N, 1, 1, 2) holds each image's resized
  (height, width), capped by the data top's.

Draws are hashed from the reader's key and the item's position, not Caffe's RNG stream.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import Planned, check_phase, check_tops, positive_batch_size
from caffe2jax.runtime.data.readers import reader
from caffe2jax.runtime.data.readers.pair_list import (
    Pair,
    PairListSource,
    parse_pair_list,
    read_gray,
)
from caffe2jax.runtime.data.transform.image import read_image, resize, resize_nearest
from caffe2jax.runtime.data.transform.transformer import DataTransformer, uniform_ints

LabelType = caffe_pb2.ImageDataParameter
_F = np.float32


def _crop(layer: caffe_pb2.LayerParameter) -> tuple[int, int]:
    """(height, width) of the crop: crop_size, or v2's crop_height and crop_width (not both)."""
    t = layer.transform_param
    if t.HasField("crop_height") or t.HasField("crop_width"):
        if t.HasField("crop_size") or not (t.HasField("crop_height") and t.HasField("crop_width")):
            raise DataError(
                f"layer {layer.name!r} (ImageSegData): give crop_size or both "
                "crop_height and crop_width"
            )
        return int(t.crop_height), int(t.crop_width)
    return int(t.crop_size), int(t.crop_size)


@reader("ImageSegData")
class ImageSegDataSource(PairListSource):
    """DeepLab's ``ImageSegData`` layer."""

    def __init__(
        self,
        layer: caffe_pb2.LayerParameter,
        phase: str,
        *,
        base_dir: Path | None = None,
        seed: int | None = None,
        form: str = "",
    ) -> None:
        self.v1 = form == "deeplab-v1"
        check_tops(layer, (2,) if self.v1 else (2, 3))
        p, t = layer.image_data_param, layer.transform_param
        self.name, self.phase = layer.name, check_phase(phase)
        self.batch_size = positive_batch_size(p.batch_size, layer)
        self._check(layer, p, t)
        self.label_type = LabelType.PIXEL if self.v1 else p.label_type
        self.ignore = 255 if self.v1 else int(np.clip(p.ignore_label, 0, 255))
        self.size, self.is_color, self.crop = (p.new_height, p.new_width), p.is_color, _crop(layer)
        self.mirror, self.factors = t.mirror, np.asarray(t.scale_factors, _F)
        tokens = 1 if self.label_type == LabelType.NONE else 2
        self._open_list(
            p.source,
            p.root_folder,
            base_dir,
            seed,
            p.shuffle,
            p.rand_skip,
            lambda path: parse_pair_list(path, tokens),
        )
        self.transformer = DataTransformer(t, self.phase, base_dir=base_dir)
        image, _ = self._read(self.first())
        self.item_shape = image.shape
        out = self.crop if self.crop[0] else image.shape[1:]
        self.transformer.output_shape((image.shape[0], *out), str(self.list_path))
        values = self.transformer.mean_values
        self.means = np.broadcast_to(values, (image.shape[0],)) if len(values) else None
        self._shapes = [(self.batch_size, image.shape[0], *out), (self.batch_size, 1, *out)]
        self._shapes += [(self.batch_size, 1, 1, 2)] * (len(layer.top) == 3)

    def _check(self, layer: caffe_pb2.LayerParameter, p, t) -> None:
        where = f"layer {layer.name!r} (ImageSegData)"
        if t.HasField("mean_file"):
            raise DataError(
                f"{where}: ImageSegData does not support mean_file (DeepLab); use mean_value"
            )
        if (p.new_height > 0) != (p.new_width > 0):
            raise DataError(f"{where}: new_height and new_width must be set at the same time")
        if len(t.scale_factors) and not (t.crop_size or t.crop_height):
            raise DataError(
                f"{where}: scale_factors change each image's size; give a crop "
                "so that a batch has one shape"
            )

    def _label(self, pair: Pair, image: np.ndarray) -> np.ndarray:
        h, w = self.size
        if self.label_type == LabelType.PIXEL:
            label = read_gray(self.path(pair, pair.label), h, w, nearest=False)
            if label.shape[1:] != image.shape[1:]:
                raise DataError(
                    f"{self.list_path}:{pair.line}: label {pair.label} is "
                    f"{label.shape[1]}×{label.shape[2]}, its image "
                    f"{image.shape[1]}×{image.shape[2]} (they must match)"
                )
            return label
        if self.label_type == LabelType.IMAGE:
            try:
                value = int(pair.label)
            except ValueError:
                raise DataError(
                    f"{self.list_path}:{pair.line}: label_type IMAGE needs an "
                    f"integer label, got {pair.label!r}"
                ) from None
        else:
            value = self.ignore
        return np.full((1, *image.shape[1:]), np.clip(value, 0, 255), np.uint8)

    def _read(self, pair: Pair) -> tuple[np.ndarray, np.ndarray]:
        h, w = self.size
        image = read_image(self.path(pair, pair.image), height=h, width=w, is_color=self.is_color)
        return image, self._label(pair, image)

    def _rescale(self, image, label, position: np.ndarray):
        """v2's scale_factors: one drawn per item (stream 3) rescales image and label."""
        if not len(self.factors):
            return image, label
        s = self.factors[int(uniform_ints(self.key, position, 3, len(self.factors))[0])]
        if s == 1:
            return image, label
        h, w = int(_F(image.shape[1]) * s), int(_F(image.shape[2]) * s)
        return resize(image, h, w), resize_nearest(label, h, w)

    def _pad(self, image: np.ndarray, label: np.ndarray):
        """Pad the bottom and right up to the crop: image with the mean values, label with
        ``ignore_label``."""
        (ch, cw), (_, h, w) = self.crop, image.shape
        ph, pw = max(ch - h, 0), max(cw - w, 0)
        if not (ph or pw):
            return image, label
        if self.means is None:
            raise DataError(
                f"layer {self.name!r} (ImageSegData): crop {ch}×{cw} is larger "
                f"than the image {h}×{w}; DeepLab pads with mean_value, which "
                "is not set"
            )
        padded = np.empty((image.shape[0], h + ph, w + pw), _F)
        padded[...] = self.means[:, None, None]
        padded[:, :h, :w] = image
        seg = np.full((1, h + ph, w + pw), self.ignore, np.uint8)
        seg[:, :h, :w] = label
        return padded, seg

    def _offsets(self, shape: tuple[int, ...], position: np.ndarray) -> tuple[int, int]:
        (ch, cw), (_, h, w) = self.crop, shape
        if not ch:
            return 0, 0
        if self.phase == "TEST":
            return (h - ch) // 2, (w - cw) // 2
        return (
            int(uniform_ints(self.key, position, 1, h - ch + 1)[0]),
            int(uniform_ints(self.key, position, 2, w - cw + 1)[0]),
        )

    def fill(self, planned: Planned, rows: range, out: list[np.ndarray]) -> float:
        """Read, rescale, pad, crop, mirror and transform each planned pair into its rows."""
        out_h, out_w = out[0].shape[2:]
        for row in rows:
            pair, position = planned.records[row], planned.positions[row : row + 1]
            image, label = self._read(pair)
            if not self.crop[0]:
                self.check_item(pair, image.shape, self.item_shape)
            if len(out) == 3:
                out[2][row] = [[[min(out_h, image.shape[1]), min(out_w, image.shape[2])]]]
            image, label = self._pad(*self._rescale(image, label, position))
            h_off, w_off = self._offsets(image.shape, position)
            flip = bool(self.mirror and uniform_ints(self.key, position, 0, 2)[0] == 1)
            self.transformer.transform_into(image, flip, h_off, w_off, out[0][row])
            cut = label[:, h_off : h_off + out_h, w_off : w_off + out_w]
            out[1][row] = cut[:, :, ::-1] if flip else cut
        return 0.0
