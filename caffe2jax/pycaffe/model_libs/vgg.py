"""``VGGNetBody`` and ``ZFNetBody`` of the SSD fork's model_libs: the base networks with
xavier-filled convolutions (lr_mult 1/2, decay 1/0), the fully-convolutional "reduced"
(atrous) fc6/fc7 SSD uses, and ``freeze_layers`` (their learning rates set to 0)."""

from __future__ import annotations

from caffe2jax.pycaffe.net_spec import NetSpec
from caffe2jax.pycaffe.net_spec import layers as L
from caffe2jax.pycaffe.net_spec import params as P

#: VGG16's five stages: (convolutions in the stage, their num_output)
VGG16_STAGES = ((2, 64), (2, 128), (3, 256), (3, 512), (3, 512))


def _learned() -> dict:
    return {
        "param": [dict(lr_mult=1, decay_mult=1), dict(lr_mult=2, decay_mult=0)],
        "weight_filler": dict(type="xavier"),
        "bias_filler": dict(type="constant", value=0),
    }


def _freeze(net: NetSpec, freeze_layers) -> None:
    """The named layers present in ``net`` stop learning (lr_mult and decay_mult 0)."""
    frozen = dict(_learned(), param=[dict(lr_mult=0, decay_mult=0)] * 2)
    names = net.keys()
    for name in freeze_layers:
        if name in names:
            net.update(name, dict(frozen))


def _dilated_pad(kernel_size: int, dilation: int) -> int:
    """The pad that keeps the size: ((kernel_size + (dilation-1)(kernel_size-1)) - 1) / 2."""
    return (kernel_size + (dilation - 1) * (kernel_size - 1) - 1) // 2


def _downsample(net: NetSpec, stage: int, count: int, bottom, nopool: bool, **pool) -> str:
    """The end of a stage: ``conv<stage>_<count+1>`` (3×3 stride 2) with ``nopool``, else
    ``pool<stage>`` (MAX, 2×2 stride 2 unless ``pool`` says otherwise); its name."""
    if nopool:
        name = f"conv{stage}_{count + 1}"
        net[name] = L.Convolution(
            bottom, num_output=net_outputs(stage), pad=1, kernel_size=3, stride=2, **_learned()
        )
    else:
        name = f"pool{stage}"
        net[name] = L.Pooling(bottom, pool=P.Pooling.MAX, **(pool or dict(kernel_size=2, stride=2)))
    return name


def net_outputs(stage: int) -> int:
    """VGG16's num_output in ``stage`` (1..5)."""
    return VGG16_STAGES[stage - 1][1]


def _vgg_stage(net: NetSpec, stage: int, bottom: str, **conv) -> None:
    """``conv<stage>_<i>`` (3×3, pad 1 unless ``conv`` says), each then ``relu<stage>_<i>``."""
    count, num_output = VGG16_STAGES[stage - 1]
    top = net[bottom]
    for i in range(1, count + 1):
        name = f"conv{stage}_{i}"
        net[name] = L.Convolution(
            top, num_output=num_output, **(conv or dict(pad=1, kernel_size=3)), **_learned()
        )
        net[f"relu{stage}_{i}"] = L.ReLU(net[name], in_place=True)
        top = net[f"relu{stage}_{i}"]


def _fc6_geometry(dilation: int, dilated: bool, reduced: bool) -> tuple[int, int, int]:
    """fc6 as a convolution: (kernel_size, dilation, num_output); reduced is SSD's 3×3×1024."""
    if reduced:
        return 3, dilation * (6 if dilated else 3), 1024
    return 7, dilation * (2 if dilated else 1), 4096


def _fc_layers(
    net: NetSpec, bottom: str, fully_conv: bool, reduced: bool, dropout: bool, fc6_conv: dict
) -> None:
    """fc6, relu6, [drop6], fc7, relu7, [drop7]: convolutions (``fully_conv``) or inner
    products of 4096 (no fillers written, as the fork)."""
    if fully_conv:
        net.fc6 = L.Convolution(net[bottom], **fc6_conv, **_learned())
    else:
        net.fc6 = L.InnerProduct(net.pool5, num_output=4096)
    net.relu6 = L.ReLU(net.fc6, in_place=True)
    if dropout:
        net.drop6 = L.Dropout(net.relu6, dropout_ratio=0.5, in_place=True)
    if fully_conv:
        net.fc7 = L.Convolution(
            net.relu6, num_output=1024 if reduced else 4096, kernel_size=1, **_learned()
        )
    else:
        net.fc7 = L.InnerProduct(net.relu6, num_output=4096)
    net.relu7 = L.ReLU(net.fc7, in_place=True)
    if dropout:
        net.drop7 = L.Dropout(net.relu7, dropout_ratio=0.5, in_place=True)


