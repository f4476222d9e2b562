"""SSD's DataTransformer for AnnotatedData (weiliu89/caffe data_transformer.cpp,
util/im_transforms.cpp): one image and its boxes, in the fork's order.

Per item, as ``AnnotatedDataLayer::load_batch`` does:

1. ``distort_param`` (``ApplyDistort``, encoded records only, as the fork): with probability
   ½ brightness, contrast, saturation, hue, else brightness, saturation, hue, contrast; each
   applied with its probability and a uniform delta (brightness ±delta added, contrast and
   saturation factors in [lower, upper], hue ±delta added to OpenCV's 8-bit H), results
   saturated to uint8; then the channels shuffled with ``random_order_prob``;
2. ``expand_param`` (``ExpandImage``): with probability ``prob`` (and a ratio above 1.01), a
   canvas ``int(H·r)×int(W·r)``, r uniform in [1, max_expand_ratio], filled with the
   ``mean_value``s (rounded to uint8) or 0, the image at a uniform whole-pixel offset;
3. the batch samplers (:func:`~.bbox_geometry.batch_samples`): one of the kept boxes chosen
   uniformly, the image cropped to it (clipped, scaled to pixels, truncated to int);
4. ``Transform``: the mirror flag (``mirror`` and a fair coin), ``resize_param`` (WARP,
   FIT_LARGE_SIZE_AND_PAD with ``pad_mode``/``pad_value``, FIT_SMALL_SIZE; the
   interpolation drawn uniformly among ``interp_mode``, LINEAR when none), ``crop_size`` or
   ``crop_h``/``crop_w`` (random offsets in TRAIN, the centre in TEST), the mirror, then
   ``(pixel − mean) × scale`` into the float32 row.

Boxes follow every step (``TransformAnnotation``): after steps 2 and 3 and 4 each box must
meet ``emit_constraint`` (when set) against the expand canvas / sampled crop / final crop and
overlap it (``ProjectBBox``); kept boxes are projected into it and clipped; step 4 first moves
them through the resize policy and mirrors them as ``x → 1 − x`` last.

All random choices of an item are made up front (:meth:`AnnotatedTransformer.plan`, from the
item's own generator), so the boxes are known before any pixel is touched. Not reproduced:
the fork re-encodes the image as JPEG after each of steps 1–3 (lossy); here the pixels stay
as they are. ``noise_param``, FIT_SMALL_SIZE's ``height_scale``/``width_scale`` and a
``mean_file`` with ``expand_param`` are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.records.annotated_datum import Boxes
from caffe2jax.runtime.data.transform.bbox_geometry import (
    batch_samples,
    clip,
    meet_emit,
    project,
    resize_boxes,
)

_F = np.float32
# the largest expanded canvas: 2^31 bytes of float32 per channel (the fork counts in int)
_CANVAS_BYTES = 2**31
RP = caffe_pb2.ResizeParameter
INTERP = {RP.LINEAR: cv2.INTER_LINEAR, RP.AREA: cv2.INTER_AREA, RP.NEAREST: cv2.INTER_NEAREST,
          RP.CUBIC: cv2.INTER_CUBIC, RP.LANCZOS4: cv2.INTER_LANCZOS4}  # fmt: skip
PAD = {RP.CONSTANT: cv2.BORDER_CONSTANT, RP.MIRRORED: cv2.BORDER_REFLECT_101,
       RP.REPEAT_NEAREST: cv2.BORDER_REPLICATE}  # fmt: skip
_ORDERS = (("brightness", "contrast", "saturation", "hue"),
           ("brightness", "saturation", "hue", "contrast"))  # fmt: skip


@dataclass(frozen=True)
class Recipe:
    """Every random choice of one item, in pixels: distortions ``(name, delta)`` and the
    channel order, the expand canvas ``(H, W, h_off, w_off)``, the sampled crop ``(y, x, h,
    w)``, the interpolation, the final crop offsets ``(h_off, w_off)`` and the mirror."""

    distort: tuple[tuple[str, float], ...] = ()
    channels: tuple[int, ...] | None = None
    expand: tuple[int, int, int, int] | None = None
    crop: tuple[int, int, int, int] | None = None
    interp: int = cv2.INTER_LINEAR
    offsets: tuple[int, int] = (0, 0)
    mirror: bool = False


def _saturate(x: np.ndarray) -> np.ndarray:
    """OpenCV's ``saturate_cast<uchar>`` of a float: round half to even, clamp to [0, 255]."""
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def _distort(hwc: np.ndarray, recipe: Recipe) -> np.ndarray:
    for name, delta in recipe.distort:
        if name == "brightness" and abs(delta) > 0:
            hwc = _saturate(hwc.astype(_F) + _F(delta))
        elif name == "contrast" and abs(delta - 1) > 1e-3:
            hwc = _saturate(hwc.astype(_F) * _F(delta))
        elif name in ("saturation", "hue"):
            hsv = cv2.cvtColor(np.ascontiguousarray(hwc), cv2.COLOR_BGR2HSV)
            if name == "saturation":
                hsv[..., 1] = _saturate(hsv[..., 1].astype(_F) * _F(delta))
            elif abs(delta) > 0:
                hsv[..., 0] = _saturate(hsv[..., 0].astype(_F) + _F(delta))
            hwc = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)
    if recipe.channels is not None:
        hwc = hwc[..., list(recipe.channels)]
    return hwc


