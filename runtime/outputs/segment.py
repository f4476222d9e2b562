"""Label maps from a segmentation net's scores (SegNet, ENet, PSPNet, DeepLab…).

A segmenter's last blob holds per-class scores (N, K, H, W) (a Softmax or the raw scores: the
argmax is the same). Its label map is the class with the highest score at each pixel, the
first class on a tie (NumPy's argmax, as the forks' ArgMax layer and their scripts take it)::

    import caffe2jax
    net = caffe2jax.Net("enet_deploy.prototxt", caffe2jax.TEST, weights="enet.caffemodel")
    net.blobs["data"].data[...] = image
    scores = net.forward()["deconv6_0_0"]
    labels = caffe2jax.label_map(scores)          # (N, H, W) int32, one class id per pixel

``prepare_image`` turns an image file into the net's input as Caffe's scripts do (BGR, resized
to the input's height and width, mean subtracted, then scaled), for ``caffe2jax segment``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from caffe2jax.frontend.errors import DataError


def label_map(scores, axis: int = 1) -> np.ndarray:
    """The class id (int32) of the highest score along ``axis`` (the channels): (N, K, H, W)
    scores give an (N, H, W) map, (K, H, W) an (H, W) one."""
    scores = np.asarray(scores)
    if scores.ndim not in (3, 4):
        raise DataError(
            f"label_map needs scores of shape (N, classes, H, W) or (classes, H, W), got "
            f"{list(scores.shape)}"
        )
    axis = axis if scores.ndim == 4 or axis != 1 else 0
    if not -scores.ndim <= axis < scores.ndim or scores.shape[axis] < 1:
        raise DataError(f"label_map: no class axis {axis} in scores of shape {list(scores.shape)}")
    if not np.all(np.isfinite(scores)):
        raise DataError("label_map: the scores hold NaN or infinity (check the net's weights)")
    return np.argmax(scores, axis=axis).astype(np.int32)


def class_counts(labels: np.ndarray) -> dict[int, int]:
    """Pixels per class id present in ``labels``, by class id."""
    ids, counts = np.unique(labels, return_counts=True)
    return {int(i): int(c) for i, c in zip(ids, counts)}


def prepare_image(path: str, shape: Sequence[int], mean: Sequence[float] = (),
                  scale: float = 1.0) -> np.ndarray:  # fmt: skip
    """The image at ``path`` as one (1, C, H, W) float32 input of ``shape`` (N, C, H, W): read
    as BGR (grey for C = 1), resized bilinearly to (H, W), ``mean`` (one value or one per
    channel) subtracted, times ``scale``."""
    import cv2

    if len(shape) != 4 or shape[1] not in (1, 3):
        raise DataError(f"segment needs an image input (N, 1 or 3, H, W), got {list(shape)}")
    flag = cv2.IMREAD_GRAYSCALE if shape[1] == 1 else cv2.IMREAD_COLOR
    with open(path, "rb") as f:  # a missing file: the OSError the CLI prints in one line
        image = cv2.imdecode(np.frombuffer(f.read(), np.uint8), flag)
    if image is None:
        raise DataError(f"{path}: not an image file OpenCV can read")
    image = cv2.resize(image, (shape[3], shape[2]), interpolation=cv2.INTER_LINEAR)
    chw = image.reshape(shape[2], shape[3], -1).transpose(2, 0, 1).astype(np.float32)
    if len(mean) not in (0, 1, shape[1]):
        raise DataError(f"--mean takes 1 or {shape[1]} values, got {len(mean)}")
    if mean:
        chw -= np.asarray(mean, np.float32).reshape(-1, 1, 1)
    return (chw * np.float32(scale))[None]


def write_label_map(path: str, labels: np.ndarray) -> None:
    """``labels`` (H, W) as a PNG of class ids (8-bit when they fit, else 16-bit)."""
    import cv2

    if labels.min(initial=0) < 0 or labels.max(initial=0) > 65535:
        raise DataError(f"{path}: class ids outside 0..65535 do not fit a PNG")
    dtype = np.uint8 if labels.max(initial=0) < 256 else np.uint16
    if not cv2.imwrite(str(path), labels.astype(dtype)):
        raise DataError(f"{path}: could not write the label map (a .png path?)")
