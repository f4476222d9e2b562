"""SegNet's "compute BN statistics" step (SegNet-Tutorial Scripts/compute_bn_statistics.py; ENet
ships the same script), as ``caffe2jax compute_bn_stats``.

SegNet's ``BN`` layer keeps no running statistics: in ``bn_mode: LEARN`` it normalises with the
statistics of the batch in every phase (lowering/forks/segnet.py). After training, the script

1. makes the *statistics net* from the train prototxt (:func:`statistics_net`): every ``BN``
   with one top gets two more, ``<top>-mean`` and ``<top>-var`` (the batch μ and σ², before
   eps), and the TEST-only data layer is dropped, the train one kept without its
   ``include`` (here: the layers the TRAIN phase includes, every include/exclude rule
   removed), and runs it in the TEST phase over the training list;
2. averages μ and σ² over ``iterations`` forwards (default
   ``train_size // batch_size + train_size % batch_size``, the script's formula), and
   multiplies σ² by ``m/(m − 1)``, ``m = N·H·W`` of the BN's top — see :func:`fold` on how
   the script's Python 2 evaluated that;
3. folds them into the blobs (:func:`fold`): ``scale' = scale/√(σ² + 1e-9)``,
   ``shift' = shift − scale·μ/√(σ² + 1e-9)``, so that ``bn_mode: INFERENCE``'s
   ``scale'·x + shift'`` computes ``scale·(x − μ)/√(σ² + 1e-9) + shift``;
4. writes the weights (the script: ``<out_dir>/test_weights.caffemodel``) and builds the
   inference net (:func:`inference_net`): data layers replaced by an input
   ``data`` (1, C, H, W), every BN back to one top in ``bn_mode: INFERENCE``, the
   ``SoftmaxWithLoss`` and ``Accuracy`` layers replaced by a ``Softmax`` "prob" on the loss's
   scores (the script builds that net but leaves its saving commented out; here it is written
   on request).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.filter import filter_net, make_state

VAR_EPS = 1e-9  # compute_bn_statistics.py's var_eps, the BN layer's hard-coded eps
MEAN_SUFFIX, VAR_SUFFIX = "-mean", "-var"


@dataclass(frozen=True)
class BNTops:
    """A BN layer of the statistics net: its name and its output, mean and variance tops."""

    layer: str
    top: str
    mean: str
    var: str


def _is_segnet_bn(layer: caffe_pb2.LayerParameter) -> bool:
    p = layer.bn_param
    pspnet = any(p.HasField(f) for f in ("slope_filler", "bias_filler", "momentum", "eps"))
    return layer.type == "BN" and not pspnet


def statistics_net(net: caffe_pb2.NetParameter) -> tuple[caffe_pb2.NetParameter, list[BNTops]]:
    """The script's ``make_testable``: ``net`` (parsed and upgraded) with the layers of its
    TRAIN phase and no include/exclude rules, each SegNet BN in LEARN mode with its mean and
    variance tops. Returns the net and its BN layers in order."""
    out = filter_net(net, make_state("TRAIN"))
    out.ClearField("state")
    bns = []
    for layer in out.layer:
        del layer.include[:]
        del layer.exclude[:]
        layer.ClearField("phase")
        if layer.type != "BN":
            continue
        if not _is_segnet_bn(layer):
            raise NetError(
                f"layer '{layer.name}' (type BN): PSPNet's BN keeps running statistics itself; "
                "compute_bn_stats is for SegNet/ENet's BN (scale and shift blobs)"
            )
        if layer.bn_param.bn_mode != caffe_pb2.BNParameter.LEARN:
            raise NetError(
                f"layer '{layer.name}' (type BN) is in bn_mode INFERENCE already: its blobs "
                "hold folded statistics; give the train net (bn_mode LEARN)"
            )
        if len(layer.top) == 1:
            layer.top.extend([layer.top[0] + MEAN_SUFFIX, layer.top[0] + VAR_SUFFIX])
        if len(layer.top) != 3:
            raise NetError(f"layer '{layer.name}' (type BN) has {len(layer.top)} tops; 1 or 3")
        bns.append(BNTops(layer.name, *layer.top))
    if not bns:
        raise NetError(f"net '{net.name}' has no SegNet BN layer: there are no statistics to fold")
    return out, bns


def default_iterations(train_size: int, batch_size: int) -> int:
    """compute_bn_statistics.py's ``train_size // minibatch_size + train_size %
    minibatch_size`` (not a ceiling division: 10 images in batches of 4 give 4 forwards)."""
    if batch_size < 1 or train_size < 1:
        raise NetError(f"no iterations from {train_size} images in batches of {batch_size}")
    return train_size // batch_size + train_size % batch_size


@dataclass
class Averager:
    """The script's running sums: the first forward's μ and σ² of each BN, plus the others',
    divided by the count at the end. ``elements`` is m = N·H·W of each BN's top."""

    bns: list[BNTops]
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    elements: dict[str, int] = field(default_factory=dict)
    count: int = 0

    def add(self, blobs: Mapping[str, np.ndarray], top_shapes: Mapping[str, Iterable[int]]):
        """Add one forward's mean and variance tops (``blobs`` by top name)."""
        for bn in self.bns:
            for name in (bn.mean, bn.var):
                value = np.asarray(blobs[name], np.float64).reshape(-1)
                self.sums[name] = self.sums.get(name, 0) + value
            shape = tuple(top_shapes[bn.top])
            self.elements[bn.layer] = int(np.prod(shape)) // shape[1]
        self.count += 1

    def means(self) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
        """Per BN layer: (average μ, average σ², m)."""
        if not self.count:
            raise NetError("compute_bn_stats needs at least one iteration")
        return {
            bn.layer: (self.sums[bn.mean] / self.count, self.sums[bn.var] / self.count,
                       self.elements[bn.layer])
            for bn in self.bns
        }  # fmt: skip


