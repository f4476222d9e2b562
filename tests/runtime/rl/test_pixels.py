"""Pong-from-pixels preprocessing (runtime/rl/pixels.py) against frames worked by hand."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from caffe2jax.runtime.rl import pixels


def _screen() -> np.ndarray:
    """A 210×160 RGB screen: background red 144 everywhere, and a few marked pixels."""
    rgb = np.zeros((210, 160, 3), np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 144, 72, 17  # Pong's background colour
    marks = {
        (35, 0): 213,  # first kept row, first kept column -> out[0, 0]
        (37, 10): 92,  # row 37 -> (37 - 35) / 2 = 1, column 10 -> 5: out[1, 5]
        (193, 158): 236,  # last kept row and column -> out[79, 79]
        (36, 20): 236,  # row 36: dropped by the stride
        (39, 21): 236,  # column 21: dropped by the stride
        (34, 40): 236,  # row 34: cropped (the score bar)
        (195, 40): 236,  # row 195: cropped (the bottom border)
        (101, 60): 109,  # background type 2 -> erased: out[33, 30] stays 0
        (101, 62): 0,  # black -> 0: out[33, 31]
        (41, 2): 1,  # any other non-zero red -> 1: out[3, 1]
    }
    for (row, col), red in marks.items():
        rgb[row, col] = (red, 0, 0)
    return rgb


def _expected() -> np.ndarray:
    out = np.zeros((80, 80), np.float32)
    for r, c in ((0, 0), (1, 5), (79, 79), (3, 1)):
        out[r, c] = 1.0
    return out


def test_crop_binarise_match_the_hand_worked_frame():
    red = pixels.crop(_screen()[None])
    assert red.shape == (1, 80, 80) and red.dtype == np.uint8
    assert red[0, 0, 0] == 213 and red[0, 1, 5] == 92 and red[0, 33, 30] == 109
    out = np.asarray(pixels.binarise(jnp.asarray(red)))[0]
    np.testing.assert_array_equal(out, _expected())


def test_crop_takes_the_vector_envs_stacked_layout():
    screen = _screen()
    stacked = np.stack([screen, screen])[:, None]  # (n, stack 1, 210, 160, 3) like ale-py
    np.testing.assert_array_equal(pixels.crop(stacked)[1], pixels.crop(screen[None])[0])


def test_difference_is_zero_on_an_episodes_first_step():
    a = np.zeros((2, 6400), np.float32)
    b = np.zeros((2, 6400), np.float32)
    a[:, 0], b[:, 1] = 1.0, 1.0  # the ball moved from pixel 0 to pixel 1
    x = np.asarray(pixels.difference(jnp.asarray(b), jnp.asarray(a), jnp.asarray([True, False])))
    assert x[0, 0] == -1 and x[0, 1] == 1 and np.count_nonzero(x[0]) == 2
    assert not x[1].any()  # lane 1 has no previous frame (Karpathy's prev_x = None)


def test_scale_is_the_red_channel_in_unit_range():
    red = jnp.asarray([[[0, 255], [51, 144]]], jnp.uint8)
    np.testing.assert_allclose(np.asarray(pixels.scale(red)), [[[0, 1], [0.2, 144 / 255]]])


def test_packed_difference_round_trips():
    rng = np.random.default_rng(0)
    x = rng.integers(-1, 2, (7, 6400)).astype(np.float32)
    packed = pixels.pack_difference(jnp.asarray(x))
    assert packed.shape == (7, 2, 800) and packed.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(pixels.unpack_difference(packed, 6400)), x)
