"""``CreateMultiBoxHead`` of the SSD fork's model_libs: for each source layer an optional
Normalize (``<src>_norm``) and intermediate ConvBNLayer (``<src>_inter``), the location and
confidence convolutions (``<src>_mbox_loc``, ``<src>_mbox_conf``) each permuted to NHWC and
flattened, a PriorBox (``<src>_mbox_priorbox``); then ``mbox_loc``, ``mbox_conf`` (Concat on
axis 1) and ``mbox_priorbox`` (axis 2), and ``mbox_objectness`` with ``use_objectness``."""

from __future__ import annotations

from typing import Any

from caffe2jax.frontend.errors import CaffeError
from caffe2jax.pycaffe.model_libs.basics import ConvBNLayer
from caffe2jax.pycaffe.net_spec import NetSpec, Top
from caffe2jax.pycaffe.net_spec import layers as L


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]


def _check_lengths(from_layers, **per_source) -> None:
    """Each list given per source layer has one entry per source layer (the fork's asserts)."""
    for name, values in per_source.items():
        if values and len(values) != len(from_layers):
            raise CaffeError(
                f"CreateMultiBoxHead: from_layers and {name} should have the same length "
                f"({len(from_layers)} and {len(values)})"
            )


def priors_per_location(min_size: list, max_size: list, aspect_ratio: list, flip: bool) -> int:
    """The fork's count of priors a location has: (1 + ratios, or 2 + ratios with max sizes)
    per min size, plus the flipped ratios (``flip``). PriorBox itself drops a ratio of 1 and
    repeats; the generators never pass one."""
    per_size = (2 if max_size else 1) + len(aspect_ratio)
    if flip:
        per_size += len(aspect_ratio)
    return per_size * len(min_size)


def _prediction(net: NetSpec, source: str, name: str, num_output: int, conv: dict) -> Top:
    """``name`` (ConvBNLayer without ReLU), ``<name>_perm`` (order 0 2 3 1), ``<name>_flat``."""
    ConvBNLayer(net, source, name, use_relu=False, num_output=num_output, stride=1, **conv)
    net[f"{name}_perm"] = L.Permute(net[name], order=[0, 2, 3, 1])
    net[f"{name}_flat"] = L.Flatten(net[f"{name}_perm"], axis=1)
    return net[f"{name}_flat"]


def _prior_box(net: NetSpec, source: str, data_layer: str, sizes: tuple, options: dict) -> Top:
    """``<source>_mbox_priorbox`` on (source, data): min_size, clip, variance, offset, then as
    given max_size, aspect_ratio with flip, step, img_size (or img_h/img_w when they differ)."""
    min_size, max_size, aspect_ratio, step = sizes
    name = f"{source}_mbox_priorbox"
    net[name] = L.PriorBox(
        net[source],
        net[data_layer],
        min_size=min_size,
        clip=options["clip"],
        variance=options["prior_variance"],
        offset=options["offset"],
    )
    if max_size:
        net.update(name, {"max_size": max_size})
    if aspect_ratio:
        net.update(name, {"aspect_ratio": aspect_ratio, "flip": options["flip"]})
    if step:
        net.update(name, {"step": step})
    height, width = options["img_height"], options["img_width"]
    if height != 0 and width != 0:
        net.update(
            name, {"img_size": height} if height == width else {"img_h": height, "img_w": width}
        )
    return net[name]


def _source_sizes(i: int, min_sizes, max_sizes, aspect_ratios, steps) -> tuple:
    """(min_size, max_size, aspect_ratio, step) of source ``i``, each a list but the step."""
    min_size = _as_list(min_sizes[i])
    aspect_ratio = _as_list(aspect_ratios[i]) if len(aspect_ratios) > i else []
    max_size = _as_list(max_sizes[i]) if len(max_sizes) > i else []
    if max_size and len(max_size) != len(min_size):
        raise CaffeError("CreateMultiBoxHead: max_size and min_size should have the same length")
    step = steps[i] if len(steps) > i else []
    return min_size, max_size, aspect_ratio, step


