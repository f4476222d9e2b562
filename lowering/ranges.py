"""Forward and backward over ranges of Caffe's layer list, as pure jittable functions.

pycaffe's ``forward(start=, end=)`` and ``backward(start=, end=)`` run Net::ForwardFromTo and
Net::BackwardFromTo over the layers Net::Init builds (Split layers included, see
:mod:`caffe2jax.frontend.splits`). Caffe's backward is a sequence of in-place writes; here
it is one VJP of the range's forward, set up so that it leaves what Caffe leaves:

* a blob produced in the range whose reader runs *after* the range (or that no layer reads)
  sends back the diff stored in its blob, as Caffe's layers read ``top_diff`` from memory;
* with Split layers inserted every blob version has at most one reader, so the gradient with
  respect to a version is exactly the diff its reader writes into its bottom;
* Caffe's blob ``X`` (all in-place versions share one diff buffer) ends up holding the diff
  written by its earliest reader in the range whose bottom needs backward;
* parameter diffs *accumulate* (Caffe's layers add into ``param_diff``; the solver clears them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from caffe2jax.lowering.graph import Graph, Params


@dataclass(frozen=True)
class Range:
    """What BackwardFromTo(hi, lo) reads and writes, worked out once per (lo, hi)."""

    lo: int
    hi: int
    external: tuple[tuple[str, str], ...]  # (version id, Caffe blob name) read from memory
    seeds: tuple[tuple[str, str], ...]  # (version id, Caffe blob name) whose stored diff flows
    writes: tuple[tuple[str, str], ...]  # (Caffe blob name, version id) whose diff is written
    kept: tuple[str, ...] = ()  # tops of layers not rerun (read from memory)


def plan(graph: Graph, lo: int, hi: int) -> Range:
    """The blobs Caffe's layers ``lo``..``hi`` (inclusive) read and write in a backward."""
    layers = graph.caffe_layers
    reader: dict[str, int] = {}
    needs: dict[tuple[int, int], bool] = {}
    for k, caffe in enumerate(layers):
        for b in caffe.bottoms:
            reader[b] = k
    for k, caffe in enumerate(layers):
        if caffe.is_split:
            continue
        flags = graph.net.backward[caffe.key].bottoms
        for i in range(len(caffe.bottoms)):
            needs[(k, i)] = flags[i]
    for k, caffe in enumerate(layers):  # a split passes back what its readers need
        if caffe.is_split:
            needs[(k, 0)] = any(_reader_needs(layers, needs, t) for t in caffe.tops)
    produced, external, seeds, writes, kept = set(), {}, {}, {}, []
    for k in range(lo, hi + 1):
        caffe = layers[k]
        if not caffe.is_split and _from_memory(graph, caffe.key):
            for t, name in zip(caffe.tops, caffe.top_names):  # data comes from memory
                external.setdefault(t, name)
                produced.add(t)
                kept.append(t)
            continue
        for b, name in zip(caffe.bottoms, caffe.bottom_names):
            if b not in produced:
                external.setdefault(b, name)
        for t, name in zip(caffe.tops, caffe.top_names):
            produced.add(t)
            if reader.get(t, hi + 1) > hi:
                seeds[t] = name
    for k in range(hi, lo - 1, -1):  # the earliest writer wins: walk backwards, overwrite
        caffe = layers[k]
        for i, (b, name) in enumerate(zip(caffe.bottoms, caffe.bottom_names)):
            if needs.get((k, i), False):
                writes[name] = b
    return Range(lo, hi, tuple(external.items()), tuple(seeds.items()), tuple(writes.items()),
                 tuple(kept))  # fmt: skip


def host_tops(graph: Graph) -> list[tuple[str, str]]:
    """(version, user name) of the tops of layers that compute with neither bottoms nor
    params but are not graph inputs (a Python data layer): a replay must take them from the
    step, not run them again."""
    return [(t, u) for layer in graph.net.layers
            if not graph.lowerings[layer.name].source and _from_memory(graph, layer.name)
            for t, u in zip(layer.tops, layer.top_names)]  # fmt: skip


def _from_memory(graph: Graph, key: str) -> bool:
    """Layers whose tops a backward reads as stored, as Caffe's does: data sources, and
    layers with neither bottoms nor params (a Python data layer must not read again)."""
    layer = graph.net.layer(key)
    return graph.lowerings[key].source or (not layer.bottoms and not graph.decls.get(key))


def _reader_needs(layers, needs, version: str) -> bool:
    for k, caffe in enumerate(layers):
        for i, b in enumerate(caffe.bottoms):
            if b == version:
                return needs.get((k, i), False)
    return False


def param_mask(graph: Graph, lo: int, hi: int) -> Params:
    """Which owned param blobs layers ``lo``..``hi`` compute a diff for (shared ones count
    toward their owner)."""
    mask: dict[str, list[bool]] = {}
    for k in range(lo, hi + 1):
        caffe = graph.caffe_layers[k]
        if caffe.is_split:
            continue
        flags = graph.net.backward[caffe.key].params
        for j, on in enumerate(flags):
            owner, oj = graph.shared.get((caffe.key, j), (caffe.key, j))
            slots = mask.setdefault(owner, [False] * len(graph.decls[owner]))
            slots[oj] = slots[oj] or on
    return mask


def forward_fn(graph: Graph, lo: int, hi: int, keep: tuple[str, ...] = ()):
    """``(params, state, env, rng) -> (env, state)``: Caffe's ForwardFromTo(lo, hi); layers
    whose tops are all in ``keep`` take them from ``env``."""

    def run(params, state, env, rng):
        return graph.run(params, state, env, rng, start=lo, stop=hi + 1, keep=keep)

    return run


def backward_fn(graph: Graph, rng_range: Range):
    """``(params, state, env, rng, top_diffs) -> (blob diffs by name, param grads, env)``.

    ``env`` holds the range's external blobs (by version id), ``top_diffs`` the stored diffs of
    its seed blobs (by Caffe name). The forward of the range is recomputed with the rng and
    state the forward ran with, so dropout masks and the like are the same.
    """
    r = rng_range
    writes = dict(r.writes)

    def run(params, state, env, rng, top_diffs):
        taps = {v: jnp.zeros_like(env[v]) for v in set(writes.values()) if v in env}

        def objective(params, taps):
            full = {**env}
            out, _ = graph.run(params, state, full, rng, start=r.lo, stop=r.hi + 1, taps=taps,
                               keep=r.kept)  # fmt: skip
            total = jnp.zeros((), graph.dtype)
            for version, name in r.seeds:
                total = total + jnp.vdot(top_diffs[name].astype(out[version].dtype), out[version])
            return total, out

        # versions produced inside the range get their taps where they are produced
        shapes = graph.net.shapes
        for v in writes.values():
            if v not in taps:
                taps[v] = jnp.zeros(_shape(graph, shapes, v), graph.dtype)
        (_, out), (grad_params, grad_taps) = jax.value_and_grad(
            objective, argnums=(0, 1), has_aux=True
        )(params, taps)
        diffs = {name: grad_taps[v] for name, v in writes.items()}
        return diffs, grad_params, out

    return run


def _shape(graph: Graph, shapes: Mapping[str, Any], version: str) -> tuple[int, ...]:
    if version in shapes:
        return tuple(shapes[version])
    base = version.split("#split", 1)[0]  # a split top has its bottom's shape
    return tuple(shapes[base])
