"""BatchNorm and Scale folded into the Convolution before them, for forward-only programs
(what ONNX Runtime does with a Conv → BatchNormalization → Mul/Add chain at session creation).

A Convolution → BatchNorm → Scale chain computes, per output channel c,
``γ_c · (conv(x)_c + b_c − μ_c) / √(σ²_c + eps) + β_c`` (Caffe's BatchNormLayer with
``use_global_stats``: μ, σ² its blobs 0, 1 times 1/blob 2, 0 when blob 2 is 0; ScaleLayer's
learned γ and, with ``bias_term``, β). That is one convolution with weights ``k_c · W_c`` and
bias ``k_c · (b_c − μ_c) + β_c``, ``k_c = γ_c / √(σ²_c + eps)``: :class:`Folder` computes them
on the host (float64, rounded once to float32) and hands the forward a params tree in which the
convolution's weight slot holds :class:`Folded` and the BatchNorm and Scale layers hold
:class:`Skipped` (the graph passes their bottom through: lowering/graph.py).

Folded only where no blob a user reads changes value: BatchNorm and Scale in place on the
convolution's top (the three versions one blob name), the convolution's top read by the
BatchNorm alone and the BatchNorm's by the Scale alone, one bottom and one top each, no
shared params, BatchNorm with global statistics (TEST's default), Scale a learned (C,) blob on
axis 1. The versions before the Scale's then hold the chain's result (a caller of
``Model.apply`` reading them by version name sees the folded values). Never stale: a chain is
folded again whenever one of its arrays is not the very ``jax.Array`` it was folded from.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import ir

Chain = tuple[str, str | None, str | None, str | None]  # Convolution, BatchNorm, Scale, ReLU


@jax.tree_util.register_pytree_node_class
class Folded:
    """A Convolution's weights with a chain folded in: ``weights`` (Caffe layout, or oneDNN's
    packed: packing.py), ``bias`` (C,) or None, and the slope of the ReLU after them, or None
    (fused.py runs all three in one oneDNN primitive)."""

    def __init__(self, weights: Any, bias: Any, relu: float | None = None):
        self.weights, self.bias, self.relu = weights, bias, relu

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.weights.shape)

    def tree_flatten(self):
        return (self.weights, self.bias), self.relu

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, aux)


@jax.tree_util.register_pytree_node_class
class Skipped:
    """A BatchNorm's or Scale's params slot in a folded tree: its top is its bottom."""

    def tree_flatten(self):
        return (), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls()


# an exported forward (runtime/host/startup_cache.py) keeps a folded tree's structure
for _cls in (Folded, Skipped):
    with contextlib.suppress(ValueError):  # registered already (the module loaded twice)
        jax.export.register_pytree_node_serialization(
            _cls, serialized_name=f"caffe2jax.{_cls.__name__}",
            serialize_auxdata=lambda aux: repr(aux).encode(),
            deserialize_auxdata=lambda data: None if data == b"None" else float(data),
        )  # fmt: skip


def skipped(blobs: Any) -> bool:
    """Whether a layer's params (from a folded tree) say it was folded into a convolution."""
    return isinstance(blobs, Skipped)


def epilogue(y: jax.Array, w: Folded, channels_last: bool) -> jax.Array:
    """``y`` plus a folded convolution's bias on its channel axis (last, or 1), through its
    ReLU (Caffe's ReLULayer: ``y`` where ``y > 0``, else ``negative_slope·y``)."""
    if w.bias is not None:
        y = y + jnp.reshape(w.bias, (-1,) if channels_last else (-1,) + (1,) * (y.ndim - 2))
    if w.relu is None:
        return y
    return jnp.where(y > 0, y, y * w.relu if w.relu else jnp.zeros_like(y))


def _readers(net: ir.Net) -> dict[str, list[ir.Layer]]:
    out: dict[str, list[ir.Layer]] = {}
    for layer in net.layers:
        for bottom in layer.bottoms:
            out.setdefault(bottom, []).append(layer)
    return out


def _next(readers, layer: ir.Layer, kind: str) -> ir.Layer | None:
    """The one layer of type ``kind`` reading ``layer``'s one top in place, if that is all
    that reads it."""
    found = readers.get(layer.tops[0], []) if len(layer.tops) == 1 else []
    if len(found) != 1 or found[0].type != kind or found[0].form:
        return None
    after = found[0]
    if len(after.bottoms) != 1 or len(after.tops) != 1:
        return None
    return after


