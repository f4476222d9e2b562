"""``InceptionTower`` and ``InceptionV3Body`` of the SSD fork's model_libs: Inception-v3 with
the TensorFlow export's names (``conv``, ``conv_1`` …, ``mixed``, ``mixed_1/tower/conv`` …,
``mixed_N/join``), each convolution batch-normalized with a Bias (no Scale) and a ReLU."""

from __future__ import annotations

from typing import Any

from caffe2jax.pycaffe.model_libs.basics import ConvBNLayer
from caffe2jax.pycaffe.net_spec import NetSpec, Top
from caffe2jax.pycaffe.net_spec import layers as L
from caffe2jax.pycaffe.net_spec import params as P

AVE, MAX = P.Pooling.AVE, P.Pooling.MAX


def InceptionTower(
    net: NetSpec, from_layer: str, tower_name: str, layer_params: list[dict], **bn_param: Any
) -> Top:
    """A chain of layers ``<tower_name>/<name>`` from ``from_layer``: a Pooling where the
    layer's full name contains ``pool``, else a ConvBNLayer (BatchNorm + Bias + ReLU); the
    chain's last top. The fork deletes ``name`` from the caller's dicts; this leaves them."""
    for spec in layer_params:
        param = {k: v for k, v in spec.items() if k != "name"}
        tower_layer = f"{tower_name}/{spec['name']}"
        if "pool" in tower_layer:
            net[tower_layer] = L.Pooling(net[from_layer], **param)
        else:
            ConvBNLayer(
                net,
                from_layer,
                tower_layer,
                use_bn=True,
                use_relu=True,
                use_scale=False,
                **param,
                **bn_param,
            )
        from_layer = tower_layer
    return net[from_layer]


def _conv(name: str, num_output: int, kernel: Any, pad: Any = 0, stride: Any = 1) -> dict:
    """A convolution's entry in a tower (rectangular kernels as [h, w] with stride [1, 1])."""
    if isinstance(kernel, list):
        stride = [1, 1]
    return dict(name=name, num_output=num_output, kernel_size=kernel, pad=pad, stride=stride)


def _pool(pool: int, kernel: int, pad: int, stride: int) -> dict:
    return dict(name="pool", pool=pool, kernel_size=kernel, pad=pad, stride=stride)


def _stem(net: NetSpec, from_layer: str, bn_param: dict) -> str:
    """conv, conv_1, conv_2, pool, conv_3, conv_4, pool_1: 299×299 → 35×35×192."""
    layers = (
        ("conv", 32, 3, 0, 2),
        ("conv_1", 32, 3, 0, 1),
        ("conv_2", 64, 3, 1, 1),
        "pool",
        ("conv_3", 80, 1, 0, 1),
        ("conv_4", 192, 3, 0, 1),
        "pool_1",
    )
    for layer in layers:
        if isinstance(layer, str):
            net[layer] = L.Pooling(net[from_layer], pool=MAX, kernel_size=3, stride=2, pad=0)
            from_layer = layer
            continue
        name, num_output, kernel, pad, stride = layer
        ConvBNLayer(
            net,
            from_layer,
            name,
            use_bn=True,
            use_relu=True,
            num_output=num_output,
            kernel_size=kernel,
            pad=pad,
            stride=stride,
            use_scale=False,
            **bn_param,
        )
        from_layer = name
    return from_layer


def _towers_35(out: str, pool_conv: int) -> list[tuple[str, list[dict]]]:
    """mixed, mixed_1, mixed_2: 1×1; 1×1→5×5; 1×1→3×3→3×3; 3×3 average pool→1×1."""
    return [
        (out, [_conv("conv", 64, 1)]),
        (f"{out}/tower", [_conv("conv", 48, 1), _conv("conv_1", 64, 5, 2)]),
        (
            f"{out}/tower_1",
            [_conv("conv", 64, 1), _conv("conv_1", 96, 3, 1), _conv("conv_2", 96, 3, 1)],
        ),
        (f"{out}/tower_2", [_pool(AVE, 3, 1, 1), _conv("conv", pool_conv, 1)]),
    ]


def _towers_17(out: str, n: int) -> list[tuple[str, list[dict]]]:
    """mixed_4 … mixed_7: 1×1; 1×1→1×7→7×1; 1×1→7×1→1×7→7×1→1×7; average pool→1×1."""
    return [
        (out, [_conv("conv", 192, 1)]),
        (
            f"{out}/tower",
            [
                _conv("conv", n, 1),
                _conv("conv_1", n, [1, 7], [0, 3]),
                _conv("conv_2", 192, [7, 1], [3, 0]),
            ],
        ),
        (
            f"{out}/tower_1",
            [
                _conv("conv", n, 1),
                _conv("conv_1", n, [7, 1], [3, 0]),
                _conv("conv_2", n, [1, 7], [0, 3]),
                _conv("conv_3", n, [7, 1], [3, 0]),
                _conv("conv_4", 192, [1, 7], [0, 3]),
            ],
        ),
        (f"{out}/tower_2", [_pool(AVE, 3, 1, 1), _conv("conv", 192, 1)]),
    ]


