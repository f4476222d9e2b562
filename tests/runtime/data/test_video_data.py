"""C3D's VideoData (runtime/data/readers/video_data.py) over folders of %06d.jpg frames: clip shapes
(N, 3, L, H, W), values against a hand computation (one crop and mirror for every frame of a
clip, 5-D mean file at the source position, mean_value, scale), sampling rate, temporal
jitter, multiple labels, C3D v1.0's form (its 5-D BlobProto mean file, Rand(H − crop)),
determinism with worker threads and on resume, and one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import caffe2jax
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import plain
from caffe2jax.runtime.data.prefetch import Prefetcher
from caffe2jax.runtime.data.records.datum import write_blobproto
from caffe2jax.runtime.data.sources import make_source
from caffe2jax.runtime.data.transform.image import read_image
from caffe2jax.runtime.data.transform.transformer import uniform_ints
from tests.forks import FORK_MODELS, c3d_blob

from .helpers import layer

RNG = np.random.default_rng(3)


def write_videos(tmp_path, count=3, frames=6, size=(6, 7)) -> list[np.ndarray]:
    """``count`` folders v<i>/ of ``frames`` JPEGs 000001.jpg…; returns each video's decoded
    BGR frames as (3, frames + 1, H, W) uint8, index = frame number (0 unused)."""
    videos = []
    for v in range(count):
        folder = tmp_path / f"v{v}"
        folder.mkdir()
        decoded = np.zeros((3, frames + 1, *size), np.uint8)
        for i in range(1, frames + 1):
            rgb = RNG.integers(0, 256, (*size, 3), dtype=np.uint8)
            Image.fromarray(rgb).save(folder / f"{i:06d}.jpg", quality=95)
            decoded[:, i] = read_image(folder / f"{i:06d}.jpg")  # the JPEG as decoded
        videos.append(decoded)
    return videos


def video(tmp_path, lines, batch=2, param="", transform="", length=3):
    image = "" if "use_image" in param else "use_image: true"
    (tmp_path / "clips.txt").write_text("\n".join(lines) + "\n")
    return layer(
        f'name: "v" type: "VideoData" top: "data" top: "label" transform_param {{ {transform} }} '
        f'video_data_param {{ source: "{tmp_path}/clips.txt" root_folder: "{tmp_path}/" '
        f"batch_size: {batch} new_length: {length} {image} {param} }}"
    )


def test_clips_shapes_values_and_labels(tmp_path):
    videos = write_videos(tmp_path)
    text = video(tmp_path, ["v0 1 4", "v1 2 7", "v2 3 1"], transform="mean_value: 100 scale: 0.5")
    source = make_source(text, "TEST")
    assert source.top_shapes() == [(2, 3, 3, 6, 7), (2,)]
    (data, labels), (data2, labels2) = source.next_batch(), source.next_batch()
    assert labels.tolist() == [4, 7] and labels2.tolist() == [1, 4]  # wraps around
    np.testing.assert_array_equal(data[0], (videos[0][:, 1:4] - np.float32(100)) * np.float32(0.5))
    np.testing.assert_array_equal(data[1], (videos[1][:, 2:5] - np.float32(100)) * np.float32(0.5))
    np.testing.assert_array_equal(data2[0], (videos[2][:, 3:6] - np.float32(100)) * np.float32(0.5))


def test_one_crop_and_mirror_for_every_frame_of_a_clip_and_5d_mean(tmp_path):
    videos = write_videos(tmp_path, count=4)
    mean = RNG.uniform(0, 255, (1, 3, 3, 6, 7)).astype(np.float32)
    write_blobproto(tmp_path / "mean.binaryproto", mean)
    lines = [f"v{i} 2 {i}" for i in range(4)]
    transform = f'crop_size: 4 mirror: true mean_file: "{tmp_path}/mean.binaryproto"'
    source = make_source(video(tmp_path, lines, 4, transform=transform), "TRAIN", seed=0)
    assert source.top_shapes() == [(4, 3, 3, 4, 4), (4,)]
    data, _ = source.next_batch()
    positions = np.arange(4)
    flips = uniform_ints(source.key, positions, 0, 2) == 1
    h_offs = uniform_ints(source.key, positions, 1, 6 - 4 + 1)
    w_offs = uniform_ints(source.key, positions, 2, 7 - 4 + 1)
    assert flips.any() and not flips.all()
    for i in range(4):
        cut = np.s_[:, :, h_offs[i] : h_offs[i] + 4, w_offs[i] : w_offs[i] + 4]
        want = videos[i][:, 2:5][cut] - mean[0][cut]  # the mean at the pixel's source position
        np.testing.assert_array_equal(data[i], want[..., ::-1] if flips[i] else want)


def test_sampling_rate_and_temporal_jitter(tmp_path):
    videos = write_videos(tmp_path, count=1, frames=9)
    data, _ = make_source(video(tmp_path, ["v0 2 0"], 1, "sampling_rate: 3"), "TEST").next_batch()
    np.testing.assert_array_equal(data[0], videos[0][:, [2, 5, 8]].astype(np.float32))
    # with use_image and jitter the number is the folder's frame count: a TRAIN clip starts at
    # Rand(count − L·rate + 1) + 1
    source = make_source(video(tmp_path, ["v0 9 0"], 1, "use_temporal_jitter: true"), "TRAIN")
    data, _ = source.next_batch()
    start = int(uniform_ints(source.key, np.array([0]), 3, 9 - 3 + 1)[0]) + 1
    np.testing.assert_array_equal(data[0], videos[0][:, start : start + 3].astype(np.float32))


def write_avi(path, frames=10, size=(16, 24)):
    """An MJPG AVI of random frames; returns the frames OpenCV decodes from it, (3, F, H, W)."""
    import cv2  # a dependency of caffe2jax: a missing one fails

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 25, size[::-1])
    for _ in range(frames):
        writer.write(RNG.integers(0, 256, (*size, 3), dtype=np.uint8))
    writer.release()
    cap, decoded = cv2.VideoCapture(str(path)), []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        decoded.append(frame.transpose(2, 0, 1))
    cap.release()
    return np.stack(decoded, axis=1)


def test_video_files_are_read_through_opencv(tmp_path):
    frames = write_avi(tmp_path / "a.avi")
    assert frames.shape == (3, 10, 16, 24)
    text = video(tmp_path, ["a.avi 2 3"], 1, "use_image: false sampling_rate: 2")
    data, label = make_source(text, "TEST").next_batch()
    np.testing.assert_array_equal(data[0], frames[:, [2, 4, 6]].astype(np.float32))
    assert label.tolist() == [3]
    # temporal jitter: "file label" lines, the start drawn as Rand(count − L·rate + 1)
    text = video(tmp_path, ["a.avi 3"], 1, "use_image: false use_temporal_jitter: true")
    source = make_source(text, "TEST")
    data, _ = source.next_batch()
    start = int(uniform_ints(source.key, np.array([0]), 3, 10 - 3 + 1)[0])
    np.testing.assert_array_equal(data[0], frames[:, start : start + 3].astype(np.float32))
    with pytest.raises(DataError, match=r"clips.txt:1: .*a.avi has 10 frames, a clip needs 12"):
        make_source(video(tmp_path, ["a.avi 0 3"], 1, "use_image: false", length=12), "TEST")


def test_multiple_labels_are_multi_hot(tmp_path):
    write_videos(tmp_path, count=2)
    param = "use_multiple_label: true num_of_labels: 5"
    source = make_source(video(tmp_path, ["v0 1 0,3", "v1 1 4"], 2, param), "TEST")
    assert source.top_shapes()[1] == (2, 5)
    _, labels = source.next_batch()
    assert labels.tolist() == [[1, 0, 0, 1, 0], [0, 0, 0, 0, 1]]


def test_c3d_v10_form_reads_its_5d_mean_file_and_draws_rand_h_minus_crop(tmp_path):
    videos = write_videos(tmp_path, count=1)
    mean = RNG.uniform(0, 255, (1, 3, 3, 6, 7)).astype(np.float32)
    (tmp_path / "mean.bin").write_bytes(c3d_blob(mean.shape, mean.ravel()))
    transform = f'crop_size: 4 mean_file: "{tmp_path}/mean.bin"'
    source = make_source(video(tmp_path, ["v0 1 0"], 1, transform=transform), "TRAIN",
                         seed=1, form="c3d-v1.0")  # fmt: skip
    data, _ = source.next_batch()
    h = int(uniform_ints(source.key, np.array([0]), 1, 6 - 4)[0])  # Rand(H − crop): no + 1
    w = int(uniform_ints(source.key, np.array([0]), 2, 7 - 4)[0])
    cut = np.s_[:, :, h : h + 4, w : w + 4]
    np.testing.assert_array_equal(data[0], videos[0][:, 1:4][cut] - mean[0][cut])
    with pytest.raises(DataError, match="requires mirror and crop_size to be set"):
        make_source(video(tmp_path, ["v0 1 0"], 1, transform="mirror: true"), "TRAIN",
                    form="c3d-v1.0")  # fmt: skip


@pytest.mark.parametrize("workers", [0, 3])
def test_the_same_bytes_with_workers_and_on_resume(tmp_path, workers):
    write_videos(tmp_path, count=3, frames=8)
    lines = ["v0 8 0", "v1 8 1", "v2 8 2"]
    param = "shuffle: true use_temporal_jitter: true use_sampling_rate_jitter: true " \
            "max_sampling_rate: 2"  # fmt: skip
    text = video(tmp_path, lines, 2, param, "crop_size: 5 mirror: true")
    source = make_source(text, "TRAIN", seed=3)
    want, states = [], []
    for _ in range(5):
        want.append([a.copy() for a in source.next_batch()])
        states.append(plain(source.get_state()))
    with Prefetcher(make_source(text, "TRAIN", seed=3), 2, workers=workers) as reader:
        for batch, state in zip(want, states, strict=True):
            assert all(np.asarray(g).tobytes() == w.tobytes()
                       for g, w in zip(reader.next_batch(), batch))  # fmt: skip
            assert plain(reader.get_state()) == state
    resumed = make_source(text, "TRAIN", seed=4)
    resumed.set_state(states[1])
    for batch in want[2:]:
        assert all(g.tobytes() == w.tobytes() for g, w in zip(resumed.next_batch(), batch))


@pytest.mark.parametrize("lines,param,match", [
    (["v0 1"], "", r"clips.txt:1: expected 'folder start_frame label'"),
    (["v0 x 1"], "", r"clips.txt:1: expected 'folder start_frame label'"),
    (["v0 5 1"], "", r"clips.txt:1: frame not found: .*v0/000007.jpg"),
    (["v0 6 1"], "use_temporal_jitter: true", r"clips.txt:1: v0 has 6 frames, a clip needs 9"),
    (["nope.avi 1 1"], "use_image: false", r"clips.txt:1: video not found: .*nope.avi"),
    (["v0 1 1"], "use_multiple_label: true", "number of labels must be set together"),
    (["v0 1 7"], "use_multiple_label: true num_of_labels: 3", r"labels \[7\] outside 0..2"),
    (["v0 1 1"], "new_height: 4", "new_height and new_width must be set at the same time"),
])  # fmt: skip
def test_one_line_errors(tmp_path, lines, param, match):
    write_videos(tmp_path, count=1)
    length = 9 if "jitter" in param else 3
    with pytest.raises(DataError, match=match) as err:
        make_source(video(tmp_path, lines, 1, param, length=length), "TRAIN").next_batch()
    assert "\n" not in str(err.value)


def test_c3d_v10_development_net_runs_forward_on_clips(tmp_path):
    """The C3D v1.0 fine-tuning net of the development set (V1 VIDEO_DATA, CONVOLUTION3D,
    POOLING3D), its list, frames and 5-D v1.0 mean file made up here, batch 1: the clip
    goes through the pipeline, crop 112 and mean, and the net to a finite loss."""
    text = (FORK_MODELS / "c3d_v10_ucf101_finetune_train.prototxt").read_text()
    for v in range(2):
        (tmp_path / f"v{v}").mkdir()
        for i in range(1, 18):
            rgb = RNG.integers(0, 256, (120, 160, 3), dtype=np.uint8)
            Image.fromarray(rgb).save(tmp_path / f"v{v}" / f"{i:06d}.jpg")
    (tmp_path / "train_01.lst").write_text(f"{tmp_path}/v0 1 5\n{tmp_path}/v1 2 9\n")
    mean = RNG.uniform(0, 255, (1, 3, 16, 128, 171)).astype(np.float32)
    (tmp_path / "train01_16_128_171_mean.binaryproto").write_bytes(
        c3d_blob(mean.shape, mean.ravel())
    )
    (tmp_path / "net.prototxt").write_text(text.replace("batch_size: 30", "batch_size: 1"))
    net = caffe2jax.Net(str(tmp_path / "net.prototxt"), caffe2jax.TRAIN, seed=0)
    assert net.blobs["data"].data.shape == (1, 3, 16, 112, 112)
    assert net.params["conv1a"][0].data.shape == (64, 3, 3, 3, 3)
    assert net.params["conv1a"][1].data.shape == (1, 1, 1, 1, 64)
    (loss,) = net.forward().values()
    assert np.isfinite(loss) and net.blobs["label"].data[0] in (5, 9)
    assert net.blobs["pool5"].data.shape == (1, 512, 1, 4, 4)


SSD_VIDEO = """name: "ssd_video"
layer { name: "data" type: "VideoData" top: "data"
  video_data_param { video_type: VIDEO video_file: "clip.mp4" } }
