"""caffe2jax's built-in stand-in for py-faster-rcnn's ``roi_data_layer.layer.RoIDataLayer``
(end-to-end training, ``cfg.TRAIN.HAS_RPN``): one image per forward with its boxes, read from
an AnnotatedDatum LMDB (``caffe2jax convert_annoset``, SSD's ``convert_annoset``).

A ``type: "Python"`` layer naming ``roi_data_layer.layer`` / ``RoIDataLayer`` runs this when
the user's own ``roi_data_layer`` package is not importable (then theirs runs, as in Caffe).
Its ``param_str`` (py-faster-rcnn's YAML mapping) takes:

* ``num_classes`` (py-faster-rcnn's key; boxes with a label ≥ num_classes are an error);
* ``source``: the LMDB folder (py-faster-rcnn reads its roidb from the dataset instead; the
  path is relative to the working directory, then to the prototxt's folder);
* ``scale`` (cfg.TRAIN.SCALES[0], default 600), ``max_size`` (cfg.TRAIN.MAX_SIZE, 1000),
  ``flip`` (cfg.TRAIN.USE_FLIPPED, default 1), ``max_boxes`` (G, default 32);
* ``pad`` (caffe2jax's, default 0): 1 for a data set of mixed image sizes (see below).

Reproduced from py-faster-rcnn@781a917 lib/roi_data_layer/layer.py and minibatch.py and
lib/utils/blob.py: the image is BGR float minus PIXEL_MEANS (102.9801, 115.9465, 122.7717),
scaled by ``scale / min(H, W)`` unless ``round(s·max(H, W)) > max_size`` (then
``max_size / max(H, W)``) with cv2.resize INTER_LINEAR (output size ``round(W·s)``,
``round(H·s)``); tops data (1, 3, H', W'), im_info (1, 3) [H', W', s] and gt_boxes (G, 5)
[x1, y1, x2, y2, class] = the boxes · s, then zero rows (class 0: padding, which the built-in
target layers mask out). A normalized box of a W×H image is py-faster-rcnn's pixel box
``[xmin·W − 1, ymin·H − 1, xmax·W − 1, ymax·H − 1]`` (VOC's 1-based XML values, which
convert_annoset divided by the size, minus one as pascal_voc.py does), clipped to the image;
difficult boxes are left out (pascal_voc.py's ``use_diff`` false). With ``flip`` every image
appears twice per epoch, once mirrored (``append_flipped_images``: x1' = W − x2 − 1,
x2' = W − x1 − 1), in a random order drawn anew each epoch from the reader's seed (numpy's
generator, not py-faster-rcnn's global state; its aspect-ratio pairing is not reproduced).

Shapes are fixed for the compiled step. By default every image must have the first record's
size (another size is an error naming the record and ``pad``). With ``'pad': 1`` the records'
sizes are read when the layer opens (image headers only) and every scaled image is placed at
the top left of a zero canvas as large as the largest scaled height and width in the set —
what py-faster-rcnn's ``im_list_to_blob`` does to the images of one batch — with ``im_info``
holding the image's own scaled size and scale, so the anchor target layer keeps only anchors
inside the image and the proposal layer clips to it. An image with more than G boxes is an
error naming the record.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import ItemSource, Planned, check_phase, make_rngs
from caffe2jax.runtime.data.files import resolve_input
from caffe2jax.runtime.data.readers import reader
from caffe2jax.runtime.data.records.annotated_datum import decode_annotated, parse_annotated_datum
from caffe2jax.runtime.data.records.db import open_db

PIXEL_MEANS = np.array([102.9801, 115.9465, 122.7717], np.float32)


def _options(layer: caffe_pb2.LayerParameter) -> dict:
    from caffe2jax.lowering.forks.rcnn_proposal import parse_param_str

    got = parse_param_str(layer.python_param.param_str)
    if "num_classes" not in got or "source" not in got:
        raise DataError(
            f"layer {layer.name!r} (built-in RoIDataLayer): param_str needs 'num_classes' and "
            f"'source' (the AnnotatedDatum LMDB), got {layer.python_param.param_str!r}"
        )
    defaults = {"scale": 600, "max_size": 1000, "flip": 1, "max_boxes": 32, "pad": 0}
    options = {**defaults, **got}
    for key in ("scale", "max_size"):  # a NaN, 0 or infinite scale sizes no image
        value = options[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e6:
            raise DataError(
                f"layer {layer.name!r} (built-in RoIDataLayer): param_str "
                f"'{key}' must be a number in (0, 10^6) pixels, got {value!r}"
            )
    return options


def im_scale(height: int, width: int, scale: float, max_size: float) -> float:
    """py-faster-rcnn's prep_im_for_blob scale factor."""
    s = float(scale) / min(height, width)
    if np.round(s * max(height, width)) > max_size:
        s = float(max_size) / max(height, width)
    return s


