"""ENet's BN-absorber (TimoSaemann/ENet scripts/BN-absorber-enet.py) as ``caffe2jax absorb_bn``:
fold each linear layer that follows a convolution into that convolution's blobs.

After compute_bn_stats a SegNet/ENet ``BN`` in ``bn_mode: INFERENCE`` computes
``y = γ'·x + β'`` per channel, and ENet's SpatialDropout in its non-TRAIN phase ``y = x/(1−p)``
(lowering/forks/enet.py). Following a Convolution they fold into it:

* BN: ``W'[o] = W[o]·γ'[o]``, ``b'[o] = b[o]·γ'[o] + β'[o]`` (a convolution without a bias term
  gets one, as the script's ``add_bias_to_conv`` does, with ``b = 0``);
* SpatialDropout (phase other than TRAIN): ``W' = W/(1−p)``, ``b' = b/(1−p)``.

The folded layer is removed and the convolution writes its top. The script finds "the
previous layer" by position in the prototxt and skips ``bn0_1`` (after a Concat) and BNs after
a Deconvolution; here a layer is folded when the blob it reads was written by a
``Convolution`` (not Deconvolution) that nothing else reads, so the absorbed net computes what
the original one does, layer for layer. (The script scales only the first dropout's
convolution — its ``return net`` sits inside the loop — while removing every dropout layer; this
version scales each one.)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.forks.enet import spatial_dropout_args

Blobs = Mapping[str, list[np.ndarray]]
SPATIAL_DROPOUT = ("spatial_dropout", "SpatialDropoutLayer")


def _linear_factor(layer: caffe_pb2.LayerParameter, blobs: Blobs):
    """(γ, β) per channel of a foldable layer (β None: no shift), or None when it is not one."""
    if len(layer.bottom) != 1 or len(layer.top) != 1:
        return None
    if layer.type == "BN" and len(blobs.get(layer.name, [])) == 2:
        if layer.bn_param.bn_mode != caffe_pb2.BNParameter.INFERENCE:
            raise NetError(f"layer '{layer.name}' (type BN) is in bn_mode LEARN: fold its "
                           "statistics first (caffe2jax compute_bn_stats)")  # fmt: skip
        gamma, beta = blobs[layer.name]
        return np.ravel(gamma).astype(np.float64), np.ravel(beta).astype(np.float64)
    p = layer.python_param
    if layer.type == "Python" and (p.module, p.layer) == SPATIAL_DROPOUT:
        phase, rate = spatial_dropout_args(p.param_str, f"layer '{layer.name}': ")
        if phase != "TRAIN":
            return np.float64(1.0 / (1.0 - rate)), None
    return None


def _producers(net: caffe_pb2.NetParameter) -> tuple[list, list[list[int]]]:
    """For each layer, the index of the layer that wrote each of its bottoms (None: a net
    input), and for each layer the layers reading what it wrote."""
    written: dict[str, int] = {}
    sources, readers = [], [[] for _ in net.layer]
    for i, layer in enumerate(net.layer):
        sources.append([written.get(b) for b in layer.bottom])
        for j in sources[-1]:
            if j is not None:
                readers[j].append(i)
        for t in layer.top:
            written[t] = i
    return sources, readers


def _target(net, i: int, sources, readers) -> int | None:
    """The convolution layer ``i`` folds into, or None."""
    j = sources[i][0]
    if j is None or net.layer[j].type != "Convolution" or readers[j] != [i]:
        return None
    if len(net.layer[j].top) != 1:
        return None
    top = net.layer[i].top[0]
    between = net.layer[j + 1 : i]
    if top != net.layer[j].top[0] and any(top in (*m.bottom, *m.top) for m in between):
        return None  # the name is in use between them: renaming would shadow it
    return j


def _fold(conv: caffe_pb2.LayerParameter, blobs: dict, gamma, beta) -> None:
    weight = np.asarray(blobs[conv.name][0], np.float64)
    shape = (-1,) + (1,) * (weight.ndim - 1)
    channels = weight.shape[0]
    bias = np.zeros(channels) if len(blobs[conv.name]) < 2 else blobs[conv.name][1]
    bias = np.ravel(bias).astype(np.float64)
    gamma = np.broadcast_to(gamma, (channels,))
    new_bias = bias * gamma + (0 if beta is None else beta)
    blobs[conv.name] = [(weight * gamma.reshape(shape)).astype(np.float32),
                        new_bias.astype(np.float32)]  # fmt: skip
    if not conv.convolution_param.bias_term:
        conv.convolution_param.bias_term = True


def absorb(net: caffe_pb2.NetParameter, blobs: Blobs) -> tuple[caffe_pb2.NetParameter, dict, list]:
    """The absorbed net, its blobs (layer name → arrays) and the names of the folded layers."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(net)
    new_blobs = {k: [np.asarray(b) for b in v] for k, v in blobs.items()}
    folded = []
    changed = True
    while changed:
        changed = False
        sources, readers = _producers(out)
        for i, layer in enumerate(out.layer):
            factor = _linear_factor(layer, new_blobs)
            j = None if factor is None else _target(out, i, sources, readers)
            if j is None:
                continue
            _fold(out.layer[j], new_blobs, *factor)
            out.layer[j].top[0] = layer.top[0]
            folded.append(layer.name)
            new_blobs.pop(layer.name, None)
            del out.layer[i]
            changed = True
            break
    return out, new_blobs, folded
