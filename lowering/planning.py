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

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from caffe2jax.frontend import ir
from caffe2jax.lowering import layout
from caffe2jax.lowering.engines.policy import EnginePolicy
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


@dataclass(frozen=True)
class RunPlan:
    """The steps of one run, and the blobs left channels-last at its end (restored)."""

    steps: tuple[Step, ...]
    held: frozenset[str]


def plan_run(graph, start: int, stop: int | None, keep: Collection[str]) -> RunPlan:
    """The :class:`RunPlan` of ``graph`` over Caffe's layers ``start``..``stop - 1``. Source
    layers, and layers whose tops are all in ``keep``, do not run (their tops come from the
    caller, in Caffe's layout)."""
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
    steps = []
    for k, to, nhwc in zip(run, moves.bottoms, moves.nhwc_tops):
        caffe = layers[k]
        if caffe.is_split:
            steps.append(Step(caffe.bottoms, caffe.tops, nhwc_tops=nhwc))
            continue
        layer = graph.layer_by_name[caffe.key]
        lowering = graph.lowerings[layer.name]
        fn = lowering.nhwc_fn if layer.name in graph.nhwc_layers else lowering.fn
        dtype = graph.precision.layer_dtype(lowering.bf16, graph.dtype)
        engine = graph.engines.get(layer.name)
        steps.append(Step(caffe.bottoms, layer.tops, layer, fn, dtype, engine, to, nhwc))
    return RunPlan(tuple(steps), moves.held)
