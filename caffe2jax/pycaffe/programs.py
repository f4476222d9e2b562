"""The compiled programs behind a pycaffe net: Caffe's ForwardFromTo and BackwardFromTo over
ranges of its layer list (:mod:`caffe2jax.lowering.ranges`), each jitted once per range, and
the lazily computed views of a training pass a solver ran."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from caffe2jax.lowering import ranges
from caffe2jax.lowering.graph import Graph


class RangePrograms:
    """Jitted programs of one graph by (kind, first layer, last layer)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._jitted: dict[tuple, Any] = {}

    def __len__(self) -> int:
        return len(self._jitted)

    def forward(self, lo: int, hi: int) -> Callable:
        """``(params, state, env, key) -> (env, state, key, rng)``: layers ``lo``..``hi``,
        the net's key advanced as Caffe's RNG is by a forward."""
        key = ("forward", lo, hi)
        if key not in self._jitted:
            fn = ranges.forward_fn(self.graph, lo, hi)

            def step(params, state, env, key):
                key, rng = jax.random.split(key)
                env, state = fn(params, state, env, rng)
                return env, state, key, rng

            self._jitted[key] = jax.jit(step)
        return self._jitted[key]

    def replay(self, lo: int, hi: int) -> Callable:
        """A forward again with the rng it ran with; layers whose tops came from the host
        (Python data layers) are not run again."""
        key = ("replay", lo, hi)
        if key not in self._jitted:
            kept = tuple(v for v, _ in ranges.host_tops(self.graph))
            self._jitted[key] = jax.jit(ranges.forward_fn(self.graph, lo, hi, kept))
        return self._jitted[key]

    def backward(self, lo: int, hi: int) -> tuple[ranges.Range, Callable]:
        """The plan of BackwardFromTo(hi, lo) and its jitted program."""
        key = ("backward", lo, hi)
        if key not in self._jitted:
            plan = ranges.plan(self.graph, lo, hi)
            self._jitted[key] = (plan, jax.jit(ranges.backward_fn(self.graph, plan)))
        return self._jitted[key]


def pass_values(programs: RangePrograms, record: Any, outputs: Mapping[str, Any],
                seed_diffs: Callable[[str], Any]) -> tuple[Callable, Callable]:  # fmt: skip
    """``(data(version), diff(name))`` of a training pass ``record`` (see
    :class:`caffe2jax.runtime.train.state.Pass`): every blob's data from a forward and every
    diff from a backward, each computed once, when first asked for. ``seed_diffs(name)`` is
    the top diff a seed blob starts from (its loss weight)."""
    graph = programs.graph
    hi = len(graph.caffe_layers) - 1
    forward = programs.replay(0, hi)
    plan, backward = programs.backward(0, hi)
    inputs = graph.input_versions
    cache: dict[str, Any] = {}

    def env() -> dict[str, Any]:
        given = {inputs[n]: jnp.asarray(v, graph.dtype)
                 for n, v in record.inputs.items() if n in inputs}  # fmt: skip
        given.update({v: outputs[v] for v, _ in ranges.host_tops(graph)})
        return given

    def data(version: str) -> Any:
        if "out" not in cache:
            cache["out"] = forward(record.params, record.state, env(), record.rng)[0]
        return cache["out"][version]

    def diff(name: str) -> Any:
        if "diffs" not in cache:
            seeds = {n: seed_diffs(n) for _, n in plan.seeds}
            cache["diffs"] = backward(record.params, record.state, env(), record.rng, seeds)[0]
        return cache["diffs"][name]

    return data, diff
