"""The jitted training step: iter_size forward/backward passes and one Caffe update, one XLA
program.

Caffe's learnable params include blobs a forward updates (BatchNorm's statistics, with
``lr_mult`` forced to 0): its solver keeps history for them and regularizes them, though their
update is always zero. So the optimizer here runs over *all* owned blobs — params and state
merged in Caffe's blob order — with zero gradients for the state blobs, which reproduces
Caffe's solverstate history exactly; only the param slots take the update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import Mesh

from caffe2jax.lowering.graph import Params
from caffe2jax.lowering.model import Model
from caffe2jax.lowering.python_blobs import in_pass
from caffe2jax.lowering.ranges import host_tops
from caffe2jax.runtime.parallel.devices import replicate, replicated
from caffe2jax.runtime.train.solvers import caffe_solver

UNROLL_ITER_SIZE = 4


def merge(params: Params, state: Params) -> Params:
    """One tree holding every owned blob: param slots from ``params``, state slots from
    ``state`` (shared slots stay None). Values a layer carries between forwards are not Caffe
    blobs and stay out."""
    out = {}
    for name in dict.fromkeys([*params, *state]):
        p, s = params.get(name), state.get(name)
        blobs = p if p is not None else s
        out[name] = [
            (p[j] if p is not None and p[j] is not None else (s[j] if s is not None else None))
            for j in range(len(blobs))
        ]
    return out


def split(merged: Params, like_params: Params) -> Params:
    """The param slots of ``merged`` in the structure of ``like_params``."""
    return {
        name: [merged[name][j] if v is not None else None for j, v in enumerate(blobs)]
        for name, blobs in like_params.items()
    }


def learnable_order(model: Model) -> list[tuple[str, int]]:
    """Caffe's learnable_params_ order: owned blobs by layer, then blob index."""
    graph = model.graph
    return [
        (layer.name, j)
        for layer in model.net.layers
        for j in range(len(graph.decls.get(layer.name, [])))
        if (layer.name, j) not in graph.shared
    ]


def multipliers(model: Model, merged: Params) -> tuple[Params, Params]:
    """lr_mult and decay_mult trees for ``merged`` (state blobs: lr_mult 0, as BatchNorm sets)."""
    graph = model.graph
    lr, decay = {}, {}
    for name, blobs in merged.items():
        layer = model.net.layer(name)
        decls = graph.decls[name]
        lr[name] = [
            None if b is None else (0.0 if decls[j].state else layer.spec(j).lr_mult)
            for j, b in enumerate(blobs)
        ]
        decay[name] = [None if b is None else layer.spec(j).decay_mult for j, b in enumerate(blobs)]
    return lr, decay


