"""MobileNet for the SSD generators (``caffe.mobilenet``, as the MobileNet-SSD generator
``examples/ssd/ssd_pascal_mobilenet.py`` imports it: ``from caffe.mobilenet import
MobileNetBody``): ``conv1`` then thirteen depthwise-separable blocks ``conv2_1`` … ``conv6``,
each a 3×3 depthwise convolution ``<block>/dw`` (group = channels, engine CAFFE) and a 1×1
``<block>/sep``, both BatchNorm (``/bn``) + Scale (``/scale``) + ReLU (``_relu``). Every
convolution writes its group and engine, as that generator's ConvBNLayer does. The module also
answers model_libs' helpers (``ConvBNLayer``, ``UnpackVariable``, ``check_if_exist`` …)."""

from __future__ import annotations

from typing import Any

from caffe2jax.pycaffe.model_libs.basics import (  # noqa: F401 - the module's public names
    ConvBNLayer,
    UnpackVariable,
    check_if_exist,
    make_if_not_exist,
)
from caffe2jax.pycaffe.net_spec import NetSpec
from caffe2jax.pycaffe.net_spec import params as P

#: MobileNet v1's blocks after conv1: (name, input channels, output channels, stride)
MOBILENET_BLOCKS = (
    ("conv2_1", 32, 64, 1),
    ("conv2_2", 64, 128, 2),
    ("conv3_1", 128, 128, 1),
    ("conv3_2", 128, 256, 2),
    ("conv4_1", 256, 256, 1),
    ("conv4_2", 256, 512, 2),
    ("conv5_1", 512, 512, 1),
    ("conv5_2", 512, 512, 1),
    ("conv5_3", 512, 512, 1),
    ("conv5_4", 512, 512, 1),
    ("conv5_5", 512, 512, 1),
    ("conv5_6", 512, 1024, 2),
    ("conv6", 1024, 1024, 1),
)

_NAMES = dict(bn_postfix="/bn", scale_postfix="/scale")


def DepthwiseConv(
    net: NetSpec,
    from_layer: str,
    block_name: str,
    num_input: int,
    num_output: int,
    stride: int,
    lr_mult: float = 1,
    use_scale: bool = True,
    **bn_params: Any,
) -> None:
    """``<block_name>/dw`` (3×3 depthwise, ``stride``) and ``<block_name>/sep`` (1×1)."""
    ConvBNLayer(
        net,
        from_layer,
        f"{block_name}/dw",
        use_bn=True,
        use_relu=True,
        num_output=num_input,
        group=num_input,
        engine=P.Convolution.CAFFE,
        kernel_size=3,
        pad=1,
        stride=stride,
        lr_mult=lr_mult,
        use_scale=use_scale,
        **_NAMES,
        **bn_params,
    )
    ConvBNLayer(
        net,
        f"{block_name}/dw",
        f"{block_name}/sep",
        use_bn=True,
        use_relu=True,
        num_output=num_output,
        group=1,
        engine=P.Convolution.DEFAULT,
        kernel_size=1,
        pad=0,
        stride=1,
        use_scale=use_scale,
        lr_mult=lr_mult,
        **_NAMES,
        **bn_params,
    )


def MobileNetBody(
    net: NetSpec, from_layer: str, output_pred: bool = False, **bn_params: Any
) -> NetSpec:
    """MobileNet v1 on ``net[from_layer]``: conv1 (3×3/2, 32) and the blocks of
    :data:`MOBILENET_BLOCKS`; ``conv5_5/sep`` (19×19 at 300) and ``conv6/sep`` feed SSD's
    head. ``output_pred`` is accepted and unused, as in that generator."""
    ConvBNLayer(
        net,
        from_layer,
        "conv1",
        use_bn=True,
        use_relu=True,
        num_output=32,
        group=1,
        engine=P.Convolution.DEFAULT,
        kernel_size=3,
        pad=1,
        stride=2,
        lr_mult=1,
        use_scale=True,
        **_NAMES,
        **bn_params,
    )
    previous = "conv1"
    for name, num_input, num_output, stride in MOBILENET_BLOCKS:
        DepthwiseConv(
            net,
            previous,
            name,
            num_input=num_input,
            num_output=num_output,
            stride=stride,
            **bn_params,
        )
        previous = f"{name}/sep"
    return net
