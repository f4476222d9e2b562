"""Caffe's ``caffe time`` for a compiled net: per-layer and whole-net forward/backward times.

Caffe times each layer's Forward and Backward call inside its net loop. Here a whole net runs
as one fused XLA program, inside which layers have no separate time; so the per-layer figures
come from **compiled per-layer programs**: for each of Caffe's layers (splits included) one
jitted forward (``Graph.run`` over that layer alone, on the bottoms the whole forward produced)
and one jitted backward (the layer's VJP applied to top diffs of ones, its residuals computed
beforehand, so only the backward is timed). Their sums are Caffe's "Average Forward pass" and
"Average Backward pass"; beside them stand the times of the one fused program the net really
runs as (forward, and forward + backward), each program's compile time, and the peak memory.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from caffe2jax.lowering.model import Model


@dataclass
class LayerTime:
    name: str
    forward_ms: float
    backward_ms: float


@dataclass
class NetTimes:
    """What ``caffe2jax time`` prints."""

    layers: list[LayerTime] = field(default_factory=list)
    fused_forward_ms: float = 0.0
    fused_forward_backward_ms: float = 0.0
    compile_forward_s: float = 0.0
    compile_forward_backward_s: float = 0.0
    trace_forward_s: float = 0.0
    trace_forward_backward_s: float = 0.0
    compile_layers_s: float = 0.0
    peak_bytes: int = 0
    peak_source: str = ""
    seeded: str = "loss"

    @property
    def forward_ms(self) -> float:
        return sum(t.forward_ms for t in self.layers)

    @property
    def backward_ms(self) -> float:
        return sum(t.backward_ms for t in self.layers)


def timed(fn: Callable[[], Any], iterations: int) -> float:
    """Milliseconds per call of ``fn`` after one warm-up call (results waited for)."""
    jax.block_until_ready(fn())
    start = time.perf_counter()
    out = None
    for _ in range(iterations):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / max(iterations, 1) * 1e3


def compiled(fn: Callable, *args: Any) -> tuple[Any, float, float]:
    """``jax.jit(fn)`` compiled ahead of time for ``args``; the seconds tracing + lowering to
    StableHLO took, and the seconds XLA's compile took (or loading it from the persistent
    compilation cache)."""
    start = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    middle = time.perf_counter()
    program = lowered.compile()
    return program, middle - start, time.perf_counter() - middle


def _has_loss(model: Model) -> bool:
    return any(w for layer in model.net.layers for w in layer.loss_weights)


def _scalar(model: Model, blobs: dict[str, jax.Array]) -> jax.Array:
    """The net's loss; for a net without one, the sum of its outputs (top diffs of ones)."""
    if _has_loss(model):
        return model.graph.objective(blobs)
    names = model.net.blob_names
    return sum(jnp.sum(blobs[names[o]]) for o in model.outputs)


def with_backward(model: Model) -> Model:
    """``model`` itself if it has a loss; else the same net with ``force_backward``, so its
    backward computes every diff (as Caffe's time does for such a net only with it set)."""
    if _has_loss(model):
        return model
    net = dataclasses.replace(model.graph.net, force_backward=True)
    return Model(net, model.inputs, model.dtype, model.graph.precision, model.graph.channels_last)