class AnnotatedTransformer:
    """The fork's transform of AnnotatedData items (see the module doc)."""

    def __init__(self, param: caffe_pb2.TransformationParameter, phase: str,
                 samplers: list[caffe_pb2.BatchSampler], where: str) -> None:  # fmt: skip
        self.where, self.phase, self.samplers = where, phase, samplers
        self.scale, self.mirror = _F(param.scale), bool(param.mirror)
        crop = int(param.crop_size)
        self.crop_hw = (crop, crop) if crop else (int(param.crop_h), int(param.crop_w))
        self.mean_values = np.asarray(param.mean_value, _F)
        self.mean: np.ndarray | None = None  # set by the source (mean_file)
        self.emit = param.emit_constraint if param.HasField("emit_constraint") else None
        self.distort = param.distort_param if param.HasField("distort_param") else None
        self.expand = param.expand_param if param.HasField("expand_param") else None
        if len(param.resize_param) > 1:
            raise DataError(f"{where}: give at most one transform_param.resize_param")
        self.resize = param.resize_param[0] if len(param.resize_param) else None
        self._check(param)

    def _check(self, param: caffe_pb2.TransformationParameter) -> None:
        where = self.where
        if param.HasField("noise_param") and param.noise_param.prob > 0:
            raise DataError(f"{where}: transform_param.noise_param is not supported")
        if self.resize is not None:
            if self.resize.height <= 0 or self.resize.width <= 0:
                raise DataError(f"{where}: resize_param needs height and width > 0")
            if self.resize.height_scale or self.resize.width_scale:
                raise DataError(f"{where}: resize_param height_scale/width_scale (FIT_SMALL_SIZE"
                                " extrapolation) is not supported")  # fmt: skip
        if self.expand is not None:
            if not 1 < self.expand.max_expand_ratio < math.inf:  # NaN fails too
                raise DataError(f"{where}: expand_param.max_expand_ratio must be > 1 and "
                                f"finite, got {self.expand.max_expand_ratio}")  # fmt: skip
            if param.HasField("mean_file"):
                raise DataError(f"{where}: expand_param with a mean_file is not supported "
                                "(the fork needs a mean of every expanded size)")  # fmt: skip
        d = self.distort
        if d is not None and (d.brightness_delta < 0 or d.contrast_lower < 0
                              or d.contrast_upper < d.contrast_lower or d.hue_delta < 0
                              or d.saturation_lower < 0
                              or d.saturation_upper < d.saturation_lower):  # fmt: skip
            raise DataError(f"{where}: distort_param needs deltas >= 0 and 0 <= lower <= upper")
        for sampler in self.samplers:
            s = sampler.sampler
            if not (0 < s.min_scale <= s.max_scale <= 1):
                raise DataError(f"{where}: batch_sampler needs 0 < min_scale <= max_scale <= 1")
            if not (0 < s.min_aspect_ratio <= s.max_aspect_ratio < np.finfo(_F).max):
                raise DataError(f"{where}: batch_sampler needs 0 < min_aspect_ratio <= "
                                "max_aspect_ratio")  # fmt: skip

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """``InferNewSize``: the size the resize_param gives an image."""
        if self.resize is None:
            return height, width
        new_h, new_w = int(self.resize.height), int(self.resize.width)
        if self.resize.resize_mode == RP.FIT_SMALL_SIZE:
            aspect = _F(width) / _F(height)
            if aspect < _F(new_w) / _F(new_h):
                new_h = int(_F(new_w) / aspect)
            else:
                new_w = int(aspect * _F(new_h))
        return new_h, new_w

    def output_shape(self, channels: int, height: int, width: int) -> tuple[int, int, int]:
        """``InferBlobShape``: an item's C×H×W after resize and crop."""
        height, width = self.resized_size(height, width)
        ch, cw = self.crop_hw
        if height < ch or width < cw:
            raise DataError(f"{self.where}: crop {ch}×{cw} is larger than the image {height}×"
                            f"{width}")  # fmt: skip
        if len(self.mean_values) not in (0, 1, channels):
            raise DataError(f"{self.where}: specify either 1 mean_value or as many as channels: "
                            f"{channels} (got {len(self.mean_values)})")  # fmt: skip
        return channels, ch or height, cw or width

    def _annotate(self, boxes: Boxes, crop: np.ndarray) -> Boxes:
        """``TransformAnnotation`` without resize or mirror: emit, project, clip."""
        keep = np.ones(len(boxes), bool)
        if self.emit is not None:
            keep &= meet_emit(crop, boxes.boxes, self.emit)
        overlap, proj = project(crop, boxes.boxes)
        keep &= overlap
        return boxes.with_boxes(proj).take(keep)

    def _distort_draws(self, rng: np.random.Generator) -> tuple[tuple, tuple | None]:
        d = self.distort
        ops = []
        for name in _ORDERS[0 if rng.uniform() > 0.5 else 1]:
            prob = getattr(d, f"{name}_prob")
            if rng.uniform() < prob:
                if name in ("brightness", "hue"):
                    delta = getattr(d, f"{name}_delta")
                    ops.append((name, float(_F(rng.uniform(-delta, delta)))))
                else:
                    lower, upper = getattr(d, f"{name}_lower"), getattr(d, f"{name}_upper")
                    ops.append((name, float(_F(rng.uniform(lower, upper)))))
        perm = tuple(rng.permutation(3).tolist()) if rng.uniform() < d.random_order_prob else None
        return tuple(ops), perm

    def _expand(self, rng, height, width, boxes):
        if rng.uniform() > self.expand.prob or abs(self.expand.max_expand_ratio - 1) < 1e-2:
            return None, height, width, boxes
        ratio = _F(rng.uniform(1, self.expand.max_expand_ratio))
        big_h, big_w = int(_F(height) * ratio), int(_F(width) * ratio)
        if big_h * big_w * 4 > _CANVAS_BYTES:  # the fork's int count overflows at 2^31
            raise DataError(f"{self.where}: expand_param.max_expand_ratio "
                            f"{self.expand.max_expand_ratio} expands a {height}×{width} image to "
                            f"{big_h}×{big_w}, more than an image can hold; lower it")  # fmt: skip
        h_off = int(np.floor(_F(rng.uniform(0, big_h - height))))
        w_off = int(np.floor(_F(rng.uniform(0, big_w - width))))
        box = np.array([-w_off / width, -h_off / height, (big_w - w_off) / width,
                        (big_h - h_off) / height], _F)  # fmt: skip
        return (big_h, big_w, h_off, w_off), big_h, big_w, self._annotate(boxes, box)

    def _sample(self, rng, height, width, boxes):
        kept = batch_samples(self.samplers, boxes.boxes, rng) if self.samplers else []
        if not kept:
            return None, height, width, boxes
        box = clip(kept[int(rng.integers(len(kept)))])
        x0, y0 = box[0] * _F(width), box[1] * _F(height)
        x1, y1 = box[2] * _F(width), box[3] * _F(height)
        crop = (int(y0), int(x0), int(y1 - y0), int(x1 - x0))
        return crop, crop[2], crop[3], self._annotate(boxes, box)

    def plan(self, rng: np.random.Generator, shape: tuple[int, int, int], boxes: Boxes,
             encoded: bool) -> tuple[Recipe, Boxes]:  # fmt: skip
        """Draw an item's random choices (``shape``: its C×H×W) and transform its boxes."""
        distort, channels = (), None
        if self.distort is not None and encoded:
            distort, channels = self._distort_draws(rng)
        _, height, width = shape
        expand = None
        if self.expand is not None:
            expand, height, width, boxes = self._expand(rng, height, width, boxes)
        crop, height, width, boxes = self._sample(rng, height, width, boxes)
        mirror = self.mirror and bool(rng.integers(2))
        interp = cv2.INTER_LINEAR
        if self.resize is not None and len(self.resize.interp_mode):
            modes = self.resize.interp_mode
            interp = INTERP[modes[min(int(rng.uniform() * len(modes)), len(modes) - 1)]]
        new_h, new_w = self.resized_size(height, width)
        out_h, out_w = self.crop_hw[0] or new_h, self.crop_hw[1] or new_w
        h_off = w_off = 0
        if self.crop_hw[0] and self.phase == "TRAIN":
            h_off, w_off = (
                int(rng.integers(new_h - out_h + 1)),
                int(rng.integers(new_w - out_w + 1)),
            )
        elif self.crop_hw[0]:
            h_off, w_off = (new_h - out_h) // 2, (new_w - out_w) // 2
        if self.resize is not None:
            boxes = boxes.with_boxes(resize_boxes(self.resize, width, height, boxes.boxes))
        final = np.array([w_off / new_w, h_off / new_h, (w_off + out_w) / new_w,
                          (h_off + out_h) / new_h], _F)  # fmt: skip
        boxes = self._annotate(boxes, final)
        if mirror:
            flipped = boxes.boxes.copy()
            flipped[:, 0], flipped[:, 2] = 1 - boxes.boxes[:, 2], 1 - boxes.boxes[:, 0]
            boxes = boxes.with_boxes(flipped)
        recipe = Recipe(distort, channels, expand, crop, interp, (h_off, w_off), mirror)
        return recipe, boxes

    def _resize(self, hwc: np.ndarray, interp: int) -> np.ndarray:
        """``ApplyResize``: WARP, FIT_LARGE_SIZE_AND_PAD or FIT_SMALL_SIZE (H×W×C in, out)."""
        p, channels = self.resize, hwc.shape[2]
        height, width = hwc.shape[:2]
        new_h, new_w = int(p.height), int(p.width)
        aspect, new_aspect = _F(width) / _F(height), _F(new_w) / _F(new_h)
        if p.resize_mode == RP.FIT_SMALL_SIZE:
            new_h, new_w = self.resized_size(height, width)
        elif p.resize_mode == RP.FIT_LARGE_SIZE_AND_PAD:
            values = list(p.pad_value) or [0.0]
            pad = tuple((values * 3)[:3] if len(values) == 1 else values[:3]) + (0.0,)
            if aspect > new_aspect:
                inner = int(np.floor(_F(new_w) / aspect))
                out = cv2.resize(hwc, (new_w, inner), interpolation=interp)
                top = (new_h - inner) // 2
                out = cv2.copyMakeBorder(out, top, new_h - inner - top, 0, 0,
                                         PAD[p.pad_mode], value=pad)  # fmt: skip
            else:
                inner = int(np.floor(aspect * _F(new_h)))
                out = cv2.resize(hwc, (inner, new_h), interpolation=interp)
                left = (new_w - inner) // 2
                out = cv2.copyMakeBorder(out, 0, 0, left, new_w - inner - left,
                                         PAD[p.pad_mode], value=pad)  # fmt: skip
            return out.reshape(new_h, new_w, channels)
        return cv2.resize(hwc, (new_w, new_h), interpolation=interp).reshape(new_h, new_w, -1)

    def apply(self, image: np.ndarray, recipe: Recipe, out: np.ndarray) -> None:
        """Transform one C×H×W image by its ``recipe`` into its float32 row ``out``."""
        hwc = np.ascontiguousarray(image.transpose(1, 2, 0))
        channels = hwc.shape[2]
        if recipe.distort or recipe.channels is not None:
            if channels != 3:
                raise DataError(f"{self.where}: distort_param needs 3-channel images, got "
                                f"{channels}")  # fmt: skip
            hwc = _distort(hwc, recipe)
        if recipe.expand is not None:
            big_h, big_w, h_off, w_off = recipe.expand
            canvas = np.zeros((big_h, big_w, channels), hwc.dtype)
            if len(self.mean_values):
                canvas[...] = _saturate(np.broadcast_to(self.mean_values, (channels,)))
            canvas[h_off : h_off + hwc.shape[0], w_off : w_off + hwc.shape[1]] = hwc
            hwc = canvas
        if recipe.crop is not None:
            y, x, h, w = recipe.crop
            hwc = np.ascontiguousarray(hwc[y : y + h, x : x + w])
        if self.resize is not None:
            hwc = self._resize(hwc, recipe.interp)
        c, h, w = out.shape
        h_off, w_off = recipe.offsets
        if (
            hwc.shape[0] < h_off + h
            or hwc.shape[1] < w_off + w
            or (not self.crop_hw[0] and hwc.shape[:2] != (h, w))
        ):
            raise DataError(f"{self.where}: an item of {hwc.shape[0]}×{hwc.shape[1]} differs "
                            f"from the first item's {h}×{w} (a batch has one shape)")  # fmt: skip
        view = hwc[h_off : h_off + h, w_off : w_off + w].transpose(2, 0, 1)
        if recipe.mirror:
            view = view[:, :, ::-1]
        if self.mean is not None:  # the fork's cv path: the mean at the output position
            np.subtract(view, self.mean[:, h_off : h_off + h, w_off : w_off + w], out=out)
        elif len(self.mean_values):
            np.subtract(view, np.broadcast_to(self.mean_values, (c,))[:, None, None], out=out)
        else:
            out[...] = view
        if self.scale != 1:
            np.multiply(out, self.scale, out=out)