class Trainer:
    """Builds the solver transformation and the jitted step for one train Model."""

    def __init__(self, model: Model, solver_param: Any, params: Params, state: Params,
                 mesh: Mesh | None = None):  # fmt: skip
        self.model = model
        self.mesh = mesh
        self.solver_param = solver_param
        self.iter_size = max(1, solver_param.iter_size)
        merged = merge(params, state)
        lr_mult, decay_mult = multipliers(model, merged)
        self.tx = caffe_solver(solver_param, lr_mult, decay_mult)
        self.order = learnable_order(model)
        self.traces = 0
        # Only the optimizer state is donated: params and state may still be referenced by
        # pycaffe Blobs (solver.net.params, test nets) after the step; nothing when a Python
        # layer may reshape its tops (the step then runs again on the same buffers).
        self.donate = () if model.runs_python_layers else (2,)
        if mesh is None:
            self._step = jax.jit(self._make_step(), donate_argnums=self.donate)
        else:
            from caffe2jax.runtime.parallel.data_parallel import sharded_step

            self._step = jax.jit(sharded_step(self, mesh), donate_argnums=self.donate,
                                 out_shardings=replicated(mesh))  # fmt: skip
        self._update = jax.jit(self.update)

    def init(self, params: Params, state: Params) -> Any:
        return self.own_buffers(self.tx.init(merge(params, state)))

    @staticmethod
    def own_buffers(opt_state: Any) -> Any:
        """A copy of ``opt_state`` whose every leaf has its own buffer: the step donates the
        optimizer state, and XLA refuses to donate one buffer twice."""
        return jax.tree.map(lambda x: jnp.array(x, copy=True), opt_state)

    def make_passes(self, models: Sequence[Model] | None = None) -> Callable:
        """``passes_fn(params, state, passes, rng) -> (grads, state, losses, outputs,
        state_before_last)``: Caffe's iter_size ForwardBackward calls, gradients summed.
        ``models[k]`` runs pass ``k`` (the model for its input shapes; default: the net's)."""
        model, iter_size = self.model, self.iter_size
        models = list(models or [model] * iter_size)
        # passes with Python layers are unrolled: each traces its layers in its own pass
        scan = iter_size > UNROLL_ITER_SIZE and all(m is models[0] for m in models)
        scan = scan and not model.runs_python_layers
        names = model.net.blob_names
        # the net's outputs, and the tops of layers a replay must not run again (Python data
        # layers): pycaffe's views after a step show them as the step computed them
        outputs = [(o, names[o]) for o in model.net.outputs]
        outputs += [(v, v) for v, _ in host_tops(model.graph)]

        def grads_of(params, state, inputs, rng, k=0):
            with in_pass(k):
                (loss, (blobs, state)), grads = jax.value_and_grad(
                    models[k].loss_in_pass(k), has_aux=True
                )(params, state, inputs, rng)
            return grads, state, loss, {key: blobs[ssa] for key, ssa in outputs}

        def one(params, rng):
            def body(carry, xs):
                grads, state = carry
                batch, k = xs
                g, state, loss, outs = grads_of(params, state, batch, jax.random.fold_in(rng, k))
                grads = jax.tree.map(jnp.add, grads, g)
                return (grads, state), (loss, outs)

            return body

        def passes_fn(params, state, passes, rng):
            if not scan:
                return _unrolled(grads_of, params, state, passes, rng, iter_size)
            batches = jax.tree.map(lambda *xs: jnp.stack(xs), *passes[:-1])
            zeros = jax.tree.map(jnp.zeros_like, params)
            ks = jnp.arange(iter_size - 1)
            (grads, state), (head, _) = lax.scan(one(params, rng), (zeros, state), (batches, ks))
            last_in = state
            g, state, loss, out = grads_of(
                params, state, passes[-1], jax.random.fold_in(rng, iter_size - 1)
            )
            grads = jax.tree.map(jnp.add, grads, g)
            return grads, state, jnp.append(head, loss), out, last_in

        return passes_fn

    def update_of(self, params, state, opt_state, grads):
        """:meth:`update` inside the step: new params, optimizer state, and the param diffs
        Caffe holds after ApplyUpdate (the update value: data -= diff)."""
        params, opt_state, updates = self.update(params, state, opt_state, grads)
        return params, opt_state, jax.tree.map(jnp.negative, updates)

    def _make_step(self, models: Sequence[Model] | None = None) -> Callable:
        passes_fn, iter_size = self.make_passes(models), self.iter_size

        def step(params, state, opt_state, passes, key, iteration):
            """One Caffe iteration: iter_size ForwardBackward passes, then ApplyUpdate.

            ``passes`` holds one input dict per forward; ``key`` is the run's base PRNG key,
            folded with ``iteration`` here so the host never issues per-step device work.
            """
            self.traces += 1
            rng = jax.random.fold_in(key, iteration)
            grads, state, losses, out, last_in = passes_fn(params, state, passes, rng)
            params, opt_state, diffs = self.update_of(params, state, opt_state, grads)
            extra = (diffs, last_in) if iter_size > 1 else (diffs,)
            return params, state, opt_state, jnp.mean(losses), out, extra

        return step

    def update(self, params: Params, state: Params, opt_state: Any, grads: Params) -> tuple:
        """Caffe's ApplyUpdate on the params' raw gradients (state blobs take a zero gradient
        and keep their history, as in Caffe), pure: ``(params, opt_state, updates)``. The
        step, pycaffe's ``apply_update`` and the RL trainer all update through it."""
        merged = merge(params, state)
        merged_grads = merge(grads, jax.tree.map(jnp.zeros_like, state))
        updates, opt_state = self.tx.update(merged_grads, opt_state, merged)
        return split(optax.apply_updates(merged, updates), params), opt_state, updates

    def apply(self, ts: Any, grads: Params) -> Any:
        """Caffe's ApplyUpdate alone, on given param diffs (pycaffe's ``apply_update``):
        the train state after the update, its iteration one more."""
        params, opt_state, _ = self._update(*self.place(ts.params, ts.state, ts.opt_state), grads)
        return ts.replace(params=params, opt_state=opt_state, iteration=ts.iteration + 1)

    def place(self, *trees: Any) -> tuple:
        """``trees`` replicated on the mesh (as they are without one): a snapshot restored,
        or a blob a pycaffe script wrote, joins the devices here."""
        return trees if self.mesh is None else replicate(trees, self.mesh)

    def step(self, params, state, opt_state, passes, key, iteration):
        """Run the compiled step on ``passes``: a tuple of iter_size input dicts (on a mesh,
        global arrays sharded along their rows, one ``batch_size`` slice per device)."""
        params, state, opt_state, key = self.place(params, state, opt_state, key)
        return self._step_for(passes)(params, state, opt_state, tuple(passes), key, iteration)

    def _step_for(self, passes: Sequence[Mapping[str, Any]]) -> Callable:
        """The compiled step for the passes' input shapes: Caffe reshapes the net on every
        forward (a Python data layer's images of different sizes), so each shape signature
        gets its step, compiled once and kept with the model of that signature."""
        if self.mesh is not None:
            return self._step
        models = []
        for k, inputs in enumerate(passes):
            with in_pass(k):  # pass k's Python layers' top shapes pick its model
                models.append(self.member(inputs))
        if all(m is self.model for m in models):
            return self._step
        if any(m.probe for m in models):  # a probe runs once (then the pass runs again)
            return jax.jit(self._make_step(models), donate_argnums=self.donate)
        home = models[-1]
        key = ("train_step", id(self), tuple(m.signature for m in models))
        if key not in home.programs:
            home.programs[key] = jax.jit(self._make_step(models), donate_argnums=self.donate)
        return home.programs[key]

    def member(self, inputs: Mapping[str, Any]) -> Model:
        """The train model for the shapes of ``inputs`` (the net's own when they match)."""
        given = self.model.inputs
        shapes = {k: tuple(jnp.shape(v)) for k, v in inputs.items() if k in given}
        if all(given[k] == s for k, s in shapes.items()) and self.model.is_current():
            return self.model
        return self.model.reshape(shapes, provisional=True)

    def shown_inputs(self, inputs: Any) -> Any:
        """The inputs of the pass pycaffe's train net shows: on a mesh, device 0's slice
        (Caffe's root solver net)."""
        if self.mesh is None:
            return inputs
        from caffe2jax.runtime.parallel.data_parallel import FirstSlice

        return FirstSlice(inputs, self.mesh)


def _unrolled(grads_of: Callable, params, state, passes, rng, iter_size: int) -> tuple:
    """The iter_size passes unrolled at trace time: on CPU an XLA scan (even with unroll)
    costs more than the passes themselves (LeNet on digits: 11.9 ms vs 4.0 ms per step);
    passes of different shapes cannot be scanned either."""
    grads, losses, last_in = None, [], state
    for k in range(iter_size):
        last_in = state
        g, state, loss, out = grads_of(params, state, passes[k], jax.random.fold_in(rng, k), k)
        grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
        losses.append(loss)
    return grads, state, jnp.stack(losses), out, last_in
