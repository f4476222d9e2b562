"""SegNet/ENet's DenseImageData (runtime/data/readers/dense_image_data.py): shapes, values against a
hand computation (mean, scale, the same crop and mirror for image and label), nearest-neighbour
label resizing, ENet's label_divide_factor, determinism with worker threads and on resume,
and one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import plain
from caffe2jax.runtime.data.prefetch import Prefetcher
from caffe2jax.runtime.data.sources import make_source
from caffe2jax.runtime.data.transform.transformer import uniform_ints

from .helpers import layer

RNG = np.random.default_rng(7)


def nearest_taps(src: int, dst: int) -> np.ndarray:
    """OpenCV's INTER_NEAREST source index per cell, transcribed from imgproc/resize.cpp
    (``resizeNN``): ``min(floor(x · (1 / (dst / src))), src − 1)`` in double."""
    return np.minimum(np.floor(np.arange(dst) * (1.0 / (dst / src))).astype(np.int64), src - 1)


def write_pairs(tmp_path, count=3, size=(6, 8), classes=5, name="list.txt"):
    """``count`` colour PNGs and gray label PNGs; returns their BGR C×H×W and 1×H×W pixels."""
    images, labels, lines = [], [], []
    for i in range(count):
        rgb = RNG.integers(0, 256, (*size, 3), dtype=np.uint8)
        lab = RNG.integers(0, classes, size, dtype=np.uint8)
        Image.fromarray(rgb).save(tmp_path / f"im{i}.png")
        Image.fromarray(lab).save(tmp_path / f"lab{i}.png")
        images.append(rgb[..., ::-1].transpose(2, 0, 1))
        labels.append(lab[None])
        lines.append(f"im{i}.png lab{i}.png")
    (tmp_path / name).write_text("\n".join(lines) + "\n")
    return images, labels


def dense(tmp_path, batch=2, param="", transform="", tops=2):
    top = ' top: "data" top: "label"' if tops == 2 else ' top: "data"'
    return layer(
        f'name: "d" type: "DenseImageData"{top} transform_param {{ {transform} }} '
        f'dense_image_data_param {{ source: "{tmp_path}/list.txt" root_folder: "{tmp_path}/" '
        f"batch_size: {batch} {param} }}"
    )


def test_shapes_order_mean_and_scale(tmp_path):
    images, labels = write_pairs(tmp_path)
    text = dense(tmp_path, 2, transform="mean_value: 10 mean_value: 20 mean_value: 30 scale: 0.5")
    source = make_source(text, "TRAIN", seed=0)
    assert source.top_shapes() == [(2, 3, 6, 8), (2, 1, 6, 8)]
    batches = [source.next_batch() for _ in range(2)]
    means = np.array([10, 20, 30], np.float32)[:, None, None]
    for b, order in zip(batches, ([0, 1], [2, 0]), strict=True):  # wraps around the list
        for row, i in enumerate(order):
            np.testing.assert_array_equal(b[0][row], (images[i] - means) * np.float32(0.5))
            # the label keeps its pixel values: no mean, no scale
            np.testing.assert_array_equal(b[1][row], labels[i].astype(np.float32))


def test_crop_and_mirror_are_the_same_for_image_and_label(tmp_path):
    images, labels = write_pairs(tmp_path, count=4)
    param = "crop_height: 4 crop_width: 5 mirror: true"
    source = make_source(dense(tmp_path, 4, param), "TEST", seed=5)
    assert source.top_shapes() == [(4, 3, 4, 5), (4, 1, 4, 5)]
    data, label = source.next_batch()
    positions = np.arange(4)
    flips = uniform_ints(source.key, positions, 0, 2) == 1
    h_offs = uniform_ints(source.key, positions, 1, 6 - 4 + 1)  # random in TEST too (SegNet)
    w_offs = uniform_ints(source.key, positions, 2, 8 - 5 + 1)
    assert flips.any() and not flips.all()  # this seed mirrors some items, not all
    for i in range(4):
        image, lab = images[i], labels[i]
        if flips[i]:  # SegNet flips the whole image first, then crops
            image, lab = image[:, :, ::-1], lab[:, :, ::-1]
        cut = np.s_[:, h_offs[i] : h_offs[i] + 4, w_offs[i] : w_offs[i] + 5]
        np.testing.assert_array_equal(data[i], image[cut].astype(np.float32))
        np.testing.assert_array_equal(label[i], lab[cut].astype(np.float32))


def test_labels_are_resized_nearest_neighbour(tmp_path):
    images, labels = write_pairs(tmp_path, count=1, size=(6, 8))
    source = make_source(dense(tmp_path, 1, "new_height: 9 new_width: 5"), "TEST")
    assert source.top_shapes() == [(1, 3, 9, 5), (1, 1, 9, 5)]
    _, label = source.next_batch()
    want = labels[0][:, nearest_taps(6, 9)][:, :, nearest_taps(8, 5)]
    np.testing.assert_array_equal(label[0], want.astype(np.float32))
    assert set(np.unique(label)) <= set(np.unique(labels[0]))  # no class is blended


def test_nearest_taps_match_opencv():
    import cv2  # a dependency of caffe2jax: a missing one fails

    for src, dst in [(6, 9), (8, 5), (360, 45), (7, 7 * 3), (1024, 128), (5, 1)]:
        row = np.arange(src, dtype=np.uint8)[None] % 251
        got = cv2.resize(row, (dst, 1), interpolation=cv2.INTER_NEAREST)[0]
        np.testing.assert_array_equal(got, row[0][nearest_taps(src, dst)])


def test_enet_label_divide_factor(tmp_path):
    _, labels = write_pairs(tmp_path, count=1, size=(8, 16))
    source = make_source(dense(tmp_path, 1, "new_height: 8 new_width: 16 label_divide_factor: 4"),
                         "TRAIN")  # fmt: skip
    assert source.top_shapes() == [(1, 3, 8, 16), (1, 1, 2, 4)]
    _, label = source.next_batch()
    want = labels[0][:, nearest_taps(8, 2)][:, :, nearest_taps(16, 4)]
    np.testing.assert_array_equal(label[0], want.astype(np.float32))


def serial(text, count):
    source = make_source(text, "TRAIN", seed=3)
    out, states = [], []
    for _ in range(count):
        out.append([a.copy() for a in source.next_batch()])
        states.append(plain(source.get_state()))
    return out, states


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_the_same_bytes_with_workers_and_on_resume(tmp_path, workers):
    write_pairs(tmp_path, count=5)
    text = dense(tmp_path, 2, "shuffle: true mirror: true crop_height: 5 crop_width: 6")
    want, states = serial(text, 7)  # past a wrap-around and a reshuffle
    with Prefetcher(make_source(text, "TRAIN", seed=3), 2, workers=workers) as reader:
        for batch, state in zip(want, states, strict=True):
            got = reader.next_batch()
            assert all(np.asarray(g).tobytes() == w.tobytes() for g, w in zip(got, batch))
            assert plain(reader.get_state()) == state
    resumed = make_source(text, "TRAIN", seed=11)
    resumed.set_state(states[3])
    for batch in want[4:]:
        assert all(g.tobytes() == w.tobytes() for g, w in zip(resumed.next_batch(), batch))


@pytest.mark.parametrize("edit,param,transform,match", [
    ("im0.png lab0.png extra", "", "", r"list.txt:1: expected 'image label'"),
    ("im0.png missing.png", "", "", r"list.txt:1: image not found: .*missing.png"),
    ("", "crop_height: 4", "", "crop_height and crop_width must be set at the same time"),
    ("", "", "crop_size: 4", "transform_param crop_size/mirror would crop or flip the image"),
    ("", "label_divide_factor: 2", "", "label_divide_factor 2 needs new_height/new_width"),
    ("", "crop_height: 9 crop_width: 9", "", "crop 9×9 is larger than the images 6×8"),
])  # fmt: skip
def test_one_line_errors(tmp_path, edit, param, transform, match):
    write_pairs(tmp_path, count=2)
    if edit:
        (tmp_path / "list.txt").write_text(edit + "\n")
    with pytest.raises(DataError, match=match) as err:
        make_source(dense(tmp_path, 1, param, transform), "TRAIN").next_batch()
    assert "\n" not in str(err.value)


def test_label_of_another_size_is_an_error(tmp_path):
    write_pairs(tmp_path, count=1)
    Image.fromarray(np.zeros((3, 3), np.uint8)).save(tmp_path / "lab0.png")
    with pytest.raises(DataError, match=r"list.txt:1: label lab0.png is 3×3, its image 6×8"):
        make_source(dense(tmp_path, 1), "TEST")


def test_needs_two_tops(tmp_path):
    write_pairs(tmp_path, count=1)
    with pytest.raises(DataError, match="needs 2 tops"):
        make_source(dense(tmp_path, 1, tops=1), "TEST")


def test_a_segmentation_net_trains_on_dense_image_data(tmp_path):
    """Training input: a solver steps a per-pixel classifier fed by DenseImageData (random
    crop and mirror shared by image and label map)."""
    import caffe2jax

    write_pairs(tmp_path, count=3, classes=4)
    net = (
        f'layer {{ name: "data" type: "DenseImageData" top: "data" top: "label" '
        f"transform_param {{ scale: 0.01 }} dense_image_data_param {{ "
        f'source: "{tmp_path}/list.txt" root_folder: "{tmp_path}/" batch_size: 2 '
        "shuffle: true mirror: true crop_height: 4 crop_width: 6 } }\n"
        'layer { name: "score" type: "Convolution" bottom: "data" top: "score" '
        "convolution_param { num_output: 4 kernel_size: 3 pad: 1 "
        "weight_filler { type: 'gaussian' std: 0.1 } } }\n"
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" '
        'top: "loss" }\n'
    )
    solver = caffe2jax.get_solver(
        f'net_param {{ {net} }} base_lr: 0.1 lr_policy: "fixed" max_iter: 3 '
        "solver_mode: CPU random_seed: 1 snapshot_after_train: false"
    )
    before = np.array(solver.net.params["score"][0].data)
    solver.step(3)
    assert np.isfinite(solver.net.blobs["loss"].data)
    assert solver.net.blobs["label"].data.shape == (2, 1, 4, 6)
    assert set(np.unique(solver.net.blobs["label"].data)) <= {0, 1, 2, 3}
    assert not np.array_equal(before, solver.net.params["score"][0].data)