def fold(scale, shift, mean, var, m: int, unbias: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The folded (scale', shift') of one BN, shaped as ``scale``/``shift``.

    ``unbias``: σ² ·= m/(m − 1) as the script's text reads in Python 3. The script ran under
    Python 2, where ``m = np.prod(...) / np.prod(...)`` and ``m / (m - 1)`` are integer
    divisions: the factor was ``m // (m − 1)``, 1 for every m ≥ 3, i.e. the biased average was
    folded. That is the default here (how SegNet's and ENet's released weights were made).
    """
    if m < 2:
        raise NetError(f"a BN's variance over m = {m} value(s) per channel cannot be unbiased")
    var = np.asarray(var, np.float64) * (m / (m - 1) if unbias else m // (m - 1))
    gamma = np.asarray(scale, np.float64).reshape(-1)
    beta = np.asarray(shift, np.float64).reshape(-1)
    root = np.sqrt(var + VAR_EPS)
    new_scale = gamma / root
    new_shift = beta - gamma * np.asarray(mean, np.float64) / root
    shape = np.shape(scale)
    return (new_scale.reshape(shape).astype(np.float32),
            new_shift.reshape(np.shape(shift)).astype(np.float32))  # fmt: skip


def inference_net(
    stats: caffe_pb2.NetParameter, data_shape: Iterable[int]
) -> caffe_pb2.NetParameter:
    """The script's test net (see the module doc): ``data`` an input of ``data_shape``
    (N, C, H, W) in the legacy ``input``/``input_dim`` fields, as the forks' Caffe reads."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(stats)
    losses = [layer for layer in out.layer if layer.type in ("SoftmaxWithLoss", "Accuracy")]
    if not any(layer.type == "SoftmaxWithLoss" for layer in out.layer):
        raise NetError(f"net '{stats.name}' has no SoftmaxWithLoss to turn into a Softmax 'prob'")
    scores = next(layer for layer in out.layer if layer.type == "SoftmaxWithLoss").bottom[0]
    keep = [layer for layer in out.layer
            if not layer.type.endswith("Data") and layer not in losses]  # fmt: skip
    del out.layer[:]
    out.layer.extend(keep)
    out.input.append("data")
    out.input_dim.extend(int(d) for d in data_shape)
    for layer in out.layer:
        if layer.type == "BN":
            del layer.top[1:]
            layer.bn_param.bn_mode = caffe_pb2.BNParameter.INFERENCE
    out.layer.add(name="prob", type="Softmax", bottom=[scores], top=["prob"])
    return out