def _foldable(net: ir.Net, conv: ir.Layer, bn: ir.Layer, scale: ir.Layer) -> bool:
    """In place, BatchNorm on global statistics, Scale a (C,) blob on axis 1."""
    names = {layer.top_names[0] for layer in (conv, bn, scale)}
    p = bn.param.batch_norm_param
    global_stats = p.use_global_stats if p.HasField("use_global_stats") else net.phase == ir.TEST
    s = scale.param.scale_param
    return len(names) == 1 and global_stats and s.axis == 1 and s.num_axes == 1


def chains(net: ir.Net, shared: Mapping[tuple[str, int], tuple[str, int]]) -> list[Chain]:
    """The Convolution (→ BatchNorm → Scale) (→ ReLU) chains of ``net`` that can be folded
    (see the module docstring), at least one layer after the convolution; ``shared``: (layer,
    blob) → its owner's, for the layers sharing."""
    readers, sharing = _readers(net), {s[0] for pair in shared.items() for s in pair}
    out = []
    for conv in net.layers:
        if conv.type != "Convolution" or conv.form or conv.name in sharing or \
                len(conv.bottoms) != 1 or conv.param.convolution_param.axis != 1:  # fmt: skip
            continue
        bn = _next(readers, conv, "BatchNorm")
        scale = bn and _next(readers, bn, "Scale")
        if not (scale and not {bn.name, scale.name} & sharing and _foldable(net, conv, bn, scale)):
            bn = scale = None
        relu = _next(readers, scale or conv, "ReLU")
        if relu and relu.top_names[0] != conv.top_names[0]:
            relu = None
        if scale or relu:
            out.append((conv.name, bn and bn.name, scale and scale.name, relu and relu.name))
    return out


def fold(w, b, statistics, gamma, beta, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The weights and bias of a convolution (``w``, bias ``b`` or None) followed by Caffe's
    BatchNorm on global ``statistics`` (mean sum, variance sum, factor) and Scale (``gamma``,
    ``beta`` or None), in float64 rounded once to float32."""
    mean_sum, var_sum, factor = (np.asarray(a, np.float64) for a in statistics)
    inv = 0.0 if factor.ravel()[0] == 0 else 1.0 / factor.ravel()[0]
    k = np.asarray(gamma, np.float64) / np.sqrt(var_sum * inv + eps)
    shift = -mean_sum * inv if b is None else np.asarray(b, np.float64) - mean_sum * inv
    bias = k * shift + (0.0 if beta is None else np.asarray(beta, np.float64))
    w = np.asarray(w, np.float64) * k.reshape((-1,) + (1,) * (np.ndim(w) - 1))
    return w.astype(np.float32), bias.astype(np.float32)


class Folder:
    """Folds a planned net's chains (:func:`chains`) into the params a forward-only program
    takes: each convolution's slots hold :class:`Folded` (and :class:`Skipped` for its own
    bias, which the Folded carries), each BatchNorm, Scale and ReLU of a chain Skipped."""

    def __init__(self, net: ir.Net, found: list[Chain]):
        self.chains = [
            (c, b, s, r, b and net.layer(b).param.batch_norm_param.eps,
             r and net.layer(r).param.relu_param.negative_slope,
             net.layer(c).param.convolution_param.bias_term)
            for c, b, s, r in found
        ]  # fmt: skip
        self._made: dict[str, tuple[tuple, list]] = {}

    def __call__(self, params: dict, state: Mapping) -> dict:
        if not self.chains or any(isinstance(x, jax.core.Tracer)
                                  for x in jax.tree.leaves((params, dict(state)))):  # fmt: skip
            return params
        out = dict(params)
        for conv, bn, scale, relu, eps, slope, has_bias in self.chains:
            sources = (*params[conv], *(state[bn] if bn else ()), *(params[scale] if bn else ()))
            slope = None if relu is None else float(slope)
            out[conv] = self._folded(conv, sources, eps, slope, has_bias)
            out.update({name: Skipped() for name in (bn, scale, relu) if name})
        return out

    def _folded(self, conv: str, sources: tuple, eps, slope: float | None, has_bias: bool):
        made = self._made.get(conv)
        if (
            made is not None
            and len(made[0]) == len(sources)
            and all(a is b and isinstance(a, jax.Array) for a, b in zip(made[0], sources))
        ):
            return made[1]
        weights, bias = sources[0], sources[1] if has_bias else None
        if eps is not None:  # a BatchNorm and a Scale
            n = 1 + has_bias
            gamma, beta = sources[n + 3], sources[n + 4] if len(sources) > n + 4 else None
            folded = fold(weights, bias, sources[n : n + 3], gamma, beta, eps)
            weights, bias = (jnp.asarray(a) for a in folded)
        blobs = [Folded(weights, bias, slope), *([Skipped()] if has_bias else [])]
        self._made[conv] = (sources, blobs)  # holds the sources: identities cannot pass on
        return blobs
