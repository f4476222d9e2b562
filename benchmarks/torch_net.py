"""A PyTorch twin of a compiled Caffe net, the peer of the GPU table.

The twin walks the same layer list (caffe2jax's Net IR, blob names in SSA form) with
``torch.nn.functional``, holding the same param blobs (copied from caffe2jax's ``init``), so
both sides do the same arithmetic on the same shapes. Only the layer types of the table's nets
(AlexNet, GoogLeNet, VGG-16) are translated; any other type raises. Caffe's pooling rounds up
(torch's ``ceil_mode``), LRN is ACROSS_CHANNELS (torch's ``local_response_norm`` uses the same
formula), and SoftmaxWithLoss is the mean cross entropy times the layer's loss weight.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_MAX, _AVE = 0, 1


def _pair(value: Any, h: int, w: int, default: int) -> tuple[int, int]:
    """Caffe's repeated kernel/stride/pad field, or its ``_h``/``_w`` fields."""
    if h or w:
        return int(h), int(w)
    values = list(value) if hasattr(value, "__len__") else [value]
    if not values:
        return default, default
    return (int(values[0]), int(values[-1]))


def _conv(F, p, blobs, x):
    cp = p.convolution_param
    s = _pair(cp.stride, cp.stride_h, cp.stride_w, 1)
    pad = _pair(cp.pad, cp.pad_h, cp.pad_w, 0)
    d = _pair(cp.dilation, 0, 0, 1)
    bias = blobs[1] if cp.bias_term else None
    return F.conv2d(x, blobs[0], bias, s, pad, d, cp.group or 1)


def _pool(F, p, x):
    pp = p.pooling_param
    if pp.global_pooling:
        k, s, pad = tuple(x.shape[-2:]), (1, 1), (0, 0)
    else:
        k = _pair(pp.kernel_size, pp.kernel_h, pp.kernel_w, 1)
        s = _pair(pp.stride, pp.stride_h, pp.stride_w, 1)
        pad = _pair(pp.pad, pp.pad_h, pp.pad_w, 0)
    if pp.pool == _MAX:
        return F.max_pool2d(x, k, s, pad, ceil_mode=True)
    if pp.pool == _AVE:
        return F.avg_pool2d(x, k, s, pad, ceil_mode=True)
    raise NotImplementedError("stochastic pooling has no torch twin")


def _inner_product(torch, p, blobs, x):
    ip = p.inner_product_param
    axis = ip.axis if ip.HasField("axis") else 1
    x = x.flatten(axis)
    w = blobs[0].t() if ip.transpose else blobs[0]
    y = x @ w.t()
    return y + blobs[1] if ip.bias_term else y


def _layer(torch, F, layer, blobs, xs, training):
    """Tops of one layer (a list) from its bottoms ``xs``."""
    p, kind = layer.param, layer.type
    if kind == "Convolution":
        return [_conv(F, p, blobs, xs[0])]
    if kind == "Pooling":
        return [_pool(F, p, xs[0])]
    if kind == "ReLU":
        slope = p.relu_param.negative_slope
        return [F.leaky_relu(xs[0], slope) if slope else F.relu(xs[0])]
    if kind == "LRN":
        lp = p.lrn_param
        if lp.norm_region != 0:
            raise NotImplementedError("WITHIN_CHANNEL LRN has no torch twin here")
        return [F.local_response_norm(xs[0], lp.local_size, lp.alpha, lp.beta, lp.k)]
    if kind == "InnerProduct":
        return [_inner_product(torch, p, blobs, xs[0])]
    if kind == "Dropout":
        return [F.dropout(xs[0], p.dropout_param.dropout_ratio, training=training)]
    if kind == "Concat":
        axis = p.concat_param.axis if p.concat_param.HasField("axis") else 1
        return [torch.cat(xs, axis)]
    if kind == "SoftmaxWithLoss":
        return [F.cross_entropy(xs[0].float(), xs[1].long())]
    raise NotImplementedError(f"layer '{layer.name}' of type {kind} has no torch twin")


def twin(model: Any, params: dict[str, list], device: str = "cuda"):
    """``(forward, tensors)``: ``forward(inputs) -> loss`` runs ``model``'s TRAIN net in torch
    with copies of ``params``; ``tensors`` are the torch param blobs (requires_grad)."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's own idiom

    tensors = {
        name: [torch.tensor(np.asarray(b), device=device, requires_grad=True) for b in blobs]
        for name, blobs in params.items()
    }
    layers = [la for la in model.net.layers if la.type not in ("Input", "Data")]

    def forward(inputs: dict[str, Any]):
        env = dict(inputs)
        loss = 0.0
        for layer in layers:
            tops = _layer(torch, F, layer, tensors.get(layer.name, []),
                          [env[b] for b in layer.bottoms], True)  # fmt: skip
            for top, value, weight in zip(layer.tops, tops, layer.loss_weights):
                env[top] = value
                if weight:
                    loss = loss + weight * value
        return loss

    return forward, [t for blobs in tensors.values() for t in blobs]
