"""Cart-Pole frames drawn with Pillow, written as an animated GIF (``rl --test --render``); an
Atari game's own screens written the same way (:func:`write_screens`).

The drawing follows Gymnasium's classic-control layout: the world is ``2·x_threshold`` wide
plus a margin, the cart a box on a track, the pole (``2·length`` long) hinged on the cart's
top and leaning by ``theta`` (positive: to the right). One frame per step, ``tau`` seconds
apart (20 ms, 50 frames per second).
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from caffe2jax.runtime.formats.atomic import atomic_write
from caffe2jax.runtime.rl.envs import CartPoleParams

WIDTH, HEIGHT = 600, 400
TRACK_Y = 300
CART_W, CART_H = 50, 30
POLE_W = 10


def draw_frame(env: CartPoleParams, obs: np.ndarray, step: int | None = None) -> Image.Image:
    """One RGB frame of the cart at ``obs[0]`` with the pole at ``obs[2]`` radians."""
    world = 2 * env.x_threshold * 1.25
    scale = WIDTH / world
    x, theta = float(obs[0]), float(obs[2])
    img = Image.new("RGB", (WIDTH, HEIGHT), (255, 255, 255))
    d = ImageDraw.Draw(img)
    d.line([(0, TRACK_Y), (WIDTH, TRACK_Y)], fill=(0, 0, 0), width=1)
    for edge in (-env.x_threshold, env.x_threshold):  # where the episode ends
        ex = WIDTH / 2 + edge * scale
        d.line([(ex, TRACK_Y - 8), (ex, TRACK_Y + 8)], fill=(200, 0, 0), width=2)
    cx = WIDTH / 2 + x * scale
    top = TRACK_Y - CART_H / 2
    d.rectangle([cx - CART_W / 2, top, cx + CART_W / 2, top + CART_H], fill=(40, 40, 40))
    pole = 2 * env.length * scale
    tip = (cx + pole * math.sin(theta), top - pole * math.cos(theta))
    d.line([(cx, top), tip], fill=(202, 152, 101), width=POLE_W)
    d.ellipse([cx - 4, top - 4, cx + 4, top + 4], fill=(129, 132, 203))
    if step is not None:
        d.text(
            (10, 10), f"step {step}  x {x:+.2f}  theta {math.degrees(theta):+.1f} deg", (0, 0, 0)
        )
    return img


def write_gif(path: str | os.PathLike, env: CartPoleParams, states: np.ndarray) -> Path:
    """An animated GIF of ``states`` (one row per step), written atomically."""
    frames = [
        draw_frame(env, s, i).convert("P", palette=Image.ADAPTIVE) for i, s in enumerate(states)
    ]
    buf = io.BytesIO()
    frames[0].save(
        buf,
        format="GIF",
        save_all=True,
        append_images=frames[1:],
        duration=max(20, round(env.tau * 1000)),
        loop=0,
    )
    return atomic_write(path, buf.getvalue())


def write_screens(path: str | os.PathLike, screens: list[np.ndarray], frame_ms: float) -> Path:
    """An animated GIF of RGB screens ``(210, 160, 3)``, ``frame_ms`` apart, written atomically."""
    frames = [Image.fromarray(np.asarray(s, np.uint8)).convert("P", palette=Image.ADAPTIVE)
              for s in screens]  # fmt: skip
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:],
                   duration=max(20, round(frame_ms)), loop=0, optimize=True)  # fmt: skip
    return atomic_write(path, buf.getvalue())
