"""RCF's AutoCrop as a caffe2jax user layer (docs/forks.md, "Bringing your own fork").

AutoCropLayer (yun-liu/rcf, src/caffe/layers/auto_crop_layer.cpp): the top is bottom 0 cut to
bottom 1's height and width, starting at row crop_h_ and column crop_w_ (the same offset for
every image and channel); its backward copies the top's diff back into that window and leaves
zeros elsewhere, which is the gradient of the slice, so JAX's own gradient is used.
"""

from jax import lax

import caffe2jax


def auto_crop(bottoms, params, layer_param, ctx):
    """Bottom 0 cut to bottom 1's spatial size at (offset_h, offset_w)."""
    x, ref = bottoms
    p = layer_param.auto_crop_param  # the fork's own field, read by name
    n, c = x.shape[:2]
    height, width = ref.shape[2], ref.shape[3]
    start = (0, 0, p.offset_h, p.offset_w)
    return [lax.slice(x, start, (n, c, p.offset_h + height, p.offset_w + width))]


caffe2jax.register_layer("AutoCrop", auto_crop, counts=(2, 2, 1, 1))
