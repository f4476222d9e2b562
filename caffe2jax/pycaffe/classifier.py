"""pycaffe's ``caffe.Classifier``: a TEST-phase Net that classifies images.

``predict(images, oversample=True)`` resizes each H×W×K image to ``image_dims``, takes the
ten oversampled crops (four corners, center, and their mirrors) of the net's input size, or
only the center crop, preprocesses them with the :class:`caffe2jax.pycaffe.io.Transformer`
(transpose to K×H×W, channel swap, raw scale, mean, input scale), runs them through the net a
batch at a time and returns the first output per image (averaged over the ten crops).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from caffe2jax.pycaffe import io
from caffe2jax.pycaffe.net import TEST, Net


def make_transformer(
    net: Net,
    mean: np.ndarray | None,
    input_scale: float | None,
    raw_scale: float | None,
    channel_swap: Sequence[int] | None,
) -> io.Transformer:
    """The Transformer of the net's first input with pycaffe's Classifier/Detector options."""
    name = net.inputs[0]
    transformer = io.Transformer({name: net.blobs[name].data.shape})
    transformer.set_transpose(name, (2, 0, 1))
    if mean is not None:
        transformer.set_mean(name, mean)
    if input_scale is not None:
        transformer.set_input_scale(name, input_scale)
    if raw_scale is not None:
        transformer.set_raw_scale(name, raw_scale)
    if channel_swap is not None:
        transformer.set_channel_swap(name, channel_swap)
    return transformer


class Classifier(Net):
    """``Classifier(model_file, pretrained_file, image_dims=None, mean=None,
    input_scale=None, raw_scale=None, channel_swap=None)``."""

    def __init__(
        self,
        model_file: str | os.PathLike,
        pretrained_file: str | os.PathLike | None,
        image_dims: Sequence[int] | None = None,
        mean: np.ndarray | None = None,
        input_scale: float | None = None,
        raw_scale: float | None = None,
        channel_swap: Sequence[int] | None = None,
    ):
        super().__init__(model_file, TEST, weights=pretrained_file)
        self.transformer = make_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.crop_dims = np.array(self.blobs[self.inputs[0]].data.shape[2:])
        self.image_dims = tuple(image_dims) if image_dims is not None else tuple(self.crop_dims)

    def predict(self, inputs: Sequence[np.ndarray], oversample: bool = True) -> np.ndarray:
        """Class scores (the net's first output) for each H×W×K image in ``inputs``."""
        height, width = int(self.image_dims[0]), int(self.image_dims[1])
        images = np.stack([io.resize_image(np.asarray(im, np.float32), (height, width))
                           for im in inputs])  # fmt: skip
        if oversample:
            crops = io.oversample(images, self.crop_dims)
        else:
            ch, cw = (int(d) for d in self.crop_dims)
            y, x = int(height / 2.0 - ch / 2.0), int(width / 2.0 - cw / 2.0)
            crops = images[:, y : y + ch, x : x + cw, :]
        name = self.inputs[0]
        caffe_in = np.stack([self.transformer.preprocess(name, crop) for crop in crops])
        predictions = self.forward_all(**{name: caffe_in})[self.outputs[0]]
        if oversample:
            predictions = predictions.reshape(len(predictions) // 10, 10, -1).mean(axis=1)
        return predictions