def VGGNetBody(
    net: NetSpec,
    from_layer: str,
    need_fc: bool = True,
    fully_conv: bool = False,
    reduced: bool = False,
    dilated: bool = False,
    nopool: bool = False,
    dropout: bool = True,
    freeze_layers=(),
    dilate_pool4: bool = False,
) -> NetSpec:
    """VGG16 on ``net[from_layer]`` as the fork writes it: conv1_1 … conv5_3 with ReLUs,
    pool1–pool4 (or stride-2 convolutions with ``nopool``; pool4 3×3 stride 1 and conv5
    dilated 2 with ``dilate_pool4``), conv5 convolutions writing their dilation; with
    ``need_fc`` pool5 (3×3 stride 1 pad 1 when ``dilated``) and fc6/fc7."""
    if from_layer not in net.keys():
        raise KeyError(f"VGGNetBody: from_layer {from_layer!r} is not a top of the net")
    bottom = from_layer
    for stage in range(1, 5):
        _vgg_stage(net, stage, bottom)
        pool4 = dict(kernel_size=3, stride=1, pad=1) if stage == 4 and dilate_pool4 else {}
        count = VGG16_STAGES[stage - 1][0]
        bottom = _downsample(net, stage, count, net[f"relu{stage}_{count}"], nopool, **pool4)
    dilation = 2 if dilate_pool4 and not nopool else 1
    _vgg_stage(net, 5, bottom, pad=_dilated_pad(3, dilation), kernel_size=3, dilation=dilation)
    if need_fc:
        pool5 = dict(pad=1, kernel_size=3, stride=1) if dilated else {}
        if nopool:  # conv5_4: stride 1 when dilated, else 2
            net.conv5_4 = L.Convolution(
                net.relu5_3,
                num_output=512,
                pad=1,
                kernel_size=3,
                stride=1 if dilated else 2,
                **_learned(),
            )
            name = "conv5_4"
        else:
            name = _downsample(net, 5, 3, net.relu5_3, False, **pool5)
        kernel, fc6_dilation, num_output = _fc6_geometry(dilation, dilated, reduced)
        fc6 = dict(
            num_output=num_output,
            pad=_dilated_pad(kernel, fc6_dilation),
            kernel_size=kernel,
            dilation=fc6_dilation,
        )
        _fc_layers(net, name, fully_conv, reduced, dropout, fc6)
    _freeze(net, freeze_layers)
    return net


def _zf_fc6(dilated: bool, reduced: bool) -> dict:
    """ZFNet's fc6 as a convolution, as the fork writes each of its four variants."""
    if dilated:
        if reduced:
            return dict(num_output=1024, pad=5, kernel_size=3, dilation=5)
        return dict(num_output=4096, pad=5, kernel_size=6, dilation=2)
    if reduced:
        return dict(num_output=1024, pad=2, kernel_size=3, dilation=2)
    return dict(num_output=4096, pad=2, kernel_size=6)


def _zf_convs(net: NetSpec, from_layer: str) -> None:
    """conv1–conv5 of ZFNet with ReLUs, LRN (within channel, CAFFE engine) and pooling."""
    lrn = dict(
        local_size=3, alpha=0.00005, beta=0.75, norm_region=P.LRN.WITHIN_CHANNEL, engine=P.LRN.CAFFE
    )
    net.conv1 = L.Convolution(
        net[from_layer], num_output=96, pad=3, kernel_size=7, stride=2, **_learned()
    )
    net.relu1 = L.ReLU(net.conv1, in_place=True)
    net.norm1 = L.LRN(net.relu1, **lrn)
    net.pool1 = L.Pooling(net.norm1, pool=P.Pooling.MAX, pad=1, kernel_size=3, stride=2)
    net.conv2 = L.Convolution(
        net.pool1, num_output=256, pad=2, kernel_size=5, stride=2, **_learned()
    )
    net.relu2 = L.ReLU(net.conv2, in_place=True)
    net.norm2 = L.LRN(net.relu2, **lrn)
    net.pool2 = L.Pooling(net.norm2, pool=P.Pooling.MAX, pad=1, kernel_size=3, stride=2)
    top = net.pool2
    for i, num_output in ((3, 384), (4, 384), (5, 256)):
        net[f"conv{i}"] = L.Convolution(
            top, num_output=num_output, pad=1, kernel_size=3, **_learned()
        )
        net[f"relu{i}"] = L.ReLU(net[f"conv{i}"], in_place=True)
        top = net[f"relu{i}"]


def ZFNetBody(
    net: NetSpec,
    from_layer: str,
    need_fc: bool = True,
    fully_conv: bool = False,
    reduced: bool = False,
    dilated: bool = False,
    dropout: bool = True,
    need_fc8: bool = False,
    freeze_layers=(),
) -> NetSpec:
    """ZFNet on ``net[from_layer]`` as the fork writes it: conv1–conv5, with ``need_fc``
    pool5 (stride 1 when ``dilated``) and fc6/fc7, with ``need_fc8`` fc8 (1000) and ``prob``."""
    if from_layer not in net.keys():
        raise KeyError(f"ZFNetBody: from_layer {from_layer!r} is not a top of the net")
    _zf_convs(net, from_layer)
    if need_fc:
        net.pool5 = L.Pooling(
            net.relu5, pool=P.Pooling.MAX, pad=1, kernel_size=3, stride=1 if dilated else 2
        )
        _fc_layers(net, "pool5", fully_conv, reduced, dropout, _zf_fc6(dilated, reduced))
    if need_fc8:
        last = net[net.keys()[-1]]
        if fully_conv:
            net.fc8 = L.Convolution(last, num_output=1000, kernel_size=1, **_learned())
        else:
            net.fc8 = L.InnerProduct(last, num_output=1000)
        net.prob = L.Softmax(net.fc8)
    _freeze(net, freeze_layers)
    return net
