"""DetectionEvaluate's evaluation on pixel boxes (``name_size_file``, optional ``resize_param``),
as weiliu89/caffe detection_evaluate_layer.cpp and bbox_util.cpp do it.

* ``name_size_file``: lines ``name height width`` (reading stops at the first line that does
  not parse, as ``infile >> name >> height >> width``). Read when the net is compiled.
* Which size an image gets: the layer keeps a counter (``count_``) across forwards. In one
  forward the images that have any detection row (item ≠ −1, the "no detection" rows
  included) take, in ascending image id, ``sizes[count_]``, ``sizes[count_ + 1]``, …, and the
  counter wraps at the end of the file. An image with no row takes no size and does not advance
  the counter (so the sizes of later images shift — the fork's behaviour). The counter is the
  layer's carry (``state.carry``): it persists across test iterations and test phases, starts
  at 0, and is not in a solverstate (a layer member in Caffe, not a blob).
* ``OutputBBox``: the normalized box is clipped to [0, 1] and scaled by (width, height); with
  ``resize_param`` FIT_LARGE_SIZE_AND_PAD it is first projected out of the padded letterbox
  (when it misses the image area, ``ProjectBBox`` fails and the box is used unprojected, as
  the fork leaves ``temp_bbox`` unchanged). WARP and FIT_SMALL_SIZE without scales are the
  plain case; FIT_SMALL_SIZE with ``height_scale``/``width_scale`` is refused.
* ``JaccardOverlap(…, normalized=false)`` on these boxes and their cached ``(w + 1)·(h + 1)``
  sizes (0 for an inverted box): lowering/boxes/iou.py, convention ``SSD_PIXELS``.

Every product and every division by a constant here (and in the IoU) goes through
:mod:`caffe2jax.lowering.exact`, so the float32 values are the fork's under jit too (XLA would
fuse a product into the following sum and turn ``/ resize_height`` into a product), and a
match at ``overlap_threshold`` falls on the fork's side.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering import exact
from caffe2jax.lowering.util import fail

_RESIZE = caffe_pb2.ResizeParameter


def name_sizes(layer: ir.Layer, path: str) -> np.ndarray:
    """(n, 2) [height, width] of ``name_size_file``'s lines, up to the first bad line."""
    try:
        words = Path(path).read_text().split()
    except (OSError, UnicodeDecodeError) as err:
        raise fail(layer, f"Failed to open name size file: {path} ({err})") from None
    sizes = []
    for i in range(0, len(words) - 2, 3):
        try:
            sizes.append((int(words[i + 1]), int(words[i + 2])))
        except ValueError:
            break
    if not sizes:
        raise fail(layer, f"name size file {path} has no 'name height width' line")
    return np.asarray(sizes, np.float32)


def resize_settings(layer: ir.Layer) -> tuple[int, float, float] | None:
    """(resize_mode, height, width) of ``resize_param`` (None: no resize_param)."""
    p = layer.param.detection_evaluate_param
    if not p.HasField("resize_param"):
        return None
    r = p.resize_param
    if r.resize_mode == _RESIZE.FIT_SMALL_SIZE and r.height_scale and r.width_scale:
        why = "resize_param FIT_SMALL_SIZE with height_scale / width_scale is not supported"
        raise fail(layer, f"{why} (WARP, FIT_LARGE_SIZE_AND_PAD and FIT_SMALL_SIZE are)")
    if r.resize_mode == _RESIZE.FIT_LARGE_SIZE_AND_PAD and (r.height <= 0 or r.width <= 0):
        raise fail(layer, "resize_param needs a positive height and width")
    return int(r.resize_mode), float(r.height), float(r.width)


def _letterbox(hw: jnp.ndarray, resize: tuple[int, float, float]) -> jnp.ndarray:
    """(..., 4) source box of the image inside the FIT_LARGE_SIZE_AND_PAD canvas."""
    _, rh, rw = resize
    # exact: jit would turn rw / (w / h) into (rw · h) / w, and padding / resize_height into a
    # product with 1 / resize_height
    aspect = exact.div(hw[..., 1], hw[..., 0])
    wide = aspect > np.float32(rw) / np.float32(rh)
    pad_h = exact.div((np.float32(rh) - np.float32(rw) / aspect) / 2, rh)
    pad_w = exact.div((np.float32(rw) - exact.mul(np.float32(rh), aspect)) / 2, rw)
    zero, one = jnp.zeros_like(aspect), jnp.ones_like(aspect)
    x1, y1 = jnp.where(wide, zero, pad_w), jnp.where(wide, pad_h, zero)
    x2, y2 = jnp.where(wide, one, 1 - pad_w), jnp.where(wide, 1 - pad_h, one)
    return jnp.stack([x1, y1, x2, y2], -1)


def _project(src: jnp.ndarray, box: jnp.ndarray) -> jnp.ndarray:
    """ProjectBBox, clipped; the box itself where it misses ``src`` (the fork's fallthrough)."""
    miss = ((box[..., 0] >= src[..., 2]) | (box[..., 2] <= src[..., 0])
            | (box[..., 1] >= src[..., 3]) | (box[..., 3] <= src[..., 1]))  # fmt: skip
    size = jnp.concatenate([src[..., 2:] - src[..., :2]] * 2, -1)
    proj = jnp.clip((box - jnp.concatenate([src[..., :2]] * 2, -1)) / size, 0.0, 1.0)
    return jnp.where(miss[..., None], box, proj)


def output_bbox(box: jnp.ndarray, hw: jnp.ndarray, resize) -> tuple[jnp.ndarray, jnp.ndarray]:
    """OutputBBox of (..., 4) normalized boxes for images of (..., 2) [height, width]: the pixel
    boxes and their cached sizes."""
    if resize is not None and resize[0] == _RESIZE.FIT_LARGE_SIZE_AND_PAD:
        box = _project(_letterbox(hw, resize), box)
    scale = jnp.stack([hw[..., 1], hw[..., 0], hw[..., 1], hw[..., 0]], -1)
    out = exact.mul(jnp.clip(box, 0.0, 1.0), scale).astype(box.dtype)
    w, h = out[..., 2] - out[..., 0], out[..., 3] - out[..., 1]
    return out, jnp.where((w < 0) | (h < 0), 0.0, exact.mul(w + 1, h + 1).astype(box.dtype))


def image_ranks(det_items: jnp.ndarray, items: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(rank of each of ``items`` among the distinct image ids of the detection rows (≠ −1),
    number of those ids)."""
    s = jnp.sort(det_items)
    first = (s != -1) & jnp.concatenate([jnp.ones((1,), bool), s[1:] != s[:-1]])
    ranks = jnp.sum(first[None, :] & (s[None, :] < items[:, None]), axis=1)
    return ranks, jnp.sum(first)