#: The grid reductions: mixed_3 (35 → 17) and mixed_8 (17 → 8)
REDUCTIONS = {
    "mixed_3": [
        ("mixed_3", [_conv("conv", 384, 3, 0, 2)]),
        (
            "mixed_3/tower",
            [_conv("conv", 64, 1), _conv("conv_1", 96, 3, 1), _conv("conv_2", 96, 3, 0, 2)],
        ),
        ("mixed_3", [_pool(MAX, 3, 0, 2)]),
    ],
    "mixed_8": [
        ("mixed_8/tower", [_conv("conv", 192, 1), _conv("conv_1", 320, 3, 0, 2)]),
        (
            "mixed_8/tower_1",
            [
                _conv("conv", 192, 1),
                _conv("conv_1", 192, [1, 7], [0, 3]),
                _conv("conv_2", 192, [7, 1], [3, 0]),
                _conv("conv_3", 192, 3, 0, 2),
            ],
        ),
        ("mixed_8", [_pool(MAX, 3, 0, 2)]),
    ],
}


def _join(net: NetSpec, out: str, from_layer: str, towers, bn_param: dict) -> str:
    """Each tower from ``from_layer``, concatenated on channels as ``<out>/join``."""
    tops = [InceptionTower(net, from_layer, name, layers, **bn_param) for name, layers in towers]
    net[f"{out}/join"] = L.Concat(*tops, axis=1)
    return f"{out}/join"


def _split(net: NetSpec, source: str, name: str, n: int, bn_param: dict) -> Top:
    """``<name>/conv`` (1×3) and ``<name>/conv_1`` (3×1) from ``source``, concatenated as
    ``<name>`` (the expanded filter bank of mixed_9 and mixed_10)."""
    halves = [
        InceptionTower(net, source, name, [_conv("conv", n, [1, 3], [0, 1])], **bn_param),
        InceptionTower(net, source, name, [_conv("conv_1", n, [3, 1], [1, 0])], **bn_param),
    ]
    net[name] = L.Concat(*halves, axis=1)
    return net[name]


def _mixed_8x8(net: NetSpec, out: str, from_layer: str, pool: int, bn_param: dict) -> str:
    """mixed_9 / mixed_10: 1×1 (320); 1×1 (384) split; 1×1 (448)→3×3 (384) split; pool→1×1."""
    tops = [InceptionTower(net, from_layer, out, [_conv("conv", 320, 1)], **bn_param)]
    InceptionTower(net, from_layer, f"{out}/tower", [_conv("conv", 384, 1)], **bn_param)
    tops.append(_split(net, f"{out}/tower/conv", f"{out}/tower/mixed", 384, bn_param))
    InceptionTower(
        net,
        from_layer,
        f"{out}/tower_1",
        [_conv("conv", 448, 1), _conv("conv_1", 384, 3, 1)],
        **bn_param,
    )
    tops.append(_split(net, f"{out}/tower_1/conv_1", f"{out}/tower_1/mixed", 384, bn_param))
    tops.append(
        InceptionTower(
            net,
            from_layer,
            f"{out}/tower_2",
            [_pool(pool, 3, 1, 1), _conv("conv", 192, 1)],
            **bn_param,
        )
    )
    net[f"{out}/join"] = L.Concat(*tops, axis=1)
    return f"{out}/join"


def InceptionV3Body(
    net: NetSpec, from_layer: str, output_pred: bool = False, **bn_param: Any
) -> NetSpec:
    """Inception-v3 on ``net[from_layer]`` as the fork writes it (BatchNorm with a Bias, no
    Scale); with ``output_pred`` pool_3 (8×8 AVE), ``softmax`` (InnerProduct 1008) and
    ``softmax_prob``."""
    top = _stem(net, from_layer, bn_param)
    for i, out in enumerate(("mixed", "mixed_1", "mixed_2")):
        top = _join(net, out, top, _towers_35(out, 32 if i == 0 else 64), bn_param)
    top = _join(net, "mixed_3", top, REDUCTIONS["mixed_3"], bn_param)
    for i, n in ((4, 128), (5, 160), (6, 160), (7, 192)):
        top = _join(net, f"mixed_{i}", top, _towers_17(f"mixed_{i}", n), bn_param)
    top = _join(net, "mixed_8", top, REDUCTIONS["mixed_8"], bn_param)
    top = _mixed_8x8(net, "mixed_9", top, AVE, bn_param)
    top = _mixed_8x8(net, "mixed_10", top, MAX, bn_param)
    if output_pred:
        net.pool_3 = L.Pooling(net[top], pool=AVE, kernel_size=8, pad=0, stride=1)
        net.softmax = L.InnerProduct(net.pool_3, num_output=1008)
        net.softmax_prob = L.Softmax(net.softmax)
    return net
