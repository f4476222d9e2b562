"""Caffe's ``caffe time`` for a compiled net: per-layer and whole-net forward/backward times.

Caffe times each layer's Forward and Backward call inside its net loop. Here a whole net runs as
one fused XLA program; its per-layer figures come either from one profile of that program
(``profile=``: :mod:`caffe2jax.runtime.tools.profiling`, the CLI's default) or from **compiled
per-layer programs** (``per_layer=True``, Caffe's own per-layer times): for each of Caffe's
layers (splits included) one jitted forward (``Graph.run`` over that layer alone) and one jitted
backward (the layer's VJP applied to top diffs of ones, its residuals computed beforehand, so
only the backward is timed). Layers alike in all but their names and blob values (ResNet's
blocks, GoogLeNet's branches) share their programs, and the layers run in order, each on the
tops its predecessors computed: a net compiles one set of programs per kind of layer, and the
first layer's figures come after its own compiles, not the whole net's. Their sums are Caffe's
"Average Forward pass" and "Average Backward pass"; after them come the times of the one fused
program the net really runs as (forward, and forward + backward), each program's compile time,
and the peak memory.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from caffe2jax.lowering.model import Model
from caffe2jax.lowering.registry import NetState, carry_of
from caffe2jax.runtime.tools.profiling import LayerProfile, metadata_keyed, profile_program


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
    layer_programs: int = 0
    profile: LayerProfile | None = None  # where the per-layer figures came from a profile
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
    return Model(net, model.inputs, model.dtype, model.graph.precision, policy=model.graph.policy)


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
             seed: int = 0, on_layer: Callable[[LayerTime], None] | None = None,
             profile: Path | None = None, perfetto: bool = False) -> NetTimes:  # fmt: skip
    """Per-layer (each reported to ``on_layer`` as soon as it is timed) and fused
    forward/backward times of ``model`` on ``inputs``. ``per_layer``: from compiled per-layer
    programs (Caffe's own per-layer figures); else, with a ``profile`` folder, from one
    profile of the fused forward-backward program written there (:mod:`.profiling`)."""
    model = with_backward(model)
    graph = model.graph
    params, state = model.init(seed)
    key = jax.random.key(seed)
    out = NetTimes(seeded="loss" if _has_loss(model) else "outputs")
    if per_layer:
        layers = _PerLayer(graph, params, state, key, iterations, on_layer)
        out.layers = layers.run(graph.feed(inputs))
        out.compile_layers_s, out.layer_programs = layers.compile_s, len(layers.programs)

    def loss(p, s, x):
        blobs, _ = model.apply(p, s, x, key)
        return _scalar(model, blobs)

    def outputs(p, s, x):  # what a deploy forward returns: the net's outputs, not every blob
        blobs = model.apply(p, s, x, key)[0]
        return {name: blobs[name] for name in model.outputs}

    packed = model.packed(params, state)  # oneDNN weights packed once, BatchNorm folded
    fwd, out.trace_forward_s, out.compile_forward_s = compiled(outputs, packed, state, inputs)
    with metadata_keyed(profile is not None):  # the profile reads the ops' scopes
        fb, out.trace_forward_backward_s, out.compile_forward_backward_s = compiled(
            jax.value_and_grad(loss), params, state, inputs)  # fmt: skip
    out.fused_forward_ms = timed(lambda: fwd(packed, state, inputs), iterations)
    out.fused_forward_backward_ms = timed(lambda: fb(params, state, inputs), iterations)
    out.peak_bytes, out.peak_source = _peak([fwd, fb])
    if profile is not None:
        names = [c.key for c in graph.caffe_layers if not c.is_split]
        out.profile = profile_program(fb, (params, state, inputs), iterations, profile, names,
                                      perfetto)  # fmt: skip
        if not per_layer:
            out.layers = profiled_layers(graph, out.profile)
            for layer in out.layers if on_layer is not None else ():
                on_layer(layer)
    return out


def profiled_layers(graph: Any, profile: LayerProfile) -> list[LayerTime]:
    """Caffe's layers in order (splits included, sources not, as Caffe's time lists them),
    each with the profile's forward and backward milliseconds (0 where XLA ran none of its
    ops: a split, or a layer whose outputs the loss does not read)."""
    return [LayerTime(c.name, profile.forward_ms.get(c.key, 0.0) if c.key else 0.0,
                      profile.backward_ms.get(c.key, 0.0) if c.key else 0.0)
            for c in graph.caffe_layers
            if c.is_split or not graph.lowerings[c.key].source]  # fmt: skip


def layer_signature(graph: Any, caffe: Any) -> Hashable:
    """What a layer's compiled programs depend on: its type and parameters (names, blob
    names and loss weights aside), its bottoms' and blobs' shapes, which of them take a
    gradient, and its layout. Layers with shared or carried blobs keep programs of their own."""
    shapes = tuple(_version_shape(graph, b) for b in caffe.bottoms)
    if caffe.is_split:
        return ("Split", shapes, len(caffe.tops))
    layer = graph.net.layer(caffe.key)
    decls = graph.decls.get(caffe.key, [])
    if caffe.key in graph.carries or any((caffe.key, j) in graph.shared for j in range(len(decls))):
        return ("own", caffe.key)
    param = type(layer.param)()
    param.CopyFrom(layer.param)
    for field_name in ("name", "bottom", "top", "loss_weight", "param", "include", "exclude"):
        param.ClearField(field_name)
    backward = graph.net.backward[caffe.key]
    return (layer.type, param.SerializeToString(deterministic=True), shapes,
            tuple((tuple(d.shape), d.state) for d in decls), backward.bottoms, backward.params,
            caffe.key in getattr(graph, "nhwc_layers", ()))  # fmt: skip


def _version_shape(graph: Any, version: str) -> tuple[int, ...]:
    shapes = graph.net.shapes
    return tuple(shapes.get(version) or shapes[version.split("#split", 1)[0]])


class _PerLayer:
    """Caffe's layers in order, each forward and backward timed on its own programs (shared
    by layers with the same :func:`layer_signature`), each on the tops its predecessors
    computed."""

    def __init__(self, graph, params, state, key, iterations, on_layer):
        self.graph, self.params, self.state, self.key = graph, params, state, key
        self.iterations, self.on_layer = iterations, on_layer
        self.programs: dict[Hashable, tuple] = {}
        self.compile_s = 0.0

    def run(self, env: dict[str, Any]) -> list[LayerTime]:
        graph, env, times = self.graph, dict(env), []
        for k, caffe in enumerate(graph.caffe_layers):
            if caffe.key is not None and graph.lowerings[caffe.key].source:
                continue
            blobs = [] if caffe.is_split else self._blobs(caffe.key)
            bottoms = [env[b] for b in caffe.bottoms]
            fwd, vjp_of, bwd = self._programs(k, caffe, blobs, bottoms)
            tops = fwd(blobs, bottoms)
            env.update(zip(caffe.tops, tops))
            forward_ms = timed(partial(fwd, blobs, bottoms), self.iterations)
            _, pullback = vjp_of(blobs, bottoms)
            ones = [jnp.ones_like(t) for t in tops]
            backward_ms = timed(partial(bwd, pullback, ones), self.iterations)
            times.append(LayerTime(caffe.name, forward_ms, backward_ms))
            if self.on_layer is not None:
                self.on_layer(times[-1])
        return times

    def _blobs(self, name: str) -> list[Any]:
        return self.graph.layer_blobs(self.graph.net.layer(name), self.params, self.state)

    def _programs(self, k: int, caffe: Any, blobs: list, bottoms: list) -> tuple:
        signature = layer_signature(self.graph, caffe)
        if signature not in self.programs:
            start = time.perf_counter()
            run = self._layer_fn(k, caffe)
            fwd = compiled(run, blobs, bottoms)[0]
            vjp_of = jax.jit(lambda b, x: jax.vjp(run, b, x))
            tops, pullback = jax.block_until_ready(vjp_of(blobs, bottoms))
            bwd = compiled(lambda f, d: f(d), pullback, [jnp.ones_like(t) for t in tops])[0]
            self.programs[signature] = (fwd, vjp_of, bwd)
            self.compile_s += time.perf_counter() - start
        return self.programs[signature]

    def _layer_fn(self, k: int, caffe: Any) -> Callable:
        """``(blobs, bottoms) -> tops`` of layer ``k`` alone, its blobs given in Caffe's order
        (the params and state trees are rebuilt inside, so layers alike share the program)."""
        graph, key = self.graph, self.key
        name = caffe.key
        decls = [] if caffe.is_split else graph.decls.get(name, [])
        shared = any((name, j) in graph.shared for j in range(len(decls)))
        params_of = _layer_params(graph, name, self.params) if shared else {}
        carry = carry_of(self.state)

        def run(blobs, bottoms):
            params, state = dict(params_of), {}
            if decls and not shared:
                params[name] = [None if d.state else b for d, b in zip(decls, blobs)]
                state = {name: [b if d.state else None for d, b in zip(decls, blobs)]}
            out, _ = graph.run(params, NetState(state, carry),
                               dict(zip(caffe.bottoms, bottoms)), key,
                               start=k, stop=k + 1)  # fmt: skip
            return [out[t] for t in caffe.tops]

        return run


def _layer_params(graph, layer_key: str | None, params) -> dict[str, Any]:
    """The params one layer reads: its own, and the owners of the blobs it shares."""
    if layer_key is None:
        return {}
    names = {layer_key} | {owner for (name, _), (owner, _) in graph.shared.items()
                           if name == layer_key}  # fmt: skip
    return {n: params[n] for n in names if n in params}


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
