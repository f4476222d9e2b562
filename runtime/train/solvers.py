"""Caffe's solvers (SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam) as optax transformations.

``caffe_solver(solver_param, lr_mult, decay_mult)`` chains, in the order of Caffe's
``SGDSolver::ApplyUpdate``:

1. ``clip_gradients`` – one global L2 norm over all learnable params' summed raw gradients;
2. ``normalize`` – ÷ iter_size (Caffe's ``Normalize``);
3. ``regularize`` – + weight_decay·decay_mult·w (L2) or ·sign(w) (L1), coupled to the gradient;
4. ``caffe_update_rule`` – the rate from the lr policy at ``iter`` (before the increment), the
   type's ``ComputeUpdateValue`` with ``local_rate = rate·lr_mult``, then ``iter += 1``;
5. ``optax.scale(-1)`` – optax adds updates, Caffe subtracts its update value.

Params are ``dict[str, list[Array | None]]`` (layer → blobs in Caffe order); ``None`` slots are
shared params owned by another layer and are skipped. ``update`` takes the raw gradient summed
over the iter_size forward/backward passes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from caffe2jax.runtime.train.lr_policy import Schedule, learning_rate
from caffe2jax.runtime.train.rules import Rule, make_rule

Params = Any  # dict[str, list[jax.Array | None]]
Order = list[tuple[str, int]]


class CaffeSolverState(NamedTuple):
    """Caffe's solver state: ``iter_``, ``current_step_`` and the history blobs.

    ``history`` holds one params-shaped pytree per history set (two for AdaDelta and Adam:
    first moments, then second).
    """

    iter: jax.Array
    current_step: jax.Array
    history: tuple[Params, ...]


def _check_tree(tree: Params, like: Params, name: str) -> None:
    if jax.tree.structure(tree) != jax.tree.structure(like):
        raise ValueError(f"{name} must have the structure of params (None at shared slots)")


def clip_gradients(threshold: float) -> optax.GradientTransformation:
    """Caffe's ClipGradients: if ‖g‖ (all blobs) > threshold, g ·= threshold/‖g‖; off if < 0."""
    if threshold < 0:
        return optax.identity()
    clip = np.float32(threshold)

    def update(updates: Params, state: optax.EmptyState, params: Params = None) -> tuple:
        leaves = jax.tree.leaves(updates)
        sumsq = sum(
            jnp.sum(jnp.square(g), dtype=jnp.promote_types(g.dtype, jnp.float32)) for g in leaves
        )
        norm = jnp.sqrt(sumsq)
        scale = jnp.where(norm > clip, clip / norm, jnp.ones_like(norm))
        return jax.tree.map(lambda g: g * scale.astype(g.dtype), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def normalize(iter_size: int) -> optax.GradientTransformation:
    """Caffe's Normalize: scale by float(1)/iter_size, skipped when iter_size is 1."""
    if iter_size == 1:
        return optax.identity()
    return optax.scale(float(np.float32(1.0) / np.float32(iter_size)))


def regularize(
    weight_decay: float, regularization_type: str, decay_mult: Params
) -> optax.GradientTransformation:
    """Caffe's Regularize: diff += local_decay·w (L2) or local_decay·sign(w) (L1).

    ``local_decay = weight_decay · decay_mult`` in float32; blobs where it is 0 are untouched.
    """
    if weight_decay == 0:
        return optax.identity()

    def leaf(g: jax.Array, mult: float, w: jax.Array) -> jax.Array:
        local_decay = np.float32(weight_decay) * np.float32(mult)
        if local_decay == 0:
            return g
        term = w if regularization_type == "L2" else jnp.sign(w)
        return jnp.asarray(local_decay, g.dtype) * term + g

    def update(updates: Params, state: optax.EmptyState, params: Params = None) -> tuple:
        if params is None:
            raise ValueError("regularize (Caffe weight decay) needs params in update()")
        _check_tree(decay_mult, updates, "decay_mult")
        return jax.tree.map(leaf, updates, decay_mult, params), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def caffe_update_rule(
    rule: Rule, schedule: Schedule, lr_mult: Params
) -> optax.GradientTransformation:
    """The rate at ``iter``, the rule's ComputeUpdateValue per blob, then ``iter += 1``.

    Returns Caffe's update value (to be subtracted). State: ``CaffeSolverState``.
    """

    def init(params: Params) -> CaffeSolverState:
        history = tuple(jax.tree.map(jnp.zeros_like, params) for _ in range(rule.history_count))
        zero = jnp.zeros((), jnp.int32)
        return CaffeSolverState(zero, zero, history)

    def update(updates: Params, state: CaffeSolverState, params: Params = None) -> tuple:
        _check_tree(lr_mult, updates, "lr_mult")
        rate, step = schedule(state.iter, state.current_step)
        if rule.rate_factor is not None:  # Adam: local_rate · correction(iter)
            factor = rule.rate_factor(state.iter)
            rates = [rate * np.float32(m) * factor for m in jax.tree.leaves(lr_mult)]
        else:
            rates = [rate * np.float32(m) for m in jax.tree.leaves(lr_mult)]
        new_updates, history = _apply_rule(rule, updates, state.history, rates)
        return new_updates, CaffeSolverState(state.iter + 1, step, history)

    return optax.GradientTransformation(init, update)


def _apply_rule(
    rule: Rule, grads: Params, history: tuple[Params, ...], rates: list[jax.Array]
) -> tuple[Params, tuple[Params, ...]]:
    """Run ``rule.leaf`` on every learnable blob (flattened: None slots have no leaves)."""
    leaves, treedef = jax.tree.flatten(grads)
    hists = [treedef.flatten_up_to(h) for h in history]
    outs, new_hists = [], [[] for _ in hists]
    for i, (g, local_rate) in enumerate(zip(leaves, rates)):
        out, hist = rule.leaf(g, tuple(h[i] for h in hists), local_rate)
        outs.append(out)
        for collected, h in zip(new_hists, hist):
            collected.append(h)
    return treedef.unflatten(outs), tuple(treedef.unflatten(h) for h in new_hists)


def check_solver_param(solver_param: Any) -> None:
    """One-line ValueError for settings shared by all solver types."""
    wd = solver_param.weight_decay
    if not (np.isfinite(wd) and wd >= 0):
        raise ValueError(f"weight_decay must be >= 0, got {wd}")
    if wd != 0 and solver_param.regularization_type not in ("L1", "L2"):
        raise ValueError(
            f"regularization_type: unknown regularization type {solver_param.regularization_type!r}"
        )
    if solver_param.iter_size < 1:
        raise ValueError(f"iter_size must be >= 1, got {solver_param.iter_size}")
    for i, iters in enumerate(solver_param.test_iter):
        if iters < 0:
            raise ValueError(f"test_iter {iters} (test net #{i}) must be >= 0")


def caffe_solver(
    solver_param: Any, lr_mult: Params, decay_mult: Params
) -> optax.GradientTransformation:
    """Caffe's solver ``solver_param.type`` as one optax transformation (see module doc).

    ``lr_mult``/``decay_mult``: pytrees like params holding Python floats (None at shared
    slots). ``update(raw_grads, state, params)`` needs params (weight decay).
    """
    rule = make_rule(solver_param)
    schedule = learning_rate(solver_param)
    check_solver_param(solver_param)
    return optax.chain(
        clip_gradients(solver_param.clip_gradients),
        normalize(solver_param.iter_size),
        regularize(solver_param.weight_decay, solver_param.regularization_type, decay_mult),
        caffe_update_rule(rule, schedule, lr_mult),
        optax.scale(-1.0),
    )


def _find(state: Any) -> CaffeSolverState | None:
    if isinstance(state, CaffeSolverState):
        return state
    if isinstance(state, tuple):
        for sub in state:
            found = _find(sub)
            if found is not None:
                return found
    return None


def solver_state(state: Any) -> CaffeSolverState:
    """The ``CaffeSolverState`` inside a ``caffe_solver`` state (a chain of states)."""
    found = _find(state)
    if found is None:
        raise ValueError("state holds no CaffeSolverState (not from caffe_solver?)")
    return found


def replace_solver_state(state: Any, new: CaffeSolverState) -> Any:
    """``state`` with its ``CaffeSolverState`` replaced by ``new``."""
    if isinstance(state, CaffeSolverState):
        return new
    if isinstance(state, tuple) and not hasattr(state, "_fields"):
        return tuple(replace_solver_state(sub, new) for sub in state)
    return state


_SCHEDULES: dict[bytes, Schedule] = {}


def _jitted_schedule(solver_param: Any) -> Schedule:
    """``jax.jit(learning_rate(solver_param))``, cached per serialized SolverParameter."""
    serialize = getattr(solver_param, "SerializeToString", None)
    if serialize is None:  # not a protobuf message: no stable key to cache on
        return jax.jit(learning_rate(solver_param))
    key = serialize(deterministic=True)
    if key not in _SCHEDULES:
        _SCHEDULES[key] = jax.jit(learning_rate(solver_param))
    return _SCHEDULES[key]


def current_lr(solver_param: Any, state: Any) -> float:
    """The rate the next update uses: Caffe's ``Iteration N, lr = X`` with N = ``iter``."""
    inner = solver_state(state)
    return float(_jitted_schedule(solver_param)(inner.iter, inner.current_step)[0])


def solver_iter(state: Any) -> int:
    """Caffe's ``iter_``: the number of updates applied so far."""
    return int(solver_state(state).iter)


def _slot(params: Params, key: tuple[str, int], where: str) -> jax.Array:
    layer, index = key
    blobs = params.get(layer) if isinstance(params, dict) else None
    if blobs is None or not 0 <= index < len(blobs) or blobs[index] is None:
        raise ValueError(f"{where}: ({layer!r}, {index}) is not a learnable param slot")
    return blobs[index]


def _check_order(params: Params, order: Order) -> None:
    """``order`` must list every learnable (non-None) slot of params exactly once."""
    slots = [
        (layer, i) for layer, blobs in params.items() for i, b in enumerate(blobs) if b is not None
    ]
    if sorted(order) != sorted(slots) or len(set(order)) != len(order):
        missing = sorted(set(slots) - set(order))
        extra = sorted(set(order) - set(slots))
        raise ValueError(
            f"order must list each learnable param once (missing {missing}, extra {extra})"
        )


def history_blobs(state: Any, order: Order) -> list[np.ndarray]:
    """Caffe's SolverState history: for each history set (m then v for AdaDelta/Adam), the
    blobs of the learnable params in Caffe's ``order``."""
    history = solver_state(state).history
    return [np.asarray(_slot(h, key, "history_blobs")) for h in history for key in order]


def _legacy_match(blob_shape: tuple, shape: tuple) -> bool:
    """A 4-D legacy blob (num, channels, height, width) padded with leading 1s."""
    return (
        len(blob_shape) == 4 and len(shape) <= 4 and blob_shape == (1,) * (4 - len(shape)) + shape
    )


def state_from_history(
    solver_param: Any,
    params: Params,
    blobs: list[np.ndarray],
    order: Order,
    iter: int,
    current_step: int,
) -> Any:
    """A ``caffe_solver`` state resumed from a solverstate (Caffe's ``Restore``).

    ``blobs`` is the solverstate's history list (see ``history_blobs``); each blob must have its
    param's shape (or the legacy 4-D shape of it).
    """
    rule = make_rule(solver_param)
    _check_order(params, order)
    expected = rule.history_count * len(order)
    if len(blobs) != expected:
        raise ValueError(
            f"solverstate has {len(blobs)} history blobs, {solver_param.type} needs {expected} "
            f"({rule.history_count} per learnable param)"
        )
    sets = []
    for set_index in range(rule.history_count):
        tree = {layer: list(layer_blobs) for layer, layer_blobs in params.items()}
        for j, (layer, index) in enumerate(order):
            i = set_index * len(order) + j
            param = _slot(params, (layer, index), "state_from_history")
            blob = np.asarray(blobs[i])
            if blob.shape != param.shape and not _legacy_match(blob.shape, param.shape):
                raise ValueError(
                    f"history blob {i} ({layer!r} param {index}) has shape {blob.shape}, "
                    f"expected {tuple(param.shape)}"
                )
            tree[layer][index] = jnp.asarray(blob.reshape(param.shape), param.dtype)
        sets.append(tree)
    inner = CaffeSolverState(
        jnp.asarray(iter, jnp.int32), jnp.asarray(current_step, jnp.int32), tuple(sets)
    )
    ones = jax.tree.map(lambda _: 1.0, params)
    init = caffe_solver(solver_param, ones, ones).init(params)
    return replace_solver_state(init, inner)
