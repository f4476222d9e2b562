"""FaceBoxes' PriorBox (sfzhang15/FaceBoxes@b52cc92, src/caffe/layers/prior_box_layer.cpp): form
``faceboxes``, the PriorBox of every layer in a net of the FaceBoxes dialect. Its fields are
SSD's; what it computes differs:

* per cell and per min size s (truncated to int as SSD does): s = 32 gives 4x4 priors of side
  32 centred at (cx + 8j, cy + 8i), i, j in −2..1 (i outer); s = 64 gives 2x2 at
  (cx + 16j, cy + 16i), i, j in −1..0; any other s one prior at (cx, cy). These min-size
  priors span ``centre ∓ (s − 1)/2`` (SSD's: ``∓ s/2``);
* then, as SSD: the ``sqrt(min·max)`` prior of each max size and one prior per aspect ratio
  other than 1, spanning ``centre ∓ side/2``;
* the fork counts 21 priors per cell when there are three min sizes (whatever they are), else
  SSD's count; a layer whose priors do not add up to that count is refused (the fork would read
  or write past its top).

Types as the fork: ``center + 8j`` in float, ``(… ∓ (s − 1)/2.) / img`` in double, stored as
float; centres, steps, clip and variances exactly as SSD's PriorBox (lowering/forks/ssd.py).
Computed in NumPy when the net is compiled.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import ir
from caffe2jax.frontend.forks.catalog_ssd_derived import FACEBOXES_DENSE
from caffe2jax.lowering.forks import ssd
from caffe2jax.lowering.registry import Shape, register
from caffe2jax.lowering.util import fail

#: min size -> the pixel spacing of its densified priors (FaceBoxes' hard-coded 8 and 16)
_SPACING = {32: 8, 64: 16}


def _dense(ms: int) -> list[tuple[int, int, float, float]]:
    """The min-size priors of one min size: (dx, dy, half width, half height)."""
    half = (float(np.float32(ms)) - 1) / 2.0  # (box_width-1)/2. with a float box_width
    n = FACEBOXES_DENSE.get(ms, 1)
    step = _SPACING.get(ms, 0)
    span = range(-(n // 2), n - n // 2)
    return [(j * step, i * step, half, half) for i in span for j in span]


def faceboxes_priors(layer: ir.Layer, p) -> list[tuple[int, int, float, float]]:
    """(dx, dy, half width, half height) of each prior at one cell, in the fork's order."""
    if not p.min_size:
        raise fail(layer, "must provide min_size")
    if p.max_size and len(p.max_size) != len(p.min_size):
        raise fail(layer, "max_size must be given once per min_size")
    out: list[tuple[int, int, float, float]] = []
    ratios = ssd.aspect_ratios(p)
    for s, raw in enumerate(p.min_size):
        ms = ssd.int_size(layer, "min_size", raw)
        out += _dense(ms)
        if p.max_size:
            big = ssd.int_size(layer, "max_size", p.max_size[s])
            if p.max_size[s] <= raw:
                raise fail(layer, "max_size must be greater than min_size")
            side = float(np.float32(math.sqrt(ms * big)))
            out.append((0, 0, side / 2.0, side / 2.0))
        for r in ratios:
            if abs(float(r) - 1.0) >= 1e-6:
                root = math.sqrt(float(r))
                w, h = float(np.float32(ms * root)), float(np.float32(ms / root))
                out.append((0, 0, w / 2.0, h / 2.0))
    declared = (21 if len(p.min_size) == 3 else len(ratios) * len(p.min_size)) + len(p.max_size)
    if len(out) != declared:
        raise fail(layer, f"FaceBoxes' PriorBox declares {declared} priors per cell but its "
                          f"min sizes {[int(s) for s in p.min_size]} give {len(out)} (it "
                          "densifies 32 to 16 priors and 64 to 4, and counts 21 for any three "
                          "min sizes)")  # fmt: skip
    return out


def faceboxes_prior_boxes(layer: ir.Layer, feature: Shape, image: Shape) -> np.ndarray:
    """The (1, 2, H·W·num_priors·4) top of FaceBoxes' PriorBoxLayer as float32."""
    p = layer.param.prior_box_param
    ssd.check_image_and_step(layer, p)
    priors = np.asarray(faceboxes_priors(layer, p), np.float64)
    img_w, img_h, step_w, step_h = ssd.image_and_step(p, feature, image)
    off = np.float32(p.offset)
    hs, ws = np.meshgrid(np.arange(feature[2]), np.arange(feature[3]), indexing="ij")
    cx = ((ws + off).astype(np.float32) * np.float32(step_w)).reshape(-1, 1)
    cy = ((hs + off).astype(np.float32) * np.float32(step_h)).reshape(-1, 1)
    x = (cx + priors[:, 0].astype(np.float32)[None]).astype(np.float64)  # float + int: float
    y = (cy + priors[:, 1].astype(np.float32)[None]).astype(np.float64)
    hw, hh = priors[:, 2][None], priors[:, 3][None]
    boxes = np.stack([(x - hw) / img_w, (y - hh) / img_h, (x + hw) / img_w, (y + hh) / img_h],
                     axis=-1).astype(np.float32)  # fmt: skip
    if p.clip:
        boxes = np.clip(boxes, 0.0, 1.0)
    boxes = boxes.reshape(-1)
    variances = np.tile(np.asarray(ssd.prior_variances(layer, p), np.float32), boxes.size // 4)
    return np.stack([boxes, variances])[None]


@register("PriorBox", form="faceboxes", counts=(2, 2, 1, 1), no_force_backward=(0, 1))
def faceboxes_prior_box(layer, params, bottoms, ctx):
    """FaceBoxes' PriorBoxLayer::Forward_cpu (module docstring): priors from the shapes only."""
    feature, image = bottoms
    for name, x in (("feature", feature), ("image", image)):
        if x.ndim != 4:
            raise fail(layer, f"the {name} bottom must be 4-D, got shape {list(x.shape)}")
    top = faceboxes_prior_boxes(layer, tuple(feature.shape), tuple(image.shape))
    return [jnp.asarray(top, ctx.dtype)]
