"""pycaffe's ``caffe.io`` against the public names of BVLC's python/caffe/io.py, the SSD fork's
(weiliu89/caffe, the same list) and py-faster-rcnn's caffe-fast-rcnn io.py (its base of
2015: ``arraylist_to_blobprotovecor_str`` so spelled, ``array_to_datum(arr, label=0)``): each
name exists and gives a hand-worked value. ``skimage`` (the module io.py imports) is the one
name not provided: scikit-image is not a dependency; its ``resize`` is (caffe2jax/pycaffe/
resize.py)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import caffe2jax as caffe
from caffe2jax.frontend import caffe_pb2
from caffe2jax.pycaffe import io

# (name, the io.py files that define or import it)
PUBLIC_NAMES = [
    ("np", "bvlc ssd frcnn"),
    ("zoom", "bvlc ssd frcnn"),  # from scipy.ndimage import zoom
    ("resize", "bvlc ssd frcnn"),  # from skimage.transform import resize
    ("caffe_pb2", "bvlc ssd frcnn"),
    ("blobproto_to_array", "bvlc ssd frcnn"),
    ("array_to_blobproto", "bvlc ssd frcnn"),
    ("arraylist_to_blobprotovector_str", "bvlc ssd"),
    ("arraylist_to_blobprotovecor_str", "frcnn"),
    ("blobprotovector_str_to_arraylist", "bvlc ssd frcnn"),
    ("array_to_datum", "bvlc ssd frcnn"),
    ("datum_to_array", "bvlc ssd frcnn"),
    ("Transformer", "bvlc ssd frcnn"),
    ("load_image", "bvlc ssd frcnn"),
    ("resize_image", "bvlc ssd frcnn"),
    ("oversample", "bvlc ssd frcnn"),
]


@pytest.mark.parametrize(("name", "forks"), PUBLIC_NAMES)
def test_every_public_name_exists(name, forks):
    assert getattr(caffe.io, name) is not None, (name, forks)
    assert caffe.io is io


def test_np_zoom_and_caffe_pb2_are_the_modules_io_py_imports():
    assert io.np is np and io.caffe_pb2 is caffe_pb2
    # zoom by 2 at order 0 (nearest, grid_mode False): each value twice
    np.testing.assert_array_equal(io.zoom(np.array([1.0, 2.0]), 2, order=0), [1, 1, 2, 2])


def test_resize_is_skimages():
    two = np.array([[0.0, 1.0], [0.0, 1.0]])
    # output centres map to (i + 0.5)/2 - 0.5 = -0.25, 0.25, 0.75, 1.25; "reflect" mirrors
    # -0.25 to 0.25 and 1.25 to 0.75; "edge" clamps them to 0 and 1
    np.testing.assert_allclose(io.resize(two, (2, 4)), [[0.25, 0.25, 0.75, 0.75]] * 2)
    np.testing.assert_allclose(io.resize(two, (2, 4), mode="edge"), [[0, 0.25, 0.75, 1]] * 2)
    # uint8 goes to [0, 1] first (img_as_float) unless preserve_range
    np.testing.assert_allclose(io.resize(np.array([[0, 255]], np.uint8), (1, 4)),
                               [[0.25, 0.25, 0.75, 0.75]])  # fmt: skip
    kept = io.resize(np.array([[0, 255]], np.uint8), (1, 4), preserve_range=True)
    np.testing.assert_allclose(kept, [[63.75, 63.75, 191.25, 191.25]])
    # a shape one axis short keeps the channels
    assert io.resize(np.zeros((4, 6, 3)), (2, 3)).shape == (2, 3, 3)


def test_resize_smooths_before_it_shrinks():
    """4 → 2: Gaussian of sigma (2 − 1)/2 = 0.5 (radius 2, weights e^(−2x²) normalised:
    1, 0.135335, 0.000335 over 1.271341) on the mirrored row 1 0 | 0 0 1 1 | 1 0, then the
    mean of the two values around each output centre (0.5 and 2.5)."""
    row = np.array([[0.0, 0.0, 1.0, 1.0]])
    w1, w2 = np.exp(-2.0) / 1.2713412, np.exp(-8.0) / 1.2713412
    f0, f1 = 2 * w2, w1 + w2
    np.testing.assert_allclose(io.resize(row, (1, 2)), [[f0 / 2 + f1 / 2, 1 - f0 / 2 - f1 / 2]],
                               rtol=1e-6)  # fmt: skip
    np.testing.assert_array_equal(io.resize(row, (1, 2), anti_aliasing=False), [[0, 1]])


def test_resize_image_scales_to_unit_range_and_back():
    image = np.array([[[2.0], [4.0]]])  # 1×2×1: [0, 1] after scaling, then back to [2, 4]
    np.testing.assert_allclose(io.resize_image(image, (1, 4)).ravel(), [2.5, 2.5, 3.5, 3.5])
    assert io.resize_image(image, (1, 4)).dtype == np.float32
    constant = io.resize_image(np.full((3, 3, 3), 7.0), (5, 2))
    assert constant.shape == (5, 2, 3) and (constant == 7).all()
    # two channels: scipy.ndimage.zoom, order 0 repeats each pixel
    two = np.arange(4.0).reshape(1, 2, 2)
    np.testing.assert_array_equal(io.resize_image(two, (1, 4), interp_order=0)[0, :, 0],
                                  [0, 0, 2, 2])  # fmt: skip


def test_load_image_color_gray_and_alpha(tmp_path):
    rgb = np.array([[[255, 0, 0], [0, 255, 0]]], np.uint8)
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    np.testing.assert_allclose(io.load_image(tmp_path / "rgb.png"), rgb / 255.0)
    gray = io.load_image(tmp_path / "rgb.png", color=False)
    np.testing.assert_allclose(gray[..., 0], [[0.2125, 0.7154]], rtol=1e-6)  # rgb2gray weights
    Image.fromarray(np.array([[0, 51]], np.uint8)).save(tmp_path / "g.png")
    tiled = io.load_image(tmp_path / "g.png")
    assert tiled.shape == (1, 2, 3) and np.allclose(tiled[0, 1], 0.2)
    rgba = np.array([[[0, 0, 0, 0]]], np.uint8)  # transparent black over white: gray 1
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    assert io.load_image(tmp_path / "a.png").shape == (1, 1, 3)
    np.testing.assert_allclose(io.load_image(tmp_path / "a.png", color=False), [[[1.0]]])


def test_blobproto_and_vector_round_trips():
    arr = np.arange(6.0).reshape(1, 2, 3)
    blob = io.array_to_blobproto(arr, diff=-arr)
    assert list(blob.shape.dim) == [1, 2, 3]
    back = io.blobproto_to_array(blob)
    assert back.dtype == np.float64 and (back == arr).all()
    np.testing.assert_array_equal(io.blobproto_to_array(blob, return_diff=True), -arr)
    text = io.arraylist_to_blobprotovecor_str([arr, arr[0]])
    assert text == io.arraylist_to_blobprotovector_str([arr, arr[0]])
    first, second = io.blobprotovector_str_to_arraylist(text)
    assert (first == arr).all() and (second == arr[0]).all()


def test_datum_round_trips_keep_pycaffes_types():
    pixels = np.arange(12, dtype=np.uint8).reshape(3, 2, 2)
    datum = io.array_to_datum(pixels, 5)
    assert datum.label == 5 and datum.data == pixels.tobytes()
    back = io.datum_to_array(datum)
    assert back.dtype == np.uint8 and (back == pixels).all()
    floats = io.array_to_datum(pixels.astype(np.float32) / 2)
    assert not floats.HasField("label") and list(floats.float_data)[:3] == [0.0, 0.5, 1.0]
    assert io.datum_to_array(floats).dtype == np.float64
    with pytest.raises(ValueError, match="Incorrect array shape"):
        io.array_to_datum(pixels[0])


def test_oversample_and_transformer():
    image = np.arange(16.0).reshape(4, 4, 1)
    crops = io.oversample([image], (2, 2))
    assert crops.shape == (10, 2, 2, 1)
    np.testing.assert_array_equal(crops[4, :, :, 0], [[5, 6], [9, 10]])  # the centre
    np.testing.assert_array_equal(crops[9, :, :, 0], [[6, 5], [10, 9]])  # it mirrored
    t = io.Transformer({"data": (1, 3, 2, 2)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255)
    t.set_mean("data", np.array([1.0, 2.0, 3.0]))
    t.set_input_scale("data", 0.5)
    rgb = np.array([[[0.0, 0.2, 0.4], [1.0, 0.6, 0.8]]] * 2)  # two equal rows
    # BGR, ×255, − mean per channel, × 0.5
    want = np.array([[[102 - 1, 204 - 1]] * 2, [[51 - 2, 153 - 2]] * 2, [[0 - 3, 255 - 3]] * 2])
    want = want * 0.5
    np.testing.assert_allclose(t.preprocess("data", rgb), want, rtol=1e-5)
    np.testing.assert_allclose(t.deprocess("data", want), rgb, atol=1e-6)
