"""soeaver's FPN (soeaver/caffe-model's ``*-fpn`` detectors, on soeaver's caffe-priv): Interp
with two bottoms, form ``blob_size`` (frontend/forks/forms.py).

caffe-priv's InterpLayer (soeaver/py-RFCN-priv@ec89b86, caffe-priv/src/caffe/layers/
interp_layer.cpp) is PSPNet's with ``interp_param.use_blob_size`` (field 7, default false),
checked first in Reshape: the top takes bottom 1's height and width (``CHECK_GT(bottom.size(),
1)``); otherwise its size rules are PSPNet's (:func:`caffe2jax.lowering.forks.deeplab.
interp_size`) and bottom 1 is unused. The sampling is util/interp.cpp's, as PSPNet's
(:func:`caffe2jax.lowering.forks.deeplab.interp_to`). Backward reaches bottom 0 only (bottom 1
gives a size, no gradient).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from caffe2jax.frontend import ir
from caffe2jax.lowering.forks.deeplab import interp_size, interp_to
from caffe2jax.lowering.registry import Context, register
from caffe2jax.lowering.util import fail

Arrays = Sequence[jax.Array]


def blob_size(layer: ir.Layer, x_shape: Sequence[int], ref_shape: Sequence[int]):
    """InterpLayer::Reshape of caffe-priv: the top's (height, width)."""
    if len(x_shape) != 4 or len(ref_shape) != 4:
        raise fail(layer, f"Interp takes 4-D bottoms, got {tuple(x_shape)} and {tuple(ref_shape)}")
    p = layer.param.interp_param
    if not p.use_blob_size:
        return interp_size(layer, (x_shape[2], x_shape[3]))
    if p.pad_beg > 0 or p.pad_end > 0:
        raise fail(layer, "Interp supports only pad_beg, pad_end <= 0 (cropping)")
    if min(x_shape[2:]) + p.pad_beg + p.pad_end <= 0:
        raise fail(layer, f"pad_beg/pad_end crop the whole input {list(x_shape[2:])}")
    if min(ref_shape[2:]) <= 0:
        raise fail(layer, f"bottom 1 gives an empty size {list(ref_shape[2:])}")
    return int(ref_shape[2]), int(ref_shape[3])


@register("Interp", form="blob_size", counts=(2, 2, 1, 1))
def interp_blob_size(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context):
    """caffe-priv's InterpLayer with two bottoms (see the module)."""
    x, ref = bottoms
    return [interp_to(layer, x, blob_size(layer, x.shape, ref.shape), nhwc=False)]