def pixel_boxes(norm: np.ndarray, height: int, width: int, flip: bool) -> np.ndarray:
    """py-faster-rcnn's 0-based pixel boxes of normalized boxes (module docstring)."""
    size = np.array([width, height, width, height], np.float64)
    boxes = np.clip(norm.astype(np.float64) * size - 1, 0, size - 1)
    if flip:
        x1 = boxes[:, 0].copy()
        boxes[:, 0] = width - boxes[:, 2] - 1
        boxes[:, 2] = width - x1 - 1
    return boxes


def record_size(value: bytes, where: str) -> tuple[int, int]:
    """(height, width) of an AnnotatedDatum's image without decoding its pixels (an encoded
    image's header, else the Datum's fields)."""
    import io

    from PIL import Image

    datum = parse_annotated_datum(value, where=where).datum
    if not datum.encoded:
        return int(datum.height), int(datum.width)
    try:
        with Image.open(io.BytesIO(datum.data)) as image:
            width, height = image.size
    except Exception as err:  # noqa: BLE001 - any undecodable header is the record's fault
        raise DataError(f"{where}: cannot read the encoded image ({err})") from None
    return int(height), int(width)


@reader("RoIData")
class RoIDataSource(ItemSource):
    """The built-in RoIDataLayer (module docstring): tops data, im_info, gt_boxes."""

    STATE = ("position", "cur", "perm")
    RNGS = ("rng",)
    labels = False

    def __init__(
        self,
        layer: caffe_pb2.LayerParameter,
        phase: str,
        *,
        base_dir: Path | None = None,
        seed: int | None = None,
    ) -> None:
        check_phase(phase)
        if len(layer.top) != 3:
            raise DataError(
                f"layer {layer.name!r} (built-in RoIDataLayer): the end-to-end "
                f"form has 3 tops (data, im_info, gt_boxes), got {len(layer.top)}"
            )
        self.name = layer.name
        self.opt = _options(layer)
        where = f"layer {layer.name!r}: param_str 'source'"
        self.db = open_db(resolve_input(str(self.opt["source"]), base_dir, where))
        self.keys = list(self.db.keys())
        if not self.keys:
            raise DataError(f"layer {layer.name!r}: {self.opt['source']} has no records")
        self.batch_size = 1
        self.flips = 2 if int(self.opt["flip"]) else 1
        (self.rng,) = make_rngs(seed, 1)
        self.cur, self.perm = 0, self._new_perm()
        self.pad = bool(int(self.opt["pad"]))
        sizes = [self._size(k) for k in self.keys] if self.pad else [self._size(self.keys[0])]
        self.item_hw = sizes[0]
        self.item_shape = (3, *self.item_hw)
        scaled = [self._scaled(h, w)[1] for h, w in sizes]
        self.out_hw = tuple(int(max(hw[i] for hw in scaled)) for i in (0, 1))
        self.max_boxes = int(self.opt["max_boxes"])
        self._shapes = [(1, 3, *self.out_hw), (1, 3), (self.max_boxes, 5)]

    def _size(self, key: bytes) -> tuple[int, int]:
        """(height, width) of a record's image from its header."""
        where = f"layer {self.name!r}: record {key.decode(errors='replace')!r}"
        return record_size(self.db.get(key), where)

    def _scaled(self, h: int, w: int) -> tuple[float, tuple[int, int]]:
        """prep_im_for_blob's scale of an h × w image and the scaled (height, width)."""
        s = im_scale(h, w, self.opt["scale"], self.opt["max_size"])
        return s, (int(np.round(h * s)), int(np.round(w * s)))

    def _new_perm(self) -> np.ndarray:
        return self.rng.permutation(len(self.keys) * self.flips)

    def _advance(self) -> int:
        """py-faster-rcnn's _get_next_minibatch_inds: the next entry, a new order each epoch."""
        if self.cur >= len(self.perm):
            self.perm, self.cur = self._new_perm(), 0
        entry = int(self.perm[self.cur])
        self.cur += 1
        return entry

    def _records(self) -> list:
        entry = self._advance()
        return [(self.keys[entry % len(self.keys)], entry >= len(self.keys))]

    def _skip_records(self) -> None:
        self._advance()

    def _item(self, record: object) -> tuple[np.ndarray, float]:
        raise NotImplementedError  # fill() writes every top

    def _boxes(self, boxes, hws: tuple[int, int, float], flip: bool, where: str) -> np.ndarray:
        h, w, scale = hws
        keep = ~boxes.difficult
        labels = boxes.labels[keep]
        if labels.size and (labels.min() < 1 or labels.max() >= self.opt["num_classes"]):
            raise DataError(
                f"{where}: box labels must be in [1, num_classes "
                f"{int(self.opt['num_classes'])}), got {sorted(set(labels))}"
            )
        if len(labels) > self.max_boxes:
            raise DataError(
                f"{where}: {len(labels)} boxes, more than max_boxes "
                f"{self.max_boxes} (param_str 'max_boxes')"
            )
        out = np.zeros((self.max_boxes, 5), np.float32)
        out[: len(labels), :4] = pixel_boxes(boxes.boxes[keep], h, w, flip) * scale
        out[: len(labels), 4] = labels
        return out

    def fill(self, planned: Planned, rows: range, out: list[np.ndarray]) -> float:
        import cv2

        key, flip = planned.records[0]
        where = f"layer {self.name!r}: record {key.decode(errors='replace')!r}"
        image, boxes = decode_annotated(self.db.get(key), mode="color", where=where)
        h, w = image.shape[1:]
        if not self.pad and (h, w) != self.item_hw:
            raise DataError(
                f"{where}: image {h}x{w} differs from the first record's "
                f"{self.item_hw[0]}x{self.item_hw[1]} (the compiled net has one input shape; "
                "'pad': 1 in param_str places mixed sizes on one canvas)"
            )
        hwc = image.transpose(1, 2, 0).astype(np.float32) - PIXEL_MEANS
        if flip:
            hwc = hwc[:, ::-1]
        s, (h2, w2) = self._scaled(h, w)
        hwc = cv2.resize(
            np.ascontiguousarray(hwc), None, None, fx=s, fy=s, interpolation=cv2.INTER_LINEAR
        )
        if hwc.shape[:2] != (h2, w2) or h2 > self.out_hw[0] or w2 > self.out_hw[1]:
            raise DataError(f"{where}: resized to {hwc.shape[:2]}, expected {(h2, w2)} within "
                            f"{self.out_hw}")  # fmt: skip
        out[0][0] = 0.0
        out[0][0, :, :h2, :w2] = hwc.transpose(2, 0, 1)
        out[1][0] = (h2, w2, s)
        out[2][:] = self._boxes(boxes, (h, w, s), flip, where)
        return 0.0

    def close(self) -> None:
        self.db.close()
