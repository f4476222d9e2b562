"""RCF's AutoCrop (yun-liu/rcf@ce460ff, src/caffe/layers/auto_crop_layer.cpp).

The top is bottom 0 cut to bottom 1's height and width from row ``crop_h`` and column
``crop_w``, the same for every image and channel. The offsets come from the net (the
coordinate maps of the layers between the two bottoms, as AutoCropLayer::LayerSetUp finds
them): the frontend computes them once (:mod:`caffe2jax.frontend.forks.coord_maps`) and writes
them into the layer's ``crop_param`` (axis 2, offset [h, w]). Its backward copies the top's
diff into that window and zeros elsewhere (bottom 1 gets none): the gradient of the slice.
RCF's Caffe reads past bottom 0 when the window does not fit; here that is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.lowering.registry import Context, register
from caffe2jax.lowering.util import fail

Arrays = Sequence[jax.Array]


def auto_crop_window(layer: ir.Layer, x_shape, ref_shape) -> tuple[int, int, int, int]:
    """(crop_h, crop_w, height, width): where bottom 0 is cut, refused when it does not fit."""
    if len(x_shape) != 4 or len(ref_shape) != 4:
        shapes = f"{tuple(x_shape)} and {tuple(ref_shape)}"
        raise fail(layer, f"AutoCrop takes 4-D bottoms, got {shapes}")
    offsets = list(layer.param.crop_param.offset)
    if len(offsets) != 2:
        raise fail(layer, "its crop offsets were not worked out from the net (build the net "
                          "through caffe2jax's frontend)")  # fmt: skip
    (h, w), size = offsets, (int(ref_shape[2]), int(ref_shape[3]))
    if h + size[0] > x_shape[2] or w + size[1] > x_shape[3]:
        raise fail(layer, f"bottom 0 {list(x_shape[2:])} cut at ({h}, {w}) to bottom 1's "
                          f"size {list(size)} reaches past its end")  # fmt: skip
    return h, w, size[0], size[1]


@register("AutoCrop", counts=(2, 2, 1, 1))
def auto_crop(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """AutoCropLayer::Forward_cpu (see the module)."""
    x, ref = bottoms
    h, w, height, width = auto_crop_window(layer, x.shape, ref.shape)
    n, c = x.shape[:2]
    return [lax.slice(x, (0, 0, h, w), (n, c, h + height, w + width))]
