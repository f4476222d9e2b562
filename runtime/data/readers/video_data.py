"""C3D's ``VideoData`` layer (C3D v1.1 video_data_layer.cpp, ``ReadImageSequenceToVolumeDatum``
and ``DataTransformer::VideoTransform``; C3D v1.0's V1 ``VIDEO_DATA``, form ``"c3d-v1.0"``,
whose settings the frontend moves to ``video_data_param``/``transform_param``): clips of
``new_length`` frames, (N, 3, L, H, W), and their labels.

The list (``source``) has one clip a line: ``folder start_frame label`` (with
``use_temporal_jitter`` and frame folders, the second number is the folder's frame count and
the start is drawn: ``Rand(count − L·rate + 1) + 1`` in TRAIN, 0 in TEST). Frame ``i`` is
``root_folder + folder + "/%06d.jpg" % i``, for ``i = start, start + rate, …`` (``rate`` =
``sampling_rate``, or ``Rand(max_sampling_rate) + 1`` per clip with
``use_sampling_rate_jitter``), read in colour (BGR) and resized bilinearly to ``new_height`` ×
``new_width`` when set. With ``use_multiple_label`` the label token is ``a,b,c`` and the label
top is (N, ``num_of_labels``), 1 at each listed class. The clip list is shuffled like
ImageData's (``shuffle``, ``rand_skip``).

The transform crops every frame of a clip at one offset (``crop_size``: ``Rand(H − crop + 1)``
in TRAIN — C3D v1.0: ``Rand(H − crop)`` —, the centre in TEST), mirrors the clip at random
(``mirror``; v1.0 only together with a crop) and writes ``(pixel − mean) × scale``, the mean
being ``mean_file``'s (1, 3, L, H, W) value at the pixel's source position or
``mean_value[c]``. C3D v1.0's mean file is a v1.0 (5-D) BlobProto.

Not reproduced: C3D skips a clip it cannot read in TRAIN (here: an error naming the frame, as
C3D's TEST phase does). Video files (``use_image: false``: ``file start_frame label``
lines, or ``file label`` with temporal jitter, whose start is then drawn in both phases) are
read through OpenCV's ``VideoCapture`` (:mod:`.video_file`). Draws are hashed from the
reader's key and the clip's position, not Caffe's RNG stream.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import Planned, check_phase, check_tops, positive_batch_size
from caffe2jax.runtime.data.files import resolve_input
from caffe2jax.runtime.data.readers import reader
from caffe2jax.runtime.data.readers.pair_list import PairListSource
from caffe2jax.runtime.data.transform.image import read_image
from caffe2jax.runtime.data.transform.transformer import uniform_ints
from caffe2jax.runtime.data.transform.video_file import read_video_clip
from caffe2jax.runtime.formats.blobproto import Scanner, WireError, read_blob

_F = np.float32


@dataclass(frozen=True)
class Clip:
    """One line of a clip list: the folder (or video file), the start frame (or the frame
    count, with temporal jitter; None for a video file with jitter), the labels, the line."""

    path: str
    start: int | None
    labels: tuple[int, ...]
    line: int


def parse_clip_list(path: Path, with_start: bool, multiple: bool) -> list[Clip]:
    """Read a clip list, one ``path [start] label`` line per clip (``label`` ``a,b,c`` with
    ``multiple``); a malformed line is an error naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as err:
        raise DataError(f"{path}: cannot read clip list ({err.strerror})") from err
    clips, want = [], 3 if with_start else 2
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words:
            continue
        try:
            if len(words) != want:
                raise ValueError
            labels = tuple(int(v) for v in words[-1].split(",")) if multiple else (int(words[-1]),)
            clips.append(Clip(words[0], int(words[1]) if with_start else None, labels, number))
        except ValueError:
            form = "'folder start_frame label'" if with_start else "'file label'"
            raise DataError(f"{path}:{number}: expected {form}, got {line.strip()!r}") from None
    if not clips:
        raise DataError(f"{path}: clip list is empty")
    return clips


def read_volume_mean(path: Path) -> np.ndarray:
    """A C3D mean file as (C, L, H, W) float32: a BVLC BlobProto of shape (1, C, L, H, W)
    (C3D v1.1) or a C3D v1.0 5-D BlobProto."""
    try:
        data = path.read_bytes()
        blob = read_blob(Scanner(io.BytesIO(data), len(data)), 0, len(data))
    except OSError as err:
        raise DataError(f"{path}: cannot read mean file ({err.strerror})") from err
    except WireError as err:
        raise DataError(f"{path}: not a BlobProto ({err})") from err
    if len(blob.dims) != 5 or blob.dims[0] != 1 or blob.count != blob.values.size:
        raise DataError(
            f"{path}: a clip mean must be a (1, C, L, H, W) blob, got "
            f"{list(blob.dims)} with {blob.values.size} values"
        )
    return blob.values.astype(_F).reshape(blob.dims[1:])


