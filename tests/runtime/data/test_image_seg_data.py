"""DeepLab's ImageSegData (runtime/data/readers/image_seg_data.py): shapes, values against a hand
computation (mean, scale, the same crop and mirror for image and label, padding with the mean
and with ignore_label), label_type PIXEL/IMAGE/NONE, v2's data_dim top and scale_factors,
DeepLab v1's form, determinism with worker threads and on resume, and one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import plain
from caffe2jax.runtime.data.prefetch import Prefetcher
from caffe2jax.runtime.data.sources import make_source
from caffe2jax.runtime.data.transform.image import resize, resize_nearest
from caffe2jax.runtime.data.transform.transformer import uniform_ints

from .helpers import layer
from .test_dense_image_data import write_pairs

MEANS = "mean_value: 104 mean_value: 117 mean_value: 123"
M = np.array([104, 117, 123], np.float32)[:, None, None]


def seg(tmp_path, batch=2, param="label_type: PIXEL", transform=MEANS, tops=2):
    top = "".join(f' top: "{t}"' for t in ["data", "label", "dim"][:tops])
    return layer(
        f'name: "d" type: "ImageSegData"{top} transform_param {{ {transform} }} '
        f'image_data_param {{ source: "{tmp_path}/list.txt" root_folder: "{tmp_path}/" '
        f"batch_size: {batch} {param} }}"
    )


def test_pixel_labels_mean_and_scale(tmp_path):
    images, labels = write_pairs(tmp_path)
    source = make_source(seg(tmp_path, 2, transform=MEANS + " scale: 0.25"), "TEST")
    assert source.top_shapes() == [(2, 3, 6, 8), (2, 1, 6, 8)]
    data, label = source.next_batch()
    for i in range(2):
        np.testing.assert_array_equal(data[i], (images[i] - M) * np.float32(0.25))
        np.testing.assert_array_equal(label[i], labels[i].astype(np.float32))


def test_crop_larger_than_the_image_pads_with_the_mean_and_ignore_label(tmp_path):
    images, labels = write_pairs(tmp_path, count=1, size=(6, 8))
    param = "label_type: PIXEL ignore_label: 250"
    source = make_source(seg(tmp_path, 1, param, MEANS + " crop_size: 10", tops=3), "TEST")
    assert source.top_shapes() == [(1, 3, 10, 10), (1, 1, 10, 10), (1, 1, 1, 2)]
    data, label, dim = source.next_batch()
    # padded to 10×10 at the bottom and right, then the centre crop (offsets 0, 0)
    want = np.zeros((3, 10, 10), np.float32)  # (mean − mean) × scale in the padding
    want[:, :6, :8] = images[0] - M
    np.testing.assert_array_equal(data[0], want)
    want_label = np.full((1, 10, 10), 250, np.float32)
    want_label[:, :6, :8] = labels[0]
    np.testing.assert_array_equal(label[0], want_label)
    assert dim[0].tolist() == [[[6, 8]]]  # the image's size, capped by the data top's


def test_train_crop_and_mirror_are_the_same_for_image_and_label(tmp_path):
    images, labels = write_pairs(tmp_path, count=4, size=(7, 9))
    transform = MEANS + " crop_size: 5 mirror: true"
    source = make_source(seg(tmp_path, 4, transform=transform), "TRAIN", seed=0)
    data, label = source.next_batch()
    positions = np.arange(4)
    flips = uniform_ints(source.key, positions, 0, 2) == 1
    h_offs = uniform_ints(source.key, positions, 1, 7 - 5 + 1)
    w_offs = uniform_ints(source.key, positions, 2, 9 - 5 + 1)
    assert flips.any() and not flips.all()
    for i in range(4):
        cut = np.s_[:, h_offs[i] : h_offs[i] + 5, w_offs[i] : w_offs[i] + 5]
        image, lab = images[i][cut] - M, labels[i][cut].astype(np.float32)
        if flips[i]:  # DeepLab crops first, then mirrors the crop
            image, lab = image[:, :, ::-1], lab[:, :, ::-1]
        np.testing.assert_array_equal(data[i], image)
        np.testing.assert_array_equal(label[i], lab)


def test_label_types_image_and_none(tmp_path):
    write_pairs(tmp_path, count=2)
    (tmp_path / "list.txt").write_text("im0.png 7\nim1.png 300\n")
    _, label = make_source(seg(tmp_path, 2, "label_type: IMAGE"), "TEST").next_batch()
    assert np.all(label[0] == 7) and np.all(label[1] == 255)  # uint8 saturates, as cv::Scalar
    (tmp_path / "list.txt").write_text("im0.png\nim1.png\n")
    _, label = make_source(seg(tmp_path, 2, "label_type: NONE ignore_label: 9"),
                           "TEST").next_batch()  # fmt: skip
    assert np.all(label == 9)


def test_pixel_labels_resize_bilinearly_like_deeplab(tmp_path):
    images, labels = write_pairs(tmp_path, count=1, size=(6, 8))
    param = "label_type: PIXEL new_height: 9 new_width: 5"
    data, label = make_source(seg(tmp_path, 1, param), "TEST").next_batch()
    np.testing.assert_array_equal(data[0], resize(images[0], 9, 5) - M)
    np.testing.assert_array_equal(label[0], resize(labels[0], 9, 5).astype(np.float32))


def test_scale_factors_rescale_image_bilinear_and_label_nearest(tmp_path):
    images, labels = write_pairs(tmp_path, count=1, size=(6, 8))
    transform = MEANS + " crop_size: 12 scale_factors: 1.5"
    data, label = make_source(seg(tmp_path, 1, transform=transform), "TEST").next_batch()
    # 6×8 × 1.5 = 9×12, padded to 12×12, centre crop at (0, 0)
    want = np.zeros((3, 12, 12), np.float32)
    want[:, :9, :12] = resize(images[0], 9, 12) - M
    np.testing.assert_array_equal(data[0], want)
    want_label = np.full((1, 12, 12), 255, np.float32)
    want_label[:, :9, :12] = resize_nearest(labels[0], 9, 12)
    np.testing.assert_array_equal(label[0], want_label)


def test_deeplab_v1_form_always_reads_label_images_and_pads_with_255(tmp_path):
    _, labels = write_pairs(tmp_path, count=1, size=(6, 8))
    text = seg(tmp_path, 1, "ignore_label: 3", MEANS + " crop_size: 9")  # label_type: IMAGE
    source = make_source(text, "TEST", form="deeplab-v1")
    _, label = source.next_batch()
    want = np.full((1, 9, 9), 255, np.float32)
    want[:, :6, :8] = labels[0]
    np.testing.assert_array_equal(label[0], want)
    with pytest.raises(DataError, match="needs 2 tops"):
        make_source(seg(tmp_path, 1, tops=3), "TEST", form="deeplab-v1")


@pytest.mark.parametrize("workers", [0, 2])
def test_the_same_bytes_with_workers_and_on_resume(tmp_path, workers):
    write_pairs(tmp_path, count=5, size=(7, 9))
    text = seg(
        tmp_path,
        2,
        "label_type: PIXEL shuffle: true",
        MEANS + " crop_size: 8 mirror: true scale_factors: 0.5 scale_factors: 1",
    )
    source = make_source(text, "TRAIN", seed=3)  # fmt: skip
    want, states = [], []
    for _ in range(7):
        want.append([a.copy() for a in source.next_batch()])
        states.append(plain(source.get_state()))
    with Prefetcher(make_source(text, "TRAIN", seed=3), 2, workers=workers) as reader:
        for batch, state in zip(want, states, strict=True):
            assert all(np.asarray(g).tobytes() == w.tobytes()
                       for g, w in zip(reader.next_batch(), batch))  # fmt: skip
            assert plain(reader.get_state()) == state
    resumed = make_source(text, "TRAIN", seed=8)
    resumed.set_state(states[2])
    for batch in want[3:]:
        assert all(g.tobytes() == w.tobytes() for g, w in zip(resumed.next_batch(), batch))


@pytest.mark.parametrize("edit,param,transform,match", [
    ("im0.png", "label_type: PIXEL", MEANS, r"list.txt:1: expected 'image label'"),
    ("im0.png nope.png", "label_type: PIXEL", MEANS, r"list.txt:1: image not found: .*nope"),
    ("im0.png x", "label_type: IMAGE", MEANS, "label_type IMAGE needs an integer label"),
    ("", "", "mean_file: 'm.binaryproto'", "does not support mean_file"),
    ("", "", "crop_size: 10", "DeepLab pads with mean_value, which is not set"),
    ("", "", MEANS + " crop_size: 4 crop_height: 4", "give crop_size or both crop_height"),
    ("", "", MEANS + " scale_factors: 2", "scale_factors change each image's size"),
    ("", "new_height: 4", MEANS, "new_height and new_width must be set at the same time"),
])  # fmt: skip
def test_one_line_errors(tmp_path, edit, param, transform, match):
    write_pairs(tmp_path, count=2)
    if edit:
        (tmp_path / "list.txt").write_text(edit + "\n")
    with pytest.raises(DataError, match=match) as err:
        make_source(seg(tmp_path, 1, param or "label_type: PIXEL", transform),
                    "TRAIN").next_batch()  # fmt: skip
    assert "\n" not in str(err.value)


def test_deeplab_v1_net_reads_image_seg_data_in_its_form(tmp_path):
    """A V1 DeepLab net (IMAGE_SEG_DATA, CONVOLUTION with hole): the data layer is opened in
    the deeplab-v1 form (a label image whatever label_type says, padded with 255)."""
    import caffe2jax

    _, labels = write_pairs(tmp_path, count=1, size=(6, 8))
    (tmp_path / "net.prototxt").write_text(
        'name: "dl"\nlayers { name: "data" type: IMAGE_SEG_DATA top: "data" top: "label"\n'
        f'  image_data_param {{ root_folder: "{tmp_path}/" source: "{tmp_path}/list.txt" '
        "batch_size: 1 }\n  transform_param { mean_value: 104 mean_value: 117 "
        "mean_value: 123 crop_size: 9 } }\n"
        'layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv"\n'
        "  convolution_param { num_output: 2 kernel_size: 3 pad: 2 hole: 2 } }\n"
    )
    net = caffe2jax.Net(str(tmp_path / "net.prototxt"), caffe2jax.TEST)
    net.forward()
    want = np.full((1, 9, 9), 255, np.float32)
    want[:, :6, :8] = labels[0]
    np.testing.assert_array_equal(net.blobs["label"].data[0], want)
    assert net.blobs["conv"].data.shape == (1, 2, 9, 9)


def test_deeplab_v1_image_seg_data_with_three_tops_is_refused_at_compile_time():
    from caffe2jax.frontend.errors import NetError
    from caffe2jax.lowering.model import compile as compile_net

    text = (
        'layers { name: "data" type: IMAGE_SEG_DATA top: "data" top: "label" top: "dim" '
        'image_data_param { source: "l.txt" batch_size: 1 } }'
    )
    with pytest.raises(NetError, match="IMAGE_SEG_DATA produces 2 tops, got 3"):
        compile_net(text, input_shapes={"data": (1, 3, 4, 4), "label": (1, 1, 4, 4)})
