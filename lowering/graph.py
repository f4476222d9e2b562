"""Graph assembly: an ir.Net becomes one pure function over params, state and inputs.

``Graph(net, input_shapes)`` looks every layer up in the registry, declares its param blobs,
infers every top shape with ``jax.eval_shape`` (no second shape table), resolves shared params
(Caffe's AppendParam ownership and shape checks) and Caffe's need-backward analysis. Then::

    params, state = graph.init(key)
    blobs, state = graph.apply(params, state, inputs, rng)     # pure, jittable
    loss = graph.objective(blobs)                              # Σ loss_weight · Σ top

Gradients are JAX's, with ``stop_gradient`` exactly where Caffe computes no diff (bottoms and
params Net::Init marks as not needing backward), so ``jax.grad`` of the objective equals the
diffs Caffe's Backward leaves in the params.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.frontend.backward import resolve_backward
from caffe2jax.frontend.errors import InputShapeError, NetError
from caffe2jax.frontend.splits import insert_splits
from caffe2jax.lowering import layout
from caffe2jax.lowering.engines.precision import Precision, cast, resolve
from caffe2jax.lowering.fillers import Draws, draws_needed, fill
from caffe2jax.lowering.limits import check_blobs
from caffe2jax.lowering.registry import (
    Context,
    Lowering,
    NetState,
    ParamDecl,
    Shape,
    carry_of,
    lookup,
)

Params = dict[str, list[Any]]


def _fail(layer: ir.Layer, problem: str) -> NetError:
    return NetError(f"{layer.where}layer '{layer.name}' (type {layer.type}): {problem}")


def _locate(layer: ir.Layer, err: NetError) -> NetError:
    """``err`` naming the layer and, when known, its file:line (same error class)."""
    text = str(err)
    if f"layer '{layer.name}'" not in text:
        text = f"layer '{layer.name}' (type {layer.type}): {text}"
    if layer.where and not text.startswith(layer.where):
        text = layer.where + text
    return type(err)(text)


@contextlib.contextmanager
def _at(layer: ir.Layer):
    """NetErrors raised while handling ``layer`` carry its name and file:line."""
    try:
        yield
    except NetError as err:
        raise _locate(layer, err) from None


def _shape_list(names: Sequence[str], shapes: Sequence[Shape]) -> str:
    return ", ".join(f"'{n}' {list(s)}" for n, s in zip(names, shapes))


class Graph:
    """A lowered net: shapes, param declarations, sharing, and the pure apply function."""

    def __init__(
        self,
        net: ir.Net,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        dtype: Any = jnp.float32,
        precision: str | Precision | None = None,
        channels_last: bool | None = None,
    ):
        self.dtype = jnp.dtype(dtype)
        self.precision = resolve(precision)
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
        self.shared: dict[tuple[str, int], tuple[str, int]] = {}
        self.inputs: dict[str, Shape] = {}
        self._input_ssa: dict[str, str] = {}
        shapes = self._infer(net, dict(input_shapes or {}))
        self._resolve_sharing(net)
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
        self._layer = {layer.name: layer for layer in self.net.layers}
        if channels_last is None:
            channels_last = layout.default_channels_last()
        self.channels_last = channels_last
        self.nhwc_layers = layout.plan(self.net) if channels_last else frozenset()
        self._index = {layer.name: k for k, layer in enumerate(self.net.layers)}

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

    def _infer(self, net: ir.Net, given: dict[str, Sequence[int]]) -> dict[str, Shape]:
        shapes: dict[str, Shape] = {}
        for k, layer in enumerate(net.layers):
            with _at(layer):
                self._infer_layer(k, layer, shapes, given)
        if given:
            raise NetError(f"input_shapes names unknown input blob(s): {', '.join(sorted(given))}")
        return shapes

    def _infer_layer(self, k: int, layer: ir.Layer, shapes: dict, given: dict) -> None:
        lowering = self.lowerings[layer.name]
        if lowering.source:
            declared = self._source_shapes(layer, given)
            check_blobs(layer, declared)
            for ssa, user, shape in zip(layer.tops, layer.top_names, declared):
                shapes[ssa] = shape
                self.inputs[user] = shape
                self._input_ssa[user] = ssa
            return
        bottom_shapes = [shapes[b] for b in layer.bottoms]
        self.decls[layer.name] = lowering.declare(layer, bottom_shapes)
        check_blobs(layer, (), self.decls[layer.name])
        carries = lowering.declare_carry(layer, bottom_shapes)
        if carries:
            self.carries[layer.name] = carries
        tops = self._eval_tops(k, layer, lowering, bottom_shapes)
        check_blobs(layer, tops)
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

        try:
            tops = jax.eval_shape(run, blobs, bottoms)
        except NetError:
            raise
        except Exception as err:  # a lowering rejected the shapes: name layer, blobs, shapes
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise _fail(
                layer,
                f"cannot apply to bottom(s) {_shape_list(layer.bottom_names, bottom_shapes)}: "
                f"{first}",
            ) from None
        if len(tops) != len(layer.tops):
            raise _fail(layer, f"produced {len(tops)} top(s) but the net names {len(layer.tops)}")
        return [tuple(t.shape) for t in tops]

    def _resolve_sharing(self, net: ir.Net) -> None:
        """Caffe's AppendParam: the first layer naming a param owns it; later ones share it."""
        owners: dict[str, tuple[str, int]] = {}
        for layer in net.layers:
            for j, decl in enumerate(self.decls.get(layer.name, [])):
                spec = layer.spec(j)
                if not spec.name:
                    continue
                if spec.name not in owners:
                    owners[spec.name] = (layer.name, j)
                    continue
                owner, oj = owners[spec.name]
                theirs = self.decls[owner][oj]
                if decl.state or theirs.state:
                    raise _fail(layer, f"param '{spec.name}' is a state blob and cannot be shared")
                same = (
                    np.prod(decl.shape) == np.prod(theirs.shape)
                    if spec.permissive
                    else decl.shape == theirs.shape
                )
                if not same:
                    raise _fail(
                        layer,
                        f"cannot share param '{spec.name}' owned by layer '{owner}': owner shape "
                        f"{list(theirs.shape)}, this layer's shape {list(decl.shape)}"
                        + (" (count mismatch)" if spec.permissive else ""),
                    )
                self._check_mults(layer, spec, net.layer(owner).spec(oj))
                self.shared[(layer.name, j)] = (owner, oj)

    @staticmethod
    def _check_mults(layer: ir.Layer, spec: ir.ParamSpec, owner: ir.ParamSpec) -> None:
        for field in ("lr_mult", "decay_mult"):
            mine, theirs = getattr(spec, field), getattr(owner, field)
            if getattr(spec, f"has_{field}") and getattr(owner, f"has_{field}") and mine != theirs:
                raise _fail(layer, f"shared param '{spec.name}' has mismatched {field}")

    # -- run time -------------------------------------------------------------------------

    def init(self, key: jax.Array) -> tuple[Params, Params]:
        """Fresh params and state from each blob's Caffe filler (shared slots hold None).

        One compiled program for the whole net, drawing from two shared sample pools.
        """
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

    def _feed(self, inputs: Mapping[str, Any]) -> dict[str, jax.Array]:
        missing = [name for name in self.inputs if name not in inputs]
        if missing:
            raise NetError(
                f"missing input blob(s) {', '.join(missing)}; the net takes "
                + _shape_list(list(self.inputs), list(self.inputs.values()))
            )
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
        env = dict(env)
        taps = taps or {}
        for name in taps.keys() & env.keys():
            env[name] = env[name] + taps[name]
        new_state = NetState({name: list(blobs) for name, blobs in state.items()},
                             {name: list(c) for name, c in carry_of(state).items()})  # fmt: skip
        layers = self.caffe_layers
        nhwc: set[str] = set()  # blobs held channels-last (lowering/layout.py)
        made_by: dict[str, str] = {}  # blob -> the Caffe type of the layer that computed it

        def tap(top):
            return layout.to_nhwc(taps[top]) if top in nhwc else taps[top]

        for k in range(start, len(layers) if stop is None else stop):
            caffe = layers[k]
            if caffe.is_split:
                value = env[caffe.bottoms[0]]
                if caffe.bottoms[0] in nhwc:
                    nhwc.update(caffe.tops)
                for top in caffe.tops:
                    made_by[top] = made_by.get(caffe.bottoms[0], "")
                    env[top] = value + tap(top) if top in taps else value
                continue
            layer = self._layer[caffe.key]
            lowering = self.lowerings[layer.name]
            if lowering.source or (keep and all(t in keep for t in layer.tops)):
                continue
            backward = self.net.backward[layer.name]
            dtype = self.precision.layer_dtype(layer.type, self.dtype)
            channels_last = layer.name in self.nhwc_layers
            bottoms = [
                cast(env[b] if backward.bottoms[i] else lax.stop_gradient(env[b]), dtype)
                for i, b in enumerate(caffe.bottoms)
            ]
            bottoms = [
                (layout.to_nhwc(x) if b not in nhwc else x)
                if channels_last
                else (layout.to_nchw(x) if b in nhwc else x)
                for b, x in zip(caffe.bottoms, bottoms)
            ]
            blobs = [
                cast(b if backward.params[j] else lax.stop_gradient(b), dtype)
                for j, b in enumerate(self.layer_blobs(layer, params, state))
            ]
            made = tuple(made_by.get(b, "") for b in caffe.bottoms)
            ctx = Context(self.phase, rng, dtype, layer_name=layer.name,
                          layer_index=self._index[layer.name], bottom_types=made)  # fmt: skip
            if layer.name in self.carries:
                ctx.carry = [
                    lax.stop_gradient(c)
                    for c in carry_of(state).get(layer.name)
                    or [jnp.zeros(d.shape, self.dtype) for d in self.carries[layer.name]]
                ]
            if channels_last:
                out = layout.NHWC_FNS[layer.type](layer, blobs, bottoms, ctx)
                nhwc.update(layer.tops)
            else:
                out = lowering.fn(layer, blobs, bottoms, ctx)
            if layer.name in self.carries:
                out, carried = out
                new_state.carry[layer.name] = [lax.stop_gradient(c) for c in carried]
            if lowering.stateful:
                out, updated = out
                slots = [j for j, d in enumerate(self.decls[layer.name]) if d.state]
                for j, value in zip(slots, updated):
                    new_state[layer.name][j] = lax.stop_gradient(value)
            for top, value in zip(layer.tops, out):
                env[top] = value + tap(top) if top in taps else value
                made_by[top] = layer.type
        return layout.restore(env, nhwc), new_state

    def objective(self, blobs: Mapping[str, jax.Array]) -> jax.Array:
        """Caffe's net loss: Σ over tops of loss_weight · Σ(top data)."""
        total = jnp.zeros((), self.dtype)
        for layer in self.net.layers:
            for top, weight in zip(layer.tops, layer.loss_weights):
                if weight:
                    total = total + weight * jnp.sum(blobs[top])
        return total