layer { name: "relu" type: "ReLU" bottom: "data" top: "relu" }
"""


def test_ssd_video_data_is_refused_at_compile_time_in_one_line(tmp_path, capsys):
    from caffe2jax.cli.main import main
    from caffe2jax.frontend.errors import NetError
    from caffe2jax.lowering.model import compile as compile_net

    with pytest.raises(NetError, match="layer 'data' \\(type VideoData\\): SSD's VideoData "
                                       "reads a webcam or a video file") as err:  # fmt: skip
        compile_net(SSD_VIDEO, input_shapes={"data": (1, 3, 4, 4)})
    assert "\n" not in str(err.value)
    (tmp_path / "net.prototxt").write_text(SSD_VIDEO)
    assert main(["summary", str(tmp_path / "net.prototxt")]) == 0
    assert "(not every shape: " in capsys.readouterr().out  # listed, with the reason


def test_a_3d_net_trains_on_video_data(tmp_path):
    """Training input: a solver steps a tiny C3D-style net (Convolution3D, Pooling3D) fed by
    VideoData with random crops and mirrors."""
    write_videos(tmp_path, count=3, frames=6)
    (tmp_path / "clips.txt").write_text("v0 1 0\nv1 2 1\nv2 1 2\n")
    net = (
        f'layer {{ name: "data" type: "VideoData" top: "data" top: "label" transform_param {{ '
        f"crop_size: 5 mirror: true mean_value: 128 scale: 0.01 }} video_data_param {{ "
        f'source: "{tmp_path}/clips.txt" root_folder: "{tmp_path}/" batch_size: 2 '
        "new_length: 4 use_image: true shuffle: true } }\n"
        'layer { name: "conv" type: "Convolution3D" bottom: "data" top: "conv" '
        "convolution3d_param { num_output: 4 kernel_size: 3 kernel_depth: 3 pad: 1 "
        "temporal_pad: 1 weight_filler { type: 'gaussian' std: 0.1 } } }\n"
        'layer { name: "pool" type: "Pooling3D" bottom: "conv" top: "pool" '
        "pooling3d_param { pool: MAX kernel_size: 2 kernel_depth: 2 stride: 2 "
        "temporal_stride: 2 } }\n"
        'layer { name: "fc" type: "InnerProduct" bottom: "pool" top: "fc" '
        "inner_product_param { num_output: 3 weight_filler { type: 'gaussian' std: 0.1 } } }\n"
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" '
        'top: "loss" }\n'
    )
    solver = caffe2jax.get_solver(
        f'net_param {{ {net} }} base_lr: 0.1 lr_policy: "fixed" max_iter: 3 '
        "solver_mode: CPU random_seed: 1 snapshot_after_train: false"
    )
    before = np.array(solver.net.params["conv"][0].data)
    solver.step(3)
    assert solver.iter == 3 and np.isfinite(solver.net.blobs["loss"].data)
    assert solver.net.blobs["data"].data.shape == (2, 3, 4, 5, 5)
    assert not np.array_equal(before, solver.net.params["conv"][0].data)
