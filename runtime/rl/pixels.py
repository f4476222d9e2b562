"""Pong from pixels: the screen preprocessing of Karpathy's ``pg-pong.py`` and MyCaffe's ATARI gym.

Reproduced behaviour (Karpathy, "Deep Reinforcement Learning: Pong from Pixels", 2016, its
``prepro``; MyCaffe/MyCaffe ``MyCaffe.gym/Gyms/AtariGym.cs``, ``getBitmaps`` with
``Preprocess`` true):

* crop the score bar and the bottom border: rows 35 to 194 of the 210×160 screen;
* downsample by 2 (every other row and column) to 80×80, from the red channel;
* erase the background: red 144 (background type 1) and 109 (type 2) become 0;
* binarise: everything else (paddles, ball) becomes 1;
* the net sees the difference of consecutive preprocessed frames (Karpathy's
  ``x = cur_x - prev_x``; MyCaffe's ``Brain.Preprocess`` with ``UseRawInput`` false), zero on
  an episode's first step (Karpathy's ``prev_x = None`` at every reset).

Not reproduced: MyCaffe's gym keeps rows 36, 38, …, 194 (``y % 2 == 0 && y > 35``) where
Karpathy keeps 35, 37, …, 193; this module keeps Karpathy's. MyCaffe writes 255 for a set pixel
where Karpathy writes 1.

The crop and the stride are NumPy views taken on the host (6,400 bytes per emulator cross to
the device, not the 100,800 of the screen); erasing, binarising and differencing run on the
device inside the policy's jitted step.

The binary difference is stored in the trajectory as two packed bit planes (``x > 0`` and
``x < 0``, 800 bytes each): a thousand-step Pong episode costs 1.6 MB instead of 25.6 MB of
float32 inputs, and :func:`unpack_difference` restores the inputs exactly for the update.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

CROP_TOP, CROP_BOTTOM = 35, 195  # rows kept: 35..194
STRIDE = 2
SIZE = 80  # (195 - 35) / 2 = 160 / 2 = 80
BACKGROUND = (144, 109)  # red values of Pong's two background colours


def crop(screens: np.ndarray) -> np.ndarray:
    """``(n, 210, 160, 3)`` RGB screens (or ``(n, 1, 210, 160, 3)`` as ale-py's vector env
    returns them) -> ``(n, 80, 80)`` uint8: the red channel, cropped and downsampled."""
    screens = np.asarray(screens)
    if screens.ndim == 5:
        screens = screens[:, -1]
    return np.ascontiguousarray(screens[:, CROP_TOP:CROP_BOTTOM:STRIDE, ::STRIDE, 0])


def binarise(red: jax.Array) -> jax.Array:
    """Erase the background and set everything else to 1: ``(n, 80, 80)`` uint8 -> float32."""
    keep = (red != 0) & (red != BACKGROUND[0]) & (red != BACKGROUND[1])
    return keep.astype(jnp.float32)


def scale(red: jax.Array) -> jax.Array:
    """``preprocess: false``: the cropped, downsampled red channel in [0, 1]."""
    return red.astype(jnp.float32) / 255.0


def difference(cur: jax.Array, prev: jax.Array, has_prev: jax.Array) -> jax.Array:
    """Karpathy's ``cur_x - prev_x``, zero where the lane has no previous frame yet."""
    return jnp.where(has_prev[:, None], cur - prev, 0.0)


def pack_difference(x: jax.Array) -> jax.Array:
    """``(n, k)`` values in {-1, 0, 1} -> ``(n, 2, ceil(k / 8))`` uint8 bit planes."""
    return jnp.stack([jnp.packbits(x > 0, axis=-1), jnp.packbits(x < 0, axis=-1)], axis=1)


def unpack_difference(packed: jax.Array, size: int) -> jax.Array:
    """The inverse of :func:`pack_difference` on ``(..., 2, bytes)``: ``(..., size)`` float32."""
    planes = jnp.unpackbits(packed, axis=-1, count=size).astype(jnp.float32)
    return planes[..., 0, :] - planes[..., 1, :]