@reader("VideoData")
class VideoDataSource(PairListSource):
    """C3D's ``VideoData`` layer."""

    def __init__(
        self,
        layer: caffe_pb2.LayerParameter,
        phase: str,
        *,
        base_dir: Path | None = None,
        seed: int | None = None,
        form: str = "",
    ) -> None:
        if form == "ssd":
            raise DataError(
                f"layer {layer.name!r}: SSD's VideoData (a webcam or a video file) is not supported"
            )
        check_tops(layer, (2,))
        p, t = layer.video_data_param, layer.transform_param
        self.name, self.phase, self.v10 = layer.name, check_phase(phase), form == "c3d-v1.0"
        self._check(layer, p, t)
        self.p, self.batch_size = p, positive_batch_size(p.batch_size, layer)
        self.length, self.size = int(p.new_length), (int(p.new_height), int(p.new_width))
        self.crop, self.mirror, self.scale = int(t.crop_size), t.mirror, _F(t.scale)
        self.jitter = p.use_temporal_jitter
        with_start, multiple = p.use_image or not p.use_temporal_jitter, p.use_multiple_label
        self._open_list(
            p.source,
            p.root_folder,
            base_dir,
            seed,
            p.shuffle,
            p.rand_skip,
            lambda path: parse_clip_list(path, with_start, multiple),
        )
        self._means(t, base_dir)
        self.item_shape = self._read(self.first(), np.array([self.position])).shape
        self._check_shapes()
        out = (self.crop, self.crop) if self.crop else self.item_shape[2:]
        labels = (int(p.num_of_labels),) if p.use_multiple_label else ()
        self._shapes = [(self.batch_size, 3, self.length, *out), (self.batch_size, *labels)]

    def _check(self, layer: caffe_pb2.LayerParameter, p, t) -> None:
        where = f"layer {layer.name!r} (VideoData)"
        if p.new_length <= 0:
            raise DataError(f"{where}: new_length (frames per clip) must be positive")
        if (p.new_height > 0) != (p.new_width > 0):
            raise DataError(f"{where}: new_height and new_width must be set at the same time")
        if p.sampling_rate <= 0 or (p.use_sampling_rate_jitter and p.max_sampling_rate <= 0):
            raise DataError(f"{where}: sampling_rate and max_sampling_rate must be positive")
        if p.use_multiple_label and not p.HasField("num_of_labels"):
            raise DataError(
                f"{where}: number of labels must be set together with use multiple labels"
            )
        if self.v10 and t.mirror and not t.crop_size:
            raise DataError(
                f"{where}: C3D v1.0 requires mirror and crop_size to be set at the same time"
            )

    def _means(self, t: caffe_pb2.TransformationParameter, base_dir: Path | None) -> None:
        if t.HasField("mean_file") and len(t.mean_value):
            raise DataError(
                "transform_param: cannot specify mean_file and mean_value at the same time"
            )
        self.mean = None
        if t.HasField("mean_file"):
            self.mean = read_volume_mean(resolve_input(t.mean_file, base_dir, "mean_file"))
        values = np.asarray(t.mean_value, _F)
        if len(values) not in (0, 1, 3):
            raise DataError(
                f"specify either 1 mean_value or as many as channels: 3 (got {len(values)})"
            )
        self.mean_values = (
            np.broadcast_to(values, (3,))[:, None, None, None] if len(values) else None
        )

    def _check_shapes(self) -> None:
        c, length, h, w = self.item_shape
        where = f"layer {self.name!r} (VideoData)"
        if self.mean is not None and self.mean.shape != self.item_shape:
            raise DataError(
                f"{where}: mean_file has shape {self.mean.shape}, the clips {self.item_shape}"
            )
        if self.crop and (h < self.crop or w < self.crop):
            raise DataError(f"{where}: crop_size {self.crop} is larger than the frames {h}×{w}")
        if self.crop and self.v10 and self.phase == "TRAIN" and min(h, w) == self.crop:
            raise DataError(
                f"{where}: C3D v1.0 draws crops as Rand(H − crop_size), which "
                f"needs frames larger than crop_size {self.crop} ({h}×{w})"
            )

    def _rate(self, position: np.ndarray) -> int:
        """``sampling_rate``, or ``Rand(max_sampling_rate) + 1`` with its jitter."""
        if self.p.use_sampling_rate_jitter:
            return int(uniform_ints(self.key, position, 4, int(self.p.max_sampling_rate))[0]) + 1
        return int(self.p.sampling_rate)

    def _frames(self, clip: Clip, position: np.ndarray, rate: int) -> range:
        """The frame numbers of a frame folder's clip at ``position``."""
        start = int(clip.start)
        if self.jitter:
            count, need = start, self.length * rate
            if count < need:
                raise DataError(
                    f"{self.list_path}:{clip.line}: {clip.path} has {count} frames, "
                    f"a clip needs {need}"
                )
            start = (
                0
                if self.phase == "TEST"
                else int(uniform_ints(self.key, position, 3, count - need + 1)[0]) + 1
            )
        return range(start, start + self.length * rate, rate)

    def _read(self, clip: Clip, position: np.ndarray) -> np.ndarray:
        """A clip as uint8 (3, L, H, W), frame by frame (a frame folder or a video file)."""
        (h, w), rate = self.size, self._rate(position)
        where = f"{self.list_path}:{clip.line}"
        if not self.p.use_image:
            path = resolve_input(self.root + clip.path, self.base_dir, f"{where}: video")
            start = None if self.jitter else int(clip.start)

            def draw(bound: int) -> int:
                return int(uniform_ints(self.key, position, 3, bound)[0])

            return read_video_clip(path, start, self.length, rate, (h, w), draw, where)
        frames = []
        for i in self._frames(clip, position, rate):
            name = f"{self.root}{clip.path}/{i:06d}.jpg"
            frame = read_image(resolve_input(name, self.base_dir, f"{where}: frame"),
                               height=h, width=w)  # fmt: skip
            if frames and frame.shape != frames[0].shape:
                raise DataError(
                    f"{where}: frame {name} is {frame.shape[1]}×{frame.shape[2]}, the "
                    f"clip's first {frames[0].shape[1]}×{frames[0].shape[2]}"
                )
            frames.append(frame)
        return np.stack(frames, axis=1)

    def _offsets(self, position: np.ndarray) -> tuple[int, int]:
        _, _, h, w = self.item_shape
        if not self.crop:
            return 0, 0
        if self.phase == "TEST":
            return (h - self.crop) // 2, (w - self.crop) // 2
        extra = 0 if self.v10 else 1  # v1.0: Rand(H − crop)
        return (
            int(uniform_ints(self.key, position, 1, h - self.crop + extra)[0]),
            int(uniform_ints(self.key, position, 2, w - self.crop + extra)[0]),
        )

    def _transform(self, clip: np.ndarray, position: np.ndarray, out: np.ndarray) -> None:
        """C3D's VideoTransform of one clip into its (3, L, h, w) row."""
        h_off, w_off = self._offsets(position)
        _, _, oh, ow = out.shape
        cut = np.s_[:, :, h_off : h_off + oh, w_off : w_off + ow]
        flip = bool(self.mirror and uniform_ints(self.key, position, 0, 2)[0] == 1)
        view = clip[cut][..., ::-1] if flip else clip[cut]
        if self.mean is not None:
            mean = self.mean[cut]
            np.subtract(view, mean[..., ::-1] if flip else mean, out=out)
        elif self.mean_values is not None:
            np.subtract(view, self.mean_values, out=out)
        else:
            out[...] = view
        if self.scale != 1:
            np.multiply(out, self.scale, out=out)

    def fill(self, planned: Planned, rows: range, out: list[np.ndarray]) -> float:
        """Read and transform each planned clip into its rows, with its label(s)."""
        for row in rows:
            clip, position = planned.records[row], planned.positions[row : row + 1]
            frames = self._read(clip, position)
            if frames.shape != self.item_shape:
                raise DataError(
                    f"{self.list_path}:{clip.line}: clip {clip.path} has shape "
                    f"{frames.shape}, the first {self.item_shape} (set "
                    "new_height/new_width)"
                )
            self._transform(frames, position, out[0][row])
            if self.p.use_multiple_label:
                if max(clip.labels) >= self.p.num_of_labels or min(clip.labels) < 0:
                    raise DataError(
                        f"{self.list_path}:{clip.line}: labels {list(clip.labels)} "
                        f"outside 0..{self.p.num_of_labels - 1} (num_of_labels)"
                    )
                out[1][row] = 0
                out[1][row][list(clip.labels)] = 1
            else:
                out[1][row] = clip.labels[0]
        return 0.0
