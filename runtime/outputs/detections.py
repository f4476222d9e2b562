"""Detections a user can read: class, score and box in image pixels, from a detector net.

Two kinds of detector nets:

* nets ending in a detection layer (SSD's DetectionOutput, eric612's YoloDetectionOutput /
  Yolov3DetectionOutput): their (1, 1, K, 7) top holds rows [image, label, score, xmin, ymin,
  xmax, ymax] in coordinates normalized to the input; rows with label −1 are padding or the
  forks' "no detection" rows. :func:`from_detection_output` scales them to pixels.
* Faster R-CNN / R-FCN test nets (rois from the RPN proposal layer, ``cls_prob``,
  ``bbox_pred``): the boxes are decoded outside the net, as py-faster-rcnn's
  lib/fast_rcnn/test.py ``im_detect`` + ``test_net`` do: rois / im_scale,
  ``bbox_transform_inv`` with each class's deltas (R-FCN's class-agnostic 8-column deltas: the
  foreground 4), clipped to the image, per class scores > threshold (0.05), NMS 0.3, at most
  100 per image. :func:`from_rcnn` does that (box maths: :mod:`.boxes`).

:func:`detect` runs a compiled net on one image (BGR, H×W×3 uint8, as cv2.imread gives it):
resized to the net's input (Faster R-CNN nets with an ``im_info`` input: shorter side 600,
longer at most 1000, as py-faster-rcnn's TEST.SCALES / TEST.MAX_SIZE), ``(pixel − mean) ·
scale`` per channel (BGR order; ``swap_rb`` feeds RGB), then the decoded detections.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from caffe2jax.frontend.errors import DataError, NetError
from caffe2jax.runtime.outputs.boxes import decode_deltas, nms

DETECTION_TYPES = ("DetectionOutput", "YoloDetectionOutput", "Yolov3DetectionOutput")


@dataclass(frozen=True)
class Detection:
    """One detection: the image's index in the batch, the class label (the net's own
    numbering: SSD's background is 0, YOLO's first class is 1), its name when a label list was
    given, the score, and the box corners in pixels of the image given."""

    image: int
    label: int
    score: float
    xmin: float
    ymin: float
    xmax: float
    ymax: float
    name: str = ""

    def __str__(self) -> str:
        name = self.name or str(self.label)
        return (
            f"{self.image} {self.label} {name} {self.score:.4f} {self.xmin:.1f} "
            f"{self.ymin:.1f} {self.xmax:.1f} {self.ymax:.1f}"
        )


def _name(names: Sequence[str] | None, label: int) -> str:
    return names[label] if names is not None and 0 <= label < len(names) else ""


def from_detection_output(
    top: Any, width: float, height: float, threshold: float = 0.0, names=None
) -> list[Detection]:
    """The rows of a (1, 1, K, 7) detection top with label ≥ 0 and score ≥ ``threshold``,
    boxes scaled from normalized coordinates to a ``width`` × ``height`` image, in the
    layer's order."""
    rows = np.asarray(top, np.float64).reshape(-1, 7)
    out = []
    for image, label, score, x1, y1, x2, y2 in rows:
        if label < 0 or score < threshold:
            continue
        out.append(Detection(int(image), int(label), float(score), x1 * width, y1 * height,
                             x2 * width, y2 * height, _name(names, int(label))))  # fmt: skip
    return out


def from_rcnn(
    rois, cls_prob, bbox_pred, im_scale: float, width: int, height: int,
    threshold: float = 0.05, nms_threshold: float = 0.3, max_per_image: int = 100, names=None,
) -> list[Detection]:  # fmt: skip
    """py-faster-rcnn's test-time decoding of one image (module docstring). All-zero roi
    rows are the proposal layer's padding (caffe2jax's static top) and are skipped."""
    rois = np.asarray(rois, np.float64).reshape(-1, 5)
    real = np.any(rois[:, 1:] != 0, axis=1)
    scores = np.asarray(cls_prob, np.float64).reshape(len(rois), -1)[real]
    deltas = np.asarray(bbox_pred, np.float64).reshape(len(rois), -1)[real]
    classes = scores.shape[1]
    boxes = decode_deltas(rois[real, 1:] / im_scale, deltas)
    boxes[:, 0::4] = np.clip(boxes[:, 0::4], 0, width - 1)
    boxes[:, 2::4] = np.clip(boxes[:, 2::4], 0, width - 1)
    boxes[:, 1::4] = np.clip(boxes[:, 1::4], 0, height - 1)
    boxes[:, 3::4] = np.clip(boxes[:, 3::4], 0, height - 1)
    found = []
    for j in range(1, classes):
        cols = slice(4 * j, 4 * j + 4) if boxes.shape[1] == 4 * classes else slice(4, 8)
        inds = np.where(scores[:, j] > threshold)[0]
        b, s = boxes[inds, cols], scores[inds, j]
        found += [(s[k], j, b[k]) for k in nms(b, s, nms_threshold)]
    if max_per_image > 0 and len(found) > max_per_image:
        cut = sorted((f[0] for f in found), reverse=True)[max_per_image - 1]
        found = [f for f in found if f[0] >= cut]
    return [Detection(0, j, float(s), *map(float, b), name=_name(names, j)) for s, j, b in found]


