"""pycaffe's ``caffe.Detector``: R-CNN style windowed detection with a TEST-phase Net.

``detect_windows([(image_file, windows), ...])`` crops every window (ymin, xmin, ymax,
xmax) out of its image, warps it to the net's input size through the Transformer and returns
one ``{"filename", "window", "prediction"}`` dict per window, in order. With ``context_pad``
each crop takes that many pixels of surrounding context (at the net's input scale), padding
what falls outside the image with the mean, as pycaffe's ``crop`` does. Selective search
proposals (a MATLAB tool in pycaffe) are not produced here: give the windows.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from caffe2jax.frontend.errors import CaffeError
from caffe2jax.pycaffe import io
from caffe2jax.pycaffe.classifier import make_transformer
from caffe2jax.pycaffe.net import TEST, Net


class Detector(Net):
    """``Detector(model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None,
    channel_swap=None, context_pad=None)``."""

    def __init__(
        self,
        model_file: str | os.PathLike,
        pretrained_file: str | os.PathLike | None,
        mean: np.ndarray | None = None,
        input_scale: float | None = None,
        raw_scale: float | None = None,
        channel_swap: Sequence[int] | None = None,
        context_pad: int | None = None,
    ):
        super().__init__(model_file, TEST, weights=pretrained_file)
        self.transformer = make_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows: Iterable[tuple[str, Sequence[Any]]]) -> list[dict]:
        """Predictions for every window of every image (see the module docstring)."""
        images_windows = [(name, [np.asarray(w) for w in ws]) for name, ws in images_windows]
        crops = []
        for filename, windows in images_windows:
            image = io.load_image(filename).astype(np.float32)
            crops += [self.crop(image, window) for window in windows]
        if not crops:
            return []
        name = self.inputs[0]
        caffe_in = np.stack([self.transformer.preprocess(name, crop) for crop in crops])
        predictions = self.forward_all(**{name: caffe_in})[self.outputs[0]]
        detections, k = [], 0
        for filename, windows in images_windows:
            for window in windows:
                detections.append(
                    {"window": window, "prediction": predictions[k], "filename": filename}
                )
                k += 1
        return detections

    def detect_selective_search(self, image_fnames: Sequence[str]) -> list[dict]:
        """Not available: pycaffe runs MATLAB selective search; pass windows to
        :meth:`detect_windows` instead."""
        raise CaffeError(
            "detect_selective_search needs the MATLAB selective_search_ijcv_with_python tool, "
            "which caffe2jax does not run; compute windows yourself and call detect_windows"
        )

    def crop(self, im: np.ndarray, window: Sequence[float]) -> np.ndarray:
        """The window (ymin, xmin, ymax, xmax) of an H×W×K image, with ``context_pad``
        pixels of context around it (mean-padded outside the image) when configured."""
        window = np.asarray(window)
        y0, x0, y1, x1 = (int(v) for v in window)
        if not self.context_pad:
            return im[y0:y1, x0:x1]
        size = self.blobs[self.inputs[0]].data.shape[3]  # square inputs, as pycaffe assumes
        scale = size / (1.0 * size - self.context_pad * 2)
        half_h, half_w = (y1 - y0 + 1) / 2.0, (x1 - x0 + 1) / 2.0
        center = np.array((y0 + half_h, x0 + half_w))
        box = np.round(np.tile(center, 2) + scale * np.array((-half_h, -half_w, half_h, half_w)))
        scale_h = size / (box[2] - box[0] + 1)
        scale_w = size / (box[3] - box[1] + 1)
        pad_y = round(max(0, -box[0]) * scale_h)
        pad_x = round(max(0, -box[1]) * scale_w)
        im_h, im_w = im.shape[:2]
        box = np.clip(box, 0.0, [im_h, im_w, im_h, im_w])
        clip_h, clip_w = box[2] - box[0] + 1, box[3] - box[1] + 1
        if clip_h <= 0 or clip_w <= 0:
            raise CaffeError(f"window {list(window)} lies outside the {im_h}×{im_w} image")
        crop_h = min(round(clip_h * scale_h), size - pad_y)
        crop_w = min(round(clip_w * scale_w), size - pad_x)
        b = box.astype(int)
        context = io.resize_image(im[b[0] : b[2], b[1] : b[3]], (crop_h, crop_w))
        out = np.ones(self.crop_dims, np.float32) * self.crop_mean
        out[pad_y : pad_y + crop_h, pad_x : pad_x + crop_w] = context
        return out

    def configure_crop(self, context_pad: int | None) -> None:
        """Crop size (the net's input, H×W×K) and, with context padding, the mean in the
        unprocessed image space that fills padding."""
        name = self.inputs[0]
        transpose = self.transformer.transpose[name]
        self.crop_dims = np.array(self.blobs[name].data.shape[1:])[list(np.argsort(transpose))]
        self.context_pad = context_pad
        if not context_pad:
            return
        mean = self.transformer.mean.get(name)
        if mean is None:
            self.crop_mean = np.zeros(self.crop_dims, np.float32)
            return
        crop_mean = np.broadcast_to(mean, self.blobs[name].data.shape[1:])
        crop_mean = crop_mean.transpose(np.argsort(transpose)).astype(np.float32)
        swap = self.transformer.channel_swap.get(name)
        if swap is not None:
            crop_mean = crop_mean[:, :, list(np.argsort(swap))]
        raw_scale = self.transformer.raw_scale.get(name)
        if raw_scale is not None:
            crop_mean = crop_mean / raw_scale
        self.crop_mean = crop_mean
