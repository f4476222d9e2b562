"""Caffe's learning-rate policies (``SGDSolver::GetLearningRate``) as pure, jittable schedules.

``learning_rate(solver_param)`` returns ``schedule(iter, current_step) -> (rate, current_step)``.
``iter`` is Caffe's ``iter_`` before the update (the count of updates applied so far) and
``current_step`` is Caffe's ``current_step_``, which the solverstate saves: ``step`` sets it to
``iter / stepsize``, ``multistep`` advances it lazily (at most one step per call, when ``iter``
has reached the next ``stepvalue``), the other policies leave it unchanged.

The rate is the float32 Caffe<float> computes, rounding where Caffe rounds: ``pow(float, int)``
promotes to double in C++11 (``step``, ``exp``, ``multistep``: ``float(base_lr * gamma**k)``
with the product in double), ``inv`` and ``poly`` call ``powf``, ``sigmoid`` calls ``expf``, and
the surrounding arithmetic is float. See ``doublefloat`` for how this stays exact without x64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.runtime.train import doublefloat as dfl

F32 = jnp.float32
Schedule = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


def _f32(value: float) -> np.float32:
    return np.float32(value)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_policy(solver_param: Any) -> None:
    """Raise ValueError (one line, naming the field) for a policy Caffe would reject.

    Caffe CHECKs ``stepsize > 0`` (step, sigmoid) and ``gamma >= 0`` (step, exp, inv,
    multistep, sigmoid) when it first computes the rate, and aborts on unknown policies. Beyond
    Caffe we also reject a non-positive ``base_lr``, ``poly`` without a positive ``max_iter``
    (Caffe divides by it) and ``multistep`` without any ``stepvalue``.
    """
    policy = solver_param.lr_policy
    _require(policy in POLICIES, f"lr_policy: unknown learning rate policy {policy!r}")
    base_lr = solver_param.base_lr
    _require(np.isfinite(base_lr) and base_lr > 0, f"base_lr must be > 0, got {base_lr}")
    if policy in ("step", "exp", "inv", "multistep", "sigmoid"):
        gamma = solver_param.gamma
        _require(gamma >= 0, f"gamma must be >= 0 for lr_policy {policy!r}, got {gamma}")
    if policy in ("step", "sigmoid"):
        stepsize = solver_param.stepsize
        _require(stepsize > 0, f"stepsize must be > 0 for lr_policy {policy!r}, got {stepsize}")
    if policy == "poly":
        max_iter = solver_param.max_iter
        _require(max_iter > 0, f"max_iter must be > 0 for lr_policy 'poly', got {max_iter}")
    if policy == "multistep":
        _require(len(solver_param.stepvalue) > 0, "stepvalue: lr_policy 'multistep' needs one")


def learning_rate(solver_param: Any) -> Schedule:
    """Caffe's ``GetLearningRate`` for ``solver_param.lr_policy``, validated up front."""
    check_policy(solver_param)
    build = {
        "fixed": _fixed,
        "step": _step,
        "exp": _exp,
        "inv": _inv,
        "multistep": _multistep,
        "poly": _poly,
        "sigmoid": _sigmoid,
    }[solver_param.lr_policy]
    schedule = build(solver_param)

    def rate_and_step(iteration: jax.Array, current_step: jax.Array) -> tuple[jax.Array, jax.Array]:
        iteration = jnp.asarray(iteration, jnp.int32)
        current_step = jnp.asarray(current_step, jnp.int32)
        rate, step = schedule(iteration, current_step)
        return jnp.asarray(rate, F32), jnp.asarray(step, jnp.int32)

    return rate_and_step


def _fixed(sp: Any) -> Schedule:
    """fixed: base_lr."""
    base_lr = _f32(sp.base_lr)
    return lambda it, step: (jnp.asarray(base_lr, F32), step)


def _step(sp: Any) -> Schedule:
    """step: current_step = iter / stepsize; base_lr · gamma^current_step (double pow)."""
    base_lr, gamma, stepsize = _f32(sp.base_lr), _f32(sp.gamma), int(sp.stepsize)

    def schedule(it: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
        step = it // stepsize
        return dfl.scaled_pow_int(float(base_lr), float(gamma), step), step

    return schedule


def _exp(sp: Any) -> Schedule:
    """exp: base_lr · gamma^iter (double pow)."""
    base_lr, gamma = _f32(sp.base_lr), _f32(sp.gamma)
    return lambda it, step: (dfl.scaled_pow_int(float(base_lr), float(gamma), it), step)


def _inv(sp: Any) -> Schedule:
    """inv: base_lr · powf(1 + gamma·iter, -power), all in float."""
    base_lr, gamma, power = _f32(sp.base_lr), _f32(sp.gamma), _f32(sp.power)

    def schedule(it: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
        base = F32(1.0) + dfl.rounded(gamma * it.astype(F32))
        return dfl.rounded(base_lr * dfl.powf(base, -power)), step

    return schedule


def _multistep(sp: Any) -> Schedule:
    """multistep: advance current_step once if iter >= stepvalue[current_step]; then as step."""
    base_lr, gamma = _f32(sp.base_lr), _f32(sp.gamma)
    stepvalues = np.asarray(list(sp.stepvalue), np.int32)
    count = len(stepvalues)

    def schedule(it: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
        next_value = jnp.asarray(stepvalues)[jnp.clip(step, 0, count - 1)]
        step = step + ((step < count) & (it >= next_value)).astype(jnp.int32)
        return dfl.scaled_pow_int(float(base_lr), float(gamma), step), step

    return schedule


def _poly(sp: Any) -> Schedule:
    """poly: base_lr · powf(1 - iter/max_iter, power), all in float."""
    base_lr, power, max_iter = _f32(sp.base_lr), _f32(sp.power), _f32(sp.max_iter)

    def schedule(it: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
        base = F32(1.0) - dfl.divf(it.astype(F32), max_iter)
        return dfl.rounded(base_lr * dfl.powf(base, power)), step

    return schedule


def _sigmoid(sp: Any) -> Schedule:
    """sigmoid: base_lr · 1/(1 + expf(-gamma·(iter - stepsize))), all in float."""
    base_lr, gamma, stepsize = _f32(sp.base_lr), _f32(sp.gamma), _f32(sp.stepsize)

    def schedule(it: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
        arg = -gamma * (it.astype(F32) - stepsize)
        return base_lr * (F32(1.0) / (F32(1.0) + dfl.expf(arg))), step

    return schedule
