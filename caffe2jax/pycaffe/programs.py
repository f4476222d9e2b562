"""The compiled programs behind a pycaffe net: Caffe's ForwardFromTo and BackwardFromTo over
ranges of its layer list (:mod:`caffe2jax.lowering.ranges`), each jitted once per range and
per model (one model per input shape signature, :meth:`caffe2jax.lowering.model.Model.
reshape`; the programs are kept with it), and the lazily computed views of a training pass a
solver ran."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from caffe2jax.lowering import ranges
from caffe2jax.lowering.model import Model
from caffe2jax.lowering.python_blobs import in_pass, retrace, settle
from caffe2jax.runtime.host import startup_cache

EVERY_BLOB = None  # ``returned`` for a forward that returns every blob version


def forward(model: Model, lo: int, hi: int, returned: frozenset[str] | None) -> Callable:
    """``(params, state, env, key) -> (out, state, key, rng)``: ForwardFromTo(lo, hi), the
    net's key advanced as Caffe's RNG is by a forward. ``out`` holds the blob versions in
    ``returned`` (:data:`EVERY_BLOB`: all of them): XLA computes nothing else and copies
    nothing else out. Its executable is kept in the start-up cache
    (:mod:`caffe2jax.runtime.host.startup_cache`): a second run loads it."""
    key = ("forward", lo, hi, returned)
    if key not in model.programs:
        fn = ranges.forward_fn(model.graph, lo, hi)

        def step(params, state, env, key):
            key, rng = jax.random.split(key)
            env, state = fn(params, state, env, rng)
            if returned is not EVERY_BLOB:
                env = {v: env[v] for v in returned}
            return env, state, key, rng

        name = ("forward", lo, hi, None if returned is None else sorted(returned))
        model.programs[key] = startup_cache.program(jax.jit(step), startup_cache.model_key(model),
                                                    name)  # fmt: skip
    return model.programs[key]


def replay(model: Model, lo: int, hi: int, keep_host: bool = False) -> Callable:
    """``(params, state, env, rng) -> (env, state)``: a forward again, every blob returned,
    with the params, state, inputs and rng a forward ran with (the same values). With
    ``keep_host``, layers computing from neither bottoms nor params (DummyData) are not run:
    their tops come in ``env``, as the train step returned them."""
    key = ("replay", lo, hi, keep_host)
    if key not in model.programs:
        kept = tuple(v for v, _ in ranges.host_tops(model.graph)) if keep_host else ()
        model.programs[key] = jax.jit(ranges.forward_fn(model.graph, lo, hi, kept))
    return model.programs[key]


def backward(model: Model, lo: int, hi: int) -> tuple[ranges.Range, Callable]:
    """The plan of BackwardFromTo(hi, lo) and its jitted program."""
    key = ("backward", lo, hi)
    if key not in model.programs:
        plan = ranges.plan(model.graph, lo, hi)
        model.programs[key] = (plan, jax.jit(ranges.backward_fn(model.graph, plan)))
    return model.programs[key]


def plan(model: Model, lo: int, hi: int) -> ranges.Range:
    """What layers ``lo``..``hi`` read from memory and write (kept with the model)."""
    key = ("plan", lo, hi)
    if key not in model.programs:
        model.programs[key] = ranges.plan(model.graph, lo, hi)
    return model.programs[key]


def pass_values(model: Model, record: Any, outputs: Mapping[str, Any],
                seed_diffs: Callable[[str], Any]) -> tuple[Callable, Callable]:  # fmt: skip
    """``(data(version), diff(name))`` of a training pass ``record`` (see
    :class:`caffe2jax.runtime.train.state.Pass`) run by ``model``: every blob's data from a
    forward and every diff from a backward, each computed once, when first asked for.
    ``seed_diffs(name)`` is the top diff a seed blob starts from (its loss weight)."""
    graph = model.graph
    hi = len(graph.caffe_layers) - 1
    inputs = graph.input_versions
    cache: dict[str, Any] = {}

    def env() -> dict[str, Any]:
        given = {inputs[n]: jnp.asarray(v, graph.dtype)
                 for n, v in record.inputs.items() if n in inputs}  # fmt: skip
        given.update({v: outputs[v] for v, _ in ranges.host_tops(graph)})
        return given

    def data(version: str) -> Any:
        if "out" not in cache:
            run = replay(model, 0, hi, keep_host=True)
            args = (record.params, record.state, env(), record.rng)
            with in_pass(record.index):  # its Python layers' tops as that pass shaped them
                cache["out"] = retrace(lambda: settle(model.net, run(*args)[0]), again=True)
        return cache["out"][version]

    def diff(name: str) -> Any:
        plan_, fn = backward(model, 0, hi)
        if "diffs" not in cache:
            seeds = {n: seed_diffs(n) for _, n in plan_.seeds}
            args = (record.params, record.state, env(), record.rng, seeds)
            with in_pass(record.index):
                cache["diffs"] = retrace(lambda: settle(model.net, fn(*args)[0]), again=True)
        return cache["diffs"][name]

    return data, diff
