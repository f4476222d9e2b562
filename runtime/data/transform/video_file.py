"""C3D's ``ReadVideoToVolumeDatum`` (C3D v1.0/v1.1 util/image_io.cpp): a clip read from a video
file through OpenCV's ``VideoCapture``, for ``VideoData`` with ``use_image: false``.

As C3D: the file must have at least ``length × rate`` frames (``CAP_PROP_FRAME_COUNT``); a
start of ``None`` (temporal jitter) is drawn as ``Rand(count − length·rate + 1)``; a non-zero
start seeks (``CAP_PROP_POS_FRAMES``), and with ``rate > 1`` every frame is sought before it
is read; each frame (BGR) is resized bilinearly to ``height`` × ``width`` when both are set.
Which frames a codec returns after a seek is OpenCV's (and its FFmpeg's) business, as in C3D.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.transform.image import resize


def _cv2():
    try:
        import cv2
    except ImportError:
        raise DataError(
            "VideoData with use_image: false reads video files through OpenCV: install "
            "opencv-python-headless, or extract the frames and set use_image: true"
        ) from None
    return cv2


def read_video_clip(
    path: Path,
    start: int | None,
    length: int,
    rate: int,
    size: tuple[int, int],
    draw: Callable[[int], int],
    where: str,
) -> np.ndarray:
    """``length`` frames of the video at ``path``, every ``rate``-th from ``start`` (``None``:
    ``draw(count − length·rate + 1)``), as uint8 (3, length, H, W)."""
    cv2 = _cv2()
    cap = cv2.VideoCapture(str(path))
    try:
        if not cap.isOpened():
            raise DataError(f"{where}: cannot open video {path}")
        count, need = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), length * rate
        if count < need:
            raise DataError(f"{where}: {path} has {count} frames, a clip needs {need}")
        start = draw(count - need + 1) if start is None else start
        if start:
            cap.set(cv2.CAP_PROP_POS_FRAMES, start)
        frames = []
        for i in range(start, start + need, rate):
            if rate > 1:
                cap.set(cv2.CAP_PROP_POS_FRAMES, i)
            ok, frame = cap.read()
            if not ok or frame is None:
                raise DataError(f"{where}: {path} has no data at frame {i}")
            chw = np.ascontiguousarray(frame.transpose(2, 0, 1))
            frames.append(resize(chw, *size) if size[0] > 0 else chw)
        return np.stack(frames, axis=1)
    finally:
        cap.release()
