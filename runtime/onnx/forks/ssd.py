"""SSD's feature layers in ONNX (weiliu89/caffe ssd; lowering/forks/ssd.py's semantics):

* Normalize → ``x / √(Σx² + eps)`` over the channels at each position (or over a whole sample
  with ``across_spatial``), times the scale blob (one value with ``channel_shared``).
* Permute → Transpose (the given axes, then the missing ones in order).
* PriorBox → a constant: the priors depend only on the feature map's and the image's shapes,
  so the (1, 2, H·W·num_priors·4) top is computed at export (caffe2jax's own function).
"""

from __future__ import annotations

from caffe2jax.lowering.forks.ssd import permute_order, prior_boxes
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site


@register("Normalize")
def normalize(site: Site) -> list[str]:
    p = site.param.norm_param
    ndim = len(site.bottom_shapes[0])
    g = site.g
    (x,) = site.bottoms
    axes = list(range(1, ndim)) if p.across_spatial else [1]
    total = g.reduce("ReduceSumSquare", x, axes, keepdims=True)
    norm = g.op("Sqrt", [g.op("Add", [total, g.f32(p.eps)])])
    y = g.op("Div", [x, norm])
    scale = site.array(0)
    shape = (1,) if p.channel_shared else (scale.size,) + (1,) * (ndim - 2)
    return [g.op("Mul", [y, g.const(scale.reshape(shape), hint="scale")])]


@register("Permute")
def permute(site: Site) -> list[str]:
    order = permute_order(site.layer, len(site.bottom_shapes[0]))
    if order == tuple(range(len(order))):
        return list(site.bottoms)
    return [site.g.op("Transpose", site.bottoms, perm=list(order))]


@register("PriorBox")
def prior_box(site: Site) -> list[str]:
    feature, image = site.bottom_shapes
    return [site.g.const(prior_boxes(site.layer, feature, image), hint="priors")]