def _peak(programs: list[Any]) -> tuple[int, str]:
    """Peak device memory: the allocator's figure where the device keeps one (GPU), else the
    largest XLA buffer assignment (arguments + outputs + temporaries) of the programs."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"]), "device allocator peak"
    best = 0
    for program in programs:
        m = program.memory_analysis()
        if m is not None:
            used = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                    - m.alias_size_in_bytes)  # fmt: skip
            best = max(best, int(used))
    return best, "XLA buffer assignment of the fused programs"


def time_net(model: Model, inputs: dict[str, Any], iterations: int, *, per_layer: bool = True,
             seed: int = 0) -> NetTimes:  # fmt: skip
    """Per-layer and fused forward/backward times of ``model`` on ``inputs``."""
    model = with_backward(model)
    graph = model.graph
    params, state = model.init(seed)
    key = jax.random.key(seed)
    out = NetTimes(seeded="loss" if _has_loss(model) else "outputs")

    def loss(p, s, x):
        blobs, _ = model.apply(p, s, x, key)
        return _scalar(model, blobs)

    def outputs(p, s, x):  # what a deploy forward returns: the net's outputs, not every blob
        blobs = model.apply(p, s, x, key)[0]
        return {name: blobs[name] for name in model.outputs}

    fwd, out.trace_forward_s, out.compile_forward_s = compiled(outputs, params, state, inputs)
    fb, out.trace_forward_backward_s, out.compile_forward_backward_s = compiled(
        jax.value_and_grad(loss), params, state, inputs)  # fmt: skip
    out.fused_forward_ms = timed(lambda: fwd(params, state, inputs), iterations)
    out.fused_forward_backward_ms = timed(lambda: fb(params, state, inputs), iterations)
    out.peak_bytes, out.peak_source = _peak([fwd, fb])
    if per_layer:
        every_blob = jax.jit(lambda p, s, x: model.apply(p, s, x, key)[0])
        env = {**graph.feed(inputs), **every_blob(params, state, inputs)}
        out.layers, out.compile_layers_s = _per_layer(graph, params, state, env, key, iterations)
    return out


def _layer_params(graph, layer_key: str | None, params) -> dict[str, Any]:
    """The params one layer reads: its own, and the owners of the blobs it shares."""
    if layer_key is None:
        return {}
    names = {layer_key} | {owner for (name, _), (owner, _) in graph.shared.items()
                           if name == layer_key}  # fmt: skip
    return {n: params[n] for n in names if n in params}


def _per_layer(graph, params, state, env, key, iterations) -> tuple[list[LayerTime], float]:
    times, compile_s = [], 0.0
    for k, caffe in enumerate(graph.caffe_layers):
        if caffe.key is not None and graph.lowerings[caffe.key].source:
            continue
        p = _layer_params(graph, caffe.key, params)
        bottoms = {b: env[b] for b in caffe.bottoms}

        def run(p, bottoms, k=k, tops=tuple(caffe.tops)):
            blobs, _ = graph.run({**params, **p}, state, bottoms, key, start=k, stop=k + 1)
            return [blobs[t] for t in tops]

        fwd, t1, c1 = compiled(run, p, bottoms)
        vjp_of = jax.jit(lambda p, b, run=run: jax.vjp(run, p, b))
        start = time.perf_counter()
        tops, pullback = jax.block_until_ready(vjp_of(p, bottoms))
        c2 = time.perf_counter() - start
        ones = [jnp.ones_like(t) for t in tops]
        bwd, t3, c3 = compiled(lambda f, d: f(d), pullback, ones)
        compile_s += t1 + c1 + c2 + t3 + c3
        forward_ms = timed(partial(fwd, p, bottoms), iterations)
        times.append(LayerTime(caffe.name, forward_ms, timed(partial(bwd, pullback, ones),
                                                             iterations)))  # fmt: skip
    return times, compile_s


def random_inputs(model: Model, seed: int = 0) -> dict[str, jax.Array]:
    """Random data for every input, made on the device (no host copy, whatever the declared
    size); blobs named ``label*`` get class 0 (valid for any loss)."""
    names = list(model.inputs)
    keys = jax.random.split(jax.random.key(seed), max(len(names), 1))

    def make(name: str, key: jax.Array) -> jax.Array:
        shape = model.inputs[name]
        if name.startswith("label"):
            return jnp.zeros(shape, model.dtype)
        return jax.random.normal(key, shape, model.dtype)

    return {n: jax.jit(make, static_argnums=0)(n, k) for n, k in zip(names, keys)}
