"""Planning a lowered net before anything is traced: each layer's engine, and the steps of a run.

The engine plan (:func:`plan_engines`): every layer type with an engine rule
(``@convolution.engine``, ``@pooling.engine``…) asks the net's engine policy
(lowering/engines/policy.py) for its form, from the layer's bottom shapes, the dtype it computes
in, whether it runs channels-last (lowering/layout.py) and the type of the layer that computed
each bottom. ``Graph.engines`` holds the answers: where each convolution runs is one lookup.

A run plan (:func:`plan_run`): for a range of Caffe's layers (Net::ForwardFromTo over the list
with Split layers), which layers run, with which function (plain or channels-last), dtype and
engine, and which blobs cross layouts — so ``Graph.run`` only executes it.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from caffe2jax.frontend import ir
from caffe2jax.lowering import layout
from caffe2jax.lowering.engines.policy import EnginePolicy
from caffe2jax.lowering.layers import normalization
from caffe2jax.lowering.registry import Lowering, LoweringFn, Planning


def producers(net: ir.Net) -> dict[str, str]:
    """The Caffe type of the layer that computed each blob version (splits are transparent:
    the IR's bottoms name their producer's tops)."""
    return {top: layer.type for layer in net.layers for top in layer.tops}


def plan_engines(
    net: ir.Net,
    lowerings: Mapping[str, Lowering],
    policy: EnginePolicy,
    nhwc_layers: Collection[str],
    layer_dtype: Callable[[Lowering], Any],
) -> dict[str, Any]:
    """Each layer's engine choice, for the layers whose type has an engine rule."""
    made_by = producers(net)
    engines = {}
    for layer in net.layers:
        lowering = lowerings[layer.name]
        if lowering.source or any(t not in net.shapes for t in layer.tops):
            continue  # a data layer, or past the layers a prefix model reshapes
        planning = Planning(
            policy,
            layer_dtype(lowering),
            layer.name in nhwc_layers,
            tuple(made_by.get(b, "") for b in layer.bottoms),
        )
        shapes = [tuple(net.shapes[b]) for b in layer.bottoms]
        choice = lowering.choose_engine(layer, shapes, planning)
        if choice is not None:
            engines[layer.name] = choice
    return engines


@dataclass(frozen=True)
class Step:
    """One step of a run: a Split (``layer`` None: its tops are its bottom) or a layer, with
    the function it runs (its plain or channels-last form), its dtype and engine choice, the
    transposes its bottoms need (per bottom: "nhwc", "nchw" or None) and the tops it leaves
    channels-last."""

    bottoms: tuple[str, ...]
    tops: tuple[str, ...]
    layer: ir.Layer | None = None
    fn: LoweringFn | None = None
    dtype: Any = None
    engine: Any = None
    transposes: tuple[str | None, ...] = ()
    nhwc_tops: frozenset[str] = frozenset()
    chain: tuple[ir.Layer, ...] = ()  # the layers fused after ``layer`` (their blobs follow its)


@dataclass(frozen=True)
class RunPlan:
    """The steps of one run, and the blobs left channels-last at its end (restored)."""

    steps: tuple[Step, ...]
    held: frozenset[str]


def plan_run(
    graph, start: int, stop: int | None, keep: Collection[str], fuse: bool = True
) -> RunPlan:
    """The :class:`RunPlan` of ``graph`` over Caffe's layers ``start``..``stop - 1``. Source
    layers, and layers whose tops are all in ``keep``, do not run (their tops come from the
    caller, in Caffe's layout). With ``fuse``, each BatchNorm → Scale → ReLU chain
    :func:`batch_norm_chain` accepts runs as one step."""
    layers = graph.caffe_layers
    run = []
    for k in range(start, len(layers) if stop is None else stop):
        caffe = layers[k]
        if not caffe.is_split:
            layer = graph.layer_by_name[caffe.key]
            if graph.lowerings[layer.name].source or (keep and all(t in keep for t in layer.tops)):
                continue
        run.append(k)
    moves = layout.transposes(layers, graph.nhwc_layers, run)
    entries = list(zip(run, moves.bottoms, moves.nhwc_tops))
    uses = Counter(b for layer in graph.net.layers for b in layer.bottoms)
    steps, i = [], 0
    while i < len(entries):
        k, to, nhwc = entries[i]
        caffe = layers[k]
        if caffe.is_split:
            steps.append(Step(caffe.bottoms, caffe.tops, nhwc_tops=nhwc))
            i += 1
            continue
        chain = batch_norm_chain(graph, [e[0] for e in entries[i : i + 3]], uses) if fuse else ()
        if chain:
            steps.append(_chain_step(graph, chain, to, entries[i : i + 3]))
            i += 3
            continue
        layer = graph.layer_by_name[caffe.key]
        lowering = graph.lowerings[layer.name]
        fn = lowering.nhwc_fn if layer.name in graph.nhwc_layers else lowering.fn
        dtype = graph.precision.layer_dtype(lowering.bf16, graph.dtype)
        engine = graph.engines.get(layer.name)
        steps.append(Step(caffe.bottoms, layer.tops, layer, fn, dtype, engine, to, nhwc))
        i += 1
    return RunPlan(tuple(steps), moves.held)


def batch_norm_chain(graph, ks: list[int], uses: Mapping[str, int]) -> tuple[ir.Layer, ...]:
    """(BatchNorm, Scale, ReLU) if Caffe's layers ``ks`` are three consecutive layers that
    lowering/engines/chains.py runs as one function in a train step (the policy's
    ``fuse_batch_norm_chains``): channels-last, BatchNorm with batch statistics, Scale with
    learned per-channel blobs, ReLU with slope 0, each intermediate top read by the next layer
    only, one dtype; else ()."""
    if not graph.policy.fuse_batch_norm_chains or len(ks) < 3 or ks[2] - ks[0] != 2:
        return ()
    caffe = [graph.caffe_layers[k] for k in ks]
    if any(c.is_split for c in caffe):
        return ()
    bn, scale, relu = (graph.layer_by_name[c.key] for c in caffe)
    if (bn.type, scale.type, relu.type) != ("BatchNorm", "Scale", "ReLU"):
        return ()
    linked = scale.bottoms == bn.tops and relu.bottoms == scale.tops and len(scale.tops) == 1
    dtypes = {graph.precision.layer_dtype(graph.lowerings[x.name].bf16, graph.dtype)
              for x in (bn, scale, relu)}  # fmt: skip
    return (bn, scale, relu) if (
        linked
        and all(x.name in graph.nhwc_layers for x in (bn, scale, relu))
        and normalization.uses_batch_statistics(bn, graph.phase)
        and relu.param.relu_param.negative_slope == 0
        and uses[bn.tops[0]] == 1
        and uses[scale.tops[0]] == 1
        and len(dtypes) == 1
    ) else ()  # fmt: skip


def _chain_step(graph, chain: tuple[ir.Layer, ...], to, entries) -> Step:
    """The one step of a BatchNorm → Scale → ReLU chain (normalization.batch_norm_chain)."""
    bn, scale, relu = chain
    fn = functools.partial(normalization.batch_norm_chain, scale.param.scale_param.bias_term)
    dtype = graph.precision.layer_dtype(graph.lowerings[bn.name].bf16, graph.dtype)
    nhwc = frozenset().union(*(e[2] for e in entries))
    tops = (*bn.tops, *scale.tops, *relu.tops)
    bottoms = graph.caffe_layers[entries[0][0]].bottoms
    return Step(bottoms, tops, bn, fn, dtype, None, to, nhwc, chain=(scale, relu))
