"""``ResBody``, ``ResNet101Body`` and ``ResNet152Body`` of the SSD fork's model_libs: Kaiming
He's bottleneck ResNets with the names of the published deploy nets (``res2a_branch2a``,
``bn2a_branch2a``, ``scale2a_branch2a``, ``res2a``, ``res2a_relu`` …)."""

from __future__ import annotations

from typing import Any

from caffe2jax.pycaffe.model_libs.basics import ConvBNLayer
from caffe2jax.pycaffe.net_spec import NetSpec
from caffe2jax.pycaffe.net_spec import layers as L
from caffe2jax.pycaffe.net_spec import params as P


def _branch(
    net: NetSpec,
    source: str,
    block: str,
    branch: str,
    use_relu: bool,
    num_output: int,
    kernel: int,
    stride: int,
    dilation: int,
    bn_param: dict,
) -> str:
    """``res<block>_<branch>`` with ``bn<block>_<branch>`` and ``scale<block>_<branch>``
    (a 3×3 is padded to keep the size at ``dilation``, written only when > 1); its name."""
    conv = dict(num_output=num_output, kernel_size=kernel, pad=dilation if kernel == 3 else 0,
                stride=stride, use_scale=True, conv_prefix=f"res{block}_", conv_postfix="",
                bn_prefix=f"bn{block}_", bn_postfix="", scale_prefix=f"scale{block}_",
                scale_postfix="")  # fmt: skip
    if dilation != 1:
        conv["dilation"] = dilation
    ConvBNLayer(net, source, branch, use_bn=True, use_relu=use_relu, **conv, **bn_param)
    return f"res{block}_{branch}"


def ResBody(
    net: NetSpec, from_layer: str, block_name: str, out2a: int, out2b: int, out2c: int,
    stride: int, use_branch1: bool, dilation: int = 1, **bn_param: Any,
) -> None:  # fmt: skip
    """One bottleneck block ``res<block_name>``: branch1 (1×1 projection, no ReLU) when
    ``use_branch1`` else the identity, branch2a (1×1, ``stride``), branch2b (3×3, padded to
    keep the size at ``dilation``), branch2c (1×1, no ReLU), then Eltwise (SUM) and ReLU."""
    block = block_name
    branch1 = from_layer
    if use_branch1:
        branch1 = _branch(net, from_layer, block, "branch1", False, out2c, 1, stride, 1, bn_param)
    top = _branch(net, from_layer, block, "branch2a", True, out2a, 1, stride, 1, bn_param)
    top = _branch(net, top, block, "branch2b", True, out2b, 3, 1, dilation, bn_param)
    top = _branch(net, top, block, "branch2c", False, out2c, 1, 1, 1, bn_param)
    net[f"res{block}"] = L.Eltwise(net[branch1], net[top])
    net[f"res{block}_relu"] = L.ReLU(net[f"res{block}"], in_place=True)


def _blocks(blocks3: int, blocks4: int, use_dilation_conv5: bool) -> list[tuple]:
    """Every block in order: (name, width, stride, use_branch1, dilation); ``a`` projects."""
    numbered = {2: ["b", "c"], 3: [f"b{i}" for i in range(1, blocks3 + 1)],
                4: [f"b{i}" for i in range(1, blocks4 + 1)], 5: ["b", "c"]}  # fmt: skip
    stride5, dilation = (1, 2) if use_dilation_conv5 else (2, 1)
    out = []
    for stage, width in ((2, 64), (3, 128), (4, 256), (5, 512)):
        first_stride = {2: 1, 5: stride5}.get(stage, 2)
        dil = dilation if stage == 5 else 1
        out.append((f"{stage}a", width, first_stride, True, dil))
        out += [(f"{stage}{b}", width, 1, False, dil) for b in numbered[stage]]
    return out


def _resnet_body(
    net: NetSpec, from_layer: str, blocks3: int, blocks4: int, use_pool5: bool,
    use_dilation_conv5: bool, bn_param: dict,
) -> NetSpec:  # fmt: skip
    """conv1 (7×7/2, ``bn_conv1``/``scale_conv1``), pool1, res2a–c, res3a + 3b1…3b<n>, res4a +
    4b1…4b<m>, res5a–c (stride 1 dilation 2 with ``use_dilation_conv5``), [pool5 global AVE]."""
    names = dict(conv_prefix="", conv_postfix="", bn_prefix="bn_", bn_postfix="",
                 scale_prefix="scale_", scale_postfix="")  # fmt: skip
    ConvBNLayer(net, from_layer, "conv1", use_bn=True, use_relu=True, num_output=64,
                kernel_size=7, pad=3, stride=2, **names, **bn_param)  # fmt: skip
    net.pool1 = L.Pooling(net.conv1, pool=P.Pooling.MAX, kernel_size=3, stride=2)
    previous = "pool1"
    for block, width, stride, branch1, dilation in _blocks(blocks3, blocks4, use_dilation_conv5):
        ResBody(net, previous, block, out2a=width, out2b=width, out2c=4 * width, stride=stride,
                use_branch1=branch1, dilation=dilation, **bn_param)  # fmt: skip
        previous = f"res{block}"
    if use_pool5:
        net.pool5 = L.Pooling(net.res5c, pool=P.Pooling.AVE, global_pooling=True)
    return net


def ResNet101Body(
    net: NetSpec,
    from_layer: str,
    use_pool5: bool = True,
    use_dilation_conv5: bool = False,
    **bn_param: Any,
) -> NetSpec:
    """ResNet-101 (3b1–3b3, 4b1–4b22) on ``net[from_layer]``, as the fork writes it."""
    return _resnet_body(net, from_layer, 3, 22, use_pool5, use_dilation_conv5, bn_param)


def ResNet152Body(
    net: NetSpec,
    from_layer: str,
    use_pool5: bool = True,
    use_dilation_conv5: bool = False,
    **bn_param: Any,
) -> NetSpec:
    """ResNet-152 (3b1–3b7, 4b1–4b35) on ``net[from_layer]``, as the fork writes it."""
    return _resnet_body(net, from_layer, 7, 35, use_pool5, use_dilation_conv5, bn_param)