def _image_input(model) -> str:
    """The net's image input: the first 4-D input with 3 channels (else the first 4-D)."""
    four = [k for k, s in model.inputs.items() if len(s) == 4]
    colour = [k for k in four if model.inputs[k][1] == 3]
    if not four:
        raise NetError(f"net '{model.net.name}' has no 4-D image input")
    return (colour or four)[0]


def prepare(image: np.ndarray, height: int, width: int, mean, scale, swap_rb) -> np.ndarray:
    """(1, 3, height, width) float32 blob of a BGR H×W×3 image (cv2.resize INTER_LINEAR)."""
    import cv2

    if image.ndim != 3 or image.shape[2] != 3:
        raise DataError(f"expected an H×W×3 BGR image, got shape {list(image.shape)}")
    resized = cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)
    pixels = resized.astype(np.float32)
    if swap_rb:
        pixels = pixels[..., ::-1]
    pixels = (pixels - np.asarray(mean, np.float32)) * np.float32(scale)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1)[None])


def checked_image(image) -> np.ndarray:
    """``image`` as an H×W×3 array with H, W ≥ 1 (a DataError saying what it is otherwise)."""
    if image is None or not hasattr(image, "shape"):
        raise DataError(f"expected an H×W×3 BGR image array, got {type(image).__name__}")
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or min(image.shape[:2]) < 1:
        raise DataError(f"expected an H×W×3 BGR image with H, W >= 1, got shape "
                        f"{list(image.shape)}")  # fmt: skip
    return image


def checked_mean(mean) -> tuple[float, float, float]:
    """A per-channel mean: one value or three (B, G, R), finite."""
    try:
        values = [float(v) for v in np.ravel(np.asarray(mean, np.float64))]
    except (TypeError, ValueError):
        raise DataError(f"mean takes one number or three (B, G, R), got {mean!r}") from None
    if len(values) not in (1, 3) or not all(np.isfinite(values)):
        raise DataError(f"mean takes one finite value or three (B, G, R), got {values}")
    return tuple(values * 3 if len(values) == 1 else values)  # type: ignore[return-value]


def _rcnn_size(h: int, w: int, target: int = 600, max_size: int = 1000) -> tuple[float, int, int]:
    """py-faster-rcnn's _get_image_blob scale: shorter side ``target``, longer ≤ ``max_size``."""
    scale = target / min(h, w)
    if round(scale * max(h, w)) > max_size:
        scale = max_size / max(h, w)
    return scale, int(round(h * scale)), int(round(w * scale))


def detect(
    model, params: Mapping, state: Mapping, image: np.ndarray, *, mean=(0.0, 0.0, 0.0),
    scale: float = 1.0, swap_rb: bool = False, threshold: float = 0.0, names=None,
) -> list[Detection]:  # fmt: skip
    """Run a detector net on one BGR image and decode its detections (module docstring)."""
    image, mean = checked_image(image), checked_mean(mean)
    h, w = image.shape[:2]
    key = _image_input(model)
    if "im_info" in model.inputs:
        im_scale, nh, nw = _rcnn_size(h, w)
        model = model.reshape({key: (1, 3, nh, nw)})
        inputs = {key: prepare(image, nh, nw, mean, scale, swap_rb)}
        inputs["im_info"] = np.array([[nh, nw, im_scale]], np.float32).reshape(
            model.inputs["im_info"]
        )
        blobs = model.apply(params, state, inputs)[0]
        missing = [b for b in ("rois", "cls_prob", "bbox_pred") if b not in blobs]
        if missing:
            raise NetError(f"net '{model.net.name}' has im_info but no blob(s) {missing}")
        return from_rcnn(blobs["rois"], blobs["cls_prob"], blobs["bbox_pred"], im_scale, w, h,
                         threshold=max(threshold, 0.05), names=names)  # fmt: skip
    tops = [layer.tops[0] for layer in model.net.layers if layer.type in DETECTION_TYPES]
    if not tops:
        kinds = ", ".join(DETECTION_TYPES)
        raise NetError(f"net '{model.net.name}' has no detection layer ({kinds}) and no "
                       "im_info input (Faster R-CNN / R-FCN)")  # fmt: skip
    _, _, nh, nw = model.inputs[key]
    blobs = model.apply(params, state, {key: prepare(image, nh, nw, mean, scale, swap_rb)})[0]
    return from_detection_output(blobs[tops[-1]], w, h, threshold, names)