def _source(net: NetSpec, i: int, from_layer: str, options: dict, conv: dict) -> tuple:
    """Source ``i``'s Normalize and intermediate layers, then its loc, conf, priorbox (and
    objectness) tops."""
    normalizations, inter_depth = options["normalizations"], options["inter_layer_depth"]
    if normalizations and normalizations[i] != -1:
        net[f"{from_layer}_norm"] = L.Normalize(
            net[from_layer],
            scale_filler=dict(type="constant", value=normalizations[i]),
            across_spatial=False,
            channel_shared=False,
        )
        from_layer = f"{from_layer}_norm"
    if inter_depth and inter_depth[i] > 0:
        inter = f"{from_layer}_inter"
        ConvBNLayer(
            net,
            from_layer,
            inter,
            use_bn=conv["use_bn"],
            use_relu=True,
            lr_mult=conv["lr_mult"],
            num_output=inter_depth[i],
            kernel_size=3,
            pad=1,
            stride=1,
            **options["bn_param"],
        )
        from_layer = inter
    sizes = _source_sizes(
        i, *(options[k] for k in ("min_sizes", "max_sizes", "aspect_ratios", "steps"))
    )
    priors = priors_per_location(sizes[0], sizes[1], sizes[2], options["flip"])
    num_classes, post = options["num_classes"], options["postfix"]
    loc_output = priors * 4 * (1 if options["share_location"] else num_classes)
    loc = _prediction(net, from_layer, f"{from_layer}_mbox_loc{post[0]}", loc_output, conv)
    conf = _prediction(
        net, from_layer, f"{from_layer}_mbox_conf{post[1]}", priors * num_classes, conv
    )
    prior = _prior_box(net, from_layer, options["data_layer"], sizes, options)
    objectness = None
    if options["use_objectness"]:
        objectness = _prediction(net, from_layer, f"{from_layer}_mbox_objectness", priors * 2, conv)
    return loc, conf, prior, objectness


def CreateMultiBoxHead(
    net: NetSpec,
    data_layer: str = "data",
    num_classes: int | None = None,
    from_layers=(),
    use_objectness: bool = False,
    normalizations=(),
    use_batchnorm: bool = True,
    lr_mult: float = 1,
    use_scale: bool = True,
    min_sizes=(),
    max_sizes=(),
    prior_variance=(0.1,),
    aspect_ratios=(),
    steps=(),
    img_height: int = 0,
    img_width: int = 0,
    share_location: bool = True,
    flip: bool = True,
    clip: bool = True,
    offset: float = 0.5,
    inter_layer_depth=(),
    kernel_size: Any = 1,
    pad: Any = 0,
    conf_postfix: str = "",
    loc_postfix: str = "",
    **bn_param: Any,
) -> list[Top]:
    """SSD's multibox head over ``from_layers`` (see the module's text); returns [mbox_loc,
    mbox_conf, mbox_priorbox(, mbox_objectness)] for MultiBoxLoss or DetectionOutput.
    ``use_scale`` is accepted and unused, as in the fork."""
    if not num_classes or num_classes <= 0:
        raise CaffeError("CreateMultiBoxHead: num_classes must be a positive number")
    if len(min_sizes) != len(from_layers):
        raise CaffeError(
            "CreateMultiBoxHead: from_layers and min_sizes should have the same "
            f"length ({len(from_layers)} and {len(min_sizes)})"
        )
    _check_lengths(
        from_layers,
        normalizations=normalizations,
        max_sizes=max_sizes,
        aspect_ratios=aspect_ratios,
        steps=steps,
        inter_layer_depth=inter_layer_depth,
    )
    if data_layer not in net.keys():
        raise CaffeError(f"CreateMultiBoxHead: data_layer {data_layer!r} is not in the net")
    options = dict(
        data_layer=data_layer,
        num_classes=num_classes,
        share_location=share_location,
        use_objectness=use_objectness,
        normalizations=normalizations,
        inter_layer_depth=inter_layer_depth,
        min_sizes=min_sizes,
        max_sizes=max_sizes,
        aspect_ratios=aspect_ratios,
        steps=steps,
        flip=flip,
        clip=clip,
        offset=offset,
        prior_variance=list(prior_variance),
        img_height=img_height,
        img_width=img_width,
        postfix=(loc_postfix, conf_postfix),
        bn_param=bn_param,
    )
    conv = dict(use_bn=use_batchnorm, lr_mult=lr_mult, kernel_size=kernel_size, pad=pad, **bn_param)
    heads = [_source(net, i, name, options, conv) for i, name in enumerate(from_layers)]
    names = ["mbox_loc", "mbox_conf", "mbox_priorbox"] + (["mbox_objectness"] * use_objectness)
    for column, name in enumerate(names):
        net[name] = L.Concat(*(head[column] for head in heads), axis=2 if column == 2 else 1)
    return [net[name] for name in names]
