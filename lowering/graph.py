"""Graph assembly: an ir.Net becomes one pure function over params, state and inputs.

``Graph(net, input_shapes)`` looks every layer up in the registry, declares its param blobs,
infers every top shape with ``jax.eval_shape`` (no second shape table), resolves shared params
(Caffe's AppendParam ownership and shape checks, lowering/limits.py's blob limits) and Caffe's
need-backward analysis. Then::

    params, state = graph.init(key)
    blobs, state = graph.apply(params, state, inputs, rng)     # pure, jittable
    loss = graph.objective(blobs)                              # Σ loss_weight · Σ top

Gradients are JAX's, with ``stop_gradient`` exactly where Caffe computes no diff (bottoms and
params Net::Init marks as not needing backward), so ``jax.grad`` of the objective equals the
diffs Caffe's Backward leaves in the params. When it is built, a Graph is also planned
(lowering/planning.py) under its engine policy (``policy=``, lowering/engines/policy.py): which
layers run channels-last (``nhwc_layers``) and the form of each convolution and pooling
(``engines``); a run executes that plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.frontend.backward import resolve_backward
from caffe2jax.frontend.errors import InputShapeError, NetError
from caffe2jax.frontend.splits import insert_splits
from caffe2jax.lowering import layout
from caffe2jax.lowering.engines import folding
from caffe2jax.lowering.engines.policy import EnginePolicy
from caffe2jax.lowering.engines.policy import resolve as resolve_policy
from caffe2jax.lowering.engines.precision import Precision, cast, resolve
from caffe2jax.lowering.fillers import Draws, draws_needed, fill
from caffe2jax.lowering.limits import check_blobs
from caffe2jax.lowering.planning import RunPlan, Step, plan_engines, plan_run
from caffe2jax.lowering.registry import (
    Context,
    Lowering,
    NetState,
    ParamDecl,
    Shape,
    carry_of,
    lookup,
)
from caffe2jax.lowering.sharing import resolve_sharing
from caffe2jax.lowering.util import applying as _applying
from caffe2jax.lowering.util import at_layer as _at
from caffe2jax.lowering.util import fail as _fail
from caffe2jax.lowering.util import shape_list as _shape_list

Params = dict[str, list[Any]]


class Graph:
    """A lowered net: shapes, param declarations, sharing, and the pure apply function."""

    def __init__(
        self,
        net: ir.Net,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        dtype: Any = jnp.float32,
        precision: str | Precision | None = None,
        channels_last: bool | None = None,
        policy: EnginePolicy | None = None,
        known_tops: Mapping[str, Sequence[Shape]] | None = None,
    ):
        """``known_tops``: each layer's top shapes as an identical build inferred them (a
        start-up cache's), used instead of tracing the layer with ``jax.eval_shape``."""
        self.dtype = jnp.dtype(dtype)
        self.precision = resolve(precision)
        self.policy = resolve_policy(policy)
        if channels_last is not None:
            self.policy = dataclasses.replace(self.policy, channels_last=channels_last)
        self.phase = net.phase
        self._init = None
        self.lowerings: dict[str, Lowering] = {}
        for layer in net.layers:
            with _at(layer):
                self.lowerings[layer.name] = lowering = lookup(layer)
            problem = lowering.check_counts(len(layer.bottoms), len(layer.tops))
            if problem:
                raise _fail(layer, problem)
        self.decls: dict[str, list[ParamDecl]] = {}
        self.carries: dict[str, list[ParamDecl]] = {}
        self.inputs: dict[str, Shape] = {}
        self._input_ssa: dict[str, str] = {}
        self._known = dict(known_tops or {})
        shapes = self.infer_shapes(net, dict(input_shapes or {}))
        self.shared = resolve_sharing(net, self.decls)
        net = net.with_shapes(shapes)
        self.net = resolve_backward(
            net,
            {name: len(d) for name, d in self.decls.items()},
            {
                layer.name: self.lowerings[layer.name].allow_force_backward(len(layer.bottoms))
                for layer in net.layers
            },
        )
        self.caffe_layers = insert_splits(self.net)
        self.layer_by_name = {layer.name: layer for layer in self.net.layers}
        self._index = {layer.name: k for k, layer in enumerate(self.net.layers)}
        # the engine plan: which layers run channels-last, and each layer's engine choice
        self.nhwc_layers = layout.plan(self.net) if self.policy.channels_last else frozenset()
        self.engines = plan_engines(
            self.net, self.lowerings, self.policy, self.nhwc_layers,
            lambda lowering: self.precision.layer_dtype(lowering.bf16, self.dtype),
        )  # fmt: skip
        self._runs: dict[tuple, RunPlan] = {}

    @property
    def channels_last(self) -> bool:
        """Whether the channels-last pass is on (``policy.channels_last``)."""
        return self.policy.channels_last

    # -- compile time ---------------------------------------------------------------------

    def _source_shapes(self, layer: ir.Layer, given: dict[str, Sequence[int]]) -> list[Shape]:
        declared = self.lowerings[layer.name].fn(layer)
        out = []
        for i, user in enumerate(layer.top_names):
            shape = given.pop(user, None)
            if shape is None:
                shape = declared[i] if i < len(declared) else None
            if shape is None:
                raise InputShapeError(
                    f"layer '{layer.name}' (type {layer.type}): the shape of top '{user}' comes "
                    "from its data source; pass input_shapes={'" + user + "': (...)}"
                )
            out.append(tuple(int(d) for d in shape))
        return out

    def infer_shapes(self, net: ir.Net, given: dict[str, Sequence[int]]) -> dict[str, Shape]:
        shapes: dict[str, Shape] = {}
        for k, layer in enumerate(net.layers):
            with _at(layer):
                self._infer_layer(k, layer, shapes, given)
                check_blobs(layer, [shapes[t] for t in layer.tops], self.decls.get(layer.name, ()))
        if given:
            raise NetError(f"input_shapes names unknown input blob(s): {', '.join(sorted(given))}")
        return shapes

    def _infer_layer(self, k: int, layer: ir.Layer, shapes: dict, given: dict) -> None:
        lowering = self.lowerings[layer.name]
        if lowering.source:
            declared = self._source_shapes(layer, given)
            for ssa, user, shape in zip(layer.tops, layer.top_names, declared):
                shapes[ssa] = shape
                self.inputs[user] = shape
                self._input_ssa[user] = ssa
            return
        bottom_shapes = [shapes[b] for b in layer.bottoms]
        self.decls[layer.name] = lowering.declare(layer, bottom_shapes)
        carries = lowering.declare_carry(layer, bottom_shapes)
        if carries:
            self.carries[layer.name] = carries
        tops = self._known.get(layer.name)
        if tops is None or len(tops) != len(layer.tops):
            tops = self._eval_tops(k, layer, lowering, bottom_shapes)
        shapes.update(zip(layer.tops, tops))

    def _eval_tops(self, k, layer, lowering, bottom_shapes) -> list[Shape]:
        blobs = [jax.ShapeDtypeStruct(d.shape, self.dtype) for d in self.decls[layer.name]]
        bottoms = [jax.ShapeDtypeStruct(s, self.dtype) for s in bottom_shapes]

        carry = [jnp.zeros(d.shape, self.dtype) for d in self.carries.get(layer.name, [])]

        def run(blobs, bottoms):
            ctx = Context(self.phase, jax.random.key(0), self.dtype, layer_name=layer.name)
            ctx.carry = carry
            out = lowering.fn(layer, blobs, bottoms, ctx)
            return out[0] if lowering.stateful or carry else out

        with _applying(layer, bottom_shapes):
            tops = jax.eval_shape(run, blobs, bottoms)
        if len(tops) != len(layer.tops):
            raise _fail(layer, f"produced {len(tops)} top(s) but the net names {len(layer.tops)}")
        return [tuple(t.shape) for t in tops]

    # -- run time -------------------------------------------------------------------------

    def init(self, key: jax.Array) -> tuple[Params, Params]:
        """Fresh params and state from each blob's Caffe filler (shared slots hold None): one
        compiled program for the whole net, drawing from two shared sample pools."""
        if self._init is None:
            self._init = jax.jit(self._init_fn)
        return self._init(key)

    def _owned(self) -> list[tuple[str, int, ParamDecl]]:
        return [
            (layer.name, j, decl)
            for layer in self.net.layers
            for j, decl in enumerate(self.decls.get(layer.name, []))
            if (layer.name, j) not in self.shared
        ]

    def owned(self) -> list[tuple[str, int, ParamDecl]]:
        """``(layer, blob index, declaration)`` of every param blob a layer owns, in net order:
        Caffe's params minus the slots shared from an earlier layer (AppendParam)."""
        return self._owned()

    @property
    def input_versions(self) -> dict[str, str]:
        """The SSA id each input blob (a source layer's top) is written as, by user name."""
        return dict(self._input_ssa)

    def _init_fn(self, key: jax.Array) -> tuple[Params, Params]:
        owned = self._owned()
        needs = [draws_needed(decl.filler, decl.shape) for _, _, decl in owned]
        draws = Draws(key, sum(n for n, _ in needs), sum(u for _, u in needs), self.dtype)
        params: Params = {}
        state: Params = {}
        layers = {layer.name: layer for layer in self.net.layers}
        for name, j, decl in owned:
            tree = state if decl.state else params
            blobs = tree.setdefault(name, [None] * len(self.decls[name]))
            with _at(layers[name]):
                blobs[j] = fill(decl.filler, decl.shape, draws, self.dtype)
        carry = {name: [jnp.zeros(d.shape, self.dtype) for d in decls]
                 for name, decls in self.carries.items()}  # fmt: skip
        return params, NetState(state, carry)

    def layer_blobs(self, layer: ir.Layer, params: Params, state: Params) -> list[jax.Array]:
        """All blobs of ``layer`` in Caffe's order: own params, state, shared (from owner)."""
        out = []
        for j, decl in enumerate(self.decls.get(layer.name, [])):
            if (layer.name, j) in self.shared:
                owner, oj = self.shared[(layer.name, j)]
                out.append(jnp.reshape(params[owner][oj], decl.shape))
            elif decl.state:
                out.append(state[layer.name][j])
            else:
                out.append(params[layer.name][j])
        return out

    def feed(self, inputs: Mapping[str, Any]) -> dict[str, jax.Array]:
        """``inputs`` (by user name) as the blob versions :meth:`run` reads, every input
        present and of the shape the net was compiled for (one clear error otherwise)."""
        return self._feed(inputs)

    def _feed(self, inputs: Mapping[str, Any]) -> dict[str, jax.Array]:
        missing = [name for name in self.inputs if name not in inputs]
        if missing:
            takes = _shape_list(list(self.inputs), list(self.inputs.values()))
            raise NetError(f"missing input blob(s) {', '.join(missing)}; the net takes {takes}")
        env = {}
        for name, shape in self.inputs.items():
            value = jnp.asarray(inputs[name])
            if tuple(value.shape) != shape:
                raise NetError(
                    f"input blob '{name}' has shape {list(value.shape)}, the net was compiled "
                    f"for {list(shape)} (reshape the net for a new shape)"
                )
            if not jnp.issubdtype(value.dtype, self.dtype):
                value = value.astype(self.dtype)
            env[self._input_ssa[name]] = value
        return env

    def apply(
        self,
        params: Params,
        state: Params,
        inputs: Mapping[str, Any],
        rng: jax.Array | None = None,
    ) -> tuple[dict[str, jax.Array], Params]:
        """Caffe's Net::Forward: every blob by SSA id (user names for last versions), new state."""
        return self.run(params, state, self._feed(inputs), rng)

    def run(
        self,
        params: Params,
        state: Params,
        env: Mapping[str, jax.Array],
        rng: jax.Array | None = None,
        *,
        start: int = 0,
        stop: int | None = None,
        taps: Mapping[str, jax.Array] | None = None,
        keep: Collection[str] = (),
    ) -> tuple[dict[str, jax.Array], Params]:
        """Run Caffe's layers ``start``..``stop - 1`` (Net::ForwardFromTo over
        :attr:`caffe_layers`, Split layers included) on the blobs in ``env`` (SSA ids).

        ``taps`` adds an array to chosen blobs as they are produced: zeros there change nothing
        but make ``jax.grad`` with respect to the taps return each blob's diff, as pycaffe's
        ``net.blobs[name].diff`` shows after a backward pass (a split top's tap gives the diff
        its one reader sends back, as Caffe's split blobs hold). A layer whose tops are all in
        ``keep`` is not run: its tops are read from ``env``, as Caffe's backward reads stored
        blobs (a Python data layer must not read its files again in a replay).

        Layers compute in :attr:`precision` (see ``lowering/engines/precision.py``); the blobs
        returned are in the net's dtype.
        """
        with jax.default_matmul_precision(self.precision.matmul):
            env, new_state = self._run(params, state, env, rng, start, stop, taps, keep)
        if self.precision.casts:
            env = {name: cast(value, self.dtype) for name, value in env.items()}
        return env, new_state

    def _run(self, params, state, env, rng, start, stop, taps, keep):
        env, taps = dict(env), taps or {}
        for name in taps.keys() & env.keys():
            env[name] = env[name] + taps[name]
        new_state = NetState({name: list(blobs) for name, blobs in state.items()},
                             {name: list(c) for name, c in carry_of(state).items()})  # fmt: skip
        plan = self._plan_run(start, stop, keep, fuse=not taps)  # a tapped top stays a layer's
        for step in plan.steps:
            if step.layer is None:  # a Split: each top is its bottom
                out = [env[step.bottoms[0]]] * len(step.tops)
            else:  # under the layer's name: profiles and HLO op_name metadata carry it
                with jax.named_scope(step.layer.name):
                    out = self._layer_step(step, params, state, env, rng, new_state)
            for top, value in zip(step.tops, out):
                if (tap := taps.get(top)) is not None:
                    value = value + (layout.to_nhwc(tap) if top in step.nhwc_tops else tap)
                env[top] = value
        return layout.restore(env, plan.held), new_state

    def _plan_run(self, start: int, stop, keep: Collection[str], fuse: bool = True) -> RunPlan:
        """The steps of running Caffe's layers ``start``..``stop - 1`` (cached)."""
        key = (start, stop, frozenset(keep), fuse)
        if key not in self._runs:
            self._runs[key] = plan_run(self, start, stop, keep, fuse)
        return self._runs[key]

    def _layer_step(self, step: Step, params, state, env, rng, new_state) -> list[jax.Array]:
        """One layer of a run: its bottoms (no gradient where Caffe computes no diff, in the
        layer's dtype and layout), its blobs, its context; state and carry written back."""
        layer = step.layer
        backward = self.net.backward[layer.name]
        bottoms = [
            layout.convert(cast(x if backward.bottoms[i] else lax.stop_gradient(x), step.dtype), to)
            for i, (x, to) in enumerate(zip((env[b] for b in step.bottoms), step.transposes))
        ]
        if folding.skipped(params.get(layer.name)):  # folded into its Convolution (folding.py)
            return bottoms
        blobs = [  # a fused chain's step: its later layers' blobs after the first's
            cast(b if self.net.backward[x.name].params[j] else lax.stop_gradient(b), step.dtype)
            for x in (layer, *step.chain)
            for j, b in enumerate(self.layer_blobs(x, params, state))
        ]
        ctx = Context(self.phase, rng, step.dtype, layer_name=layer.name,
                      layer_index=self._index[layer.name], engine=step.engine)  # fmt: skip
        if layer.name in self.carries:
            ctx.carry = [
                lax.stop_gradient(c)
                for c in carry_of(state).get(layer.name)
                or [jnp.zeros(d.shape, self.dtype) for d in self.carries[layer.name]]
            ]
        user = layer.type == "Python"  # a user's Python layer raises its own exceptions
        with contextlib.nullcontext() if user else _applying(layer, [x.shape for x in bottoms]):
            out = step.fn(layer, blobs, bottoms, ctx)
        if layer.name in self.carries:
            out, carried = out
            new_state.carry[layer.name] = [lax.stop_gradient(c) for c in carried]
        if self.lowerings[layer.name].stateful:
            out, updated = out
            slots = [j for j, d in enumerate(self.decls[layer.name]) if d.state]
            for j, value in zip(slots, updated):
                new_state[layer.name][j] = lax.stop_gradient(value)
        return out

    def objective(self, blobs: Mapping[str, jax.Array]) -> jax.Array:
        """Caffe's net loss: Σ over tops of loss_weight · Σ(top data)."""
        total = jnp.zeros((), self.dtype)
        for layer in self.net.layers:
            for top, weight in zip(layer.tops, layer.loss_weights):
                if weight:
                    total = total + weight * jnp.sum(blobs[top])
        return total
