"""Caffe's ``ComputeUpdateValue`` for its six solvers, one param blob at a time.

Each rule maps ``(diff, history, local_rate)`` to ``(update value, new history)``, where
``diff`` is the gradient after clipping, iter_size normalisation and weight decay,
``local_rate = rate · lr_mult`` (float32, as Caffe), and the update value is what Caffe writes
into the diff before ``w -= diff``. The float32 constants (``1 + μ``, ``1 - rms_decay``, …) are
rounded as Caffe<float> rounds them. Caffe runs every rule also for ``lr_mult: 0`` params, so
adaptive histories keep accumulating for them while their update stays 0; so do these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend.errors import SolverError
from caffe2jax.runtime.train import doublefloat as dfl

LeafRule = Callable[[jax.Array, tuple[jax.Array, ...], jax.Array], tuple[jax.Array, tuple]]


class Rule(NamedTuple):
    """A solver type: how many history blobs per param and how to update one param."""

    history_count: int
    leaf: LeafRule
    rate_factor: Callable[[jax.Array], jax.Array] | None = None


def _c(value: np.float32, like: jax.Array) -> jax.Array:
    """A float32 hyper-parameter in the dtype of the blob it multiplies."""
    return jnp.asarray(value, like.dtype)


def sgd(momentum: float) -> Rule:
    """SGD: h = local_rate·g + μ·h; update h."""
    mu = np.float32(momentum)

    def leaf(g: jax.Array, hist: tuple, rate: jax.Array) -> tuple[jax.Array, tuple]:
        h = rate.astype(g.dtype) * g + _c(mu, g) * hist[0]
        return h, (h,)

    return Rule(1, leaf)


def nesterov(momentum: float) -> Rule:
    """Nesterov: h = local_rate·g + μ·h; update (1+μ)·h_new − μ·h_old."""
    mu = np.float32(momentum)
    one_plus_mu = np.float32(1.0) + mu

    def leaf(g: jax.Array, hist: tuple, rate: jax.Array) -> tuple[jax.Array, tuple]:
        h = rate.astype(g.dtype) * g + _c(mu, g) * hist[0]
        return _c(one_plus_mu, g) * h - _c(mu, g) * hist[0], (h,)

    return Rule(1, leaf)


def adagrad(delta: float) -> Rule:
    """AdaGrad: h += g²; update local_rate · g / (√h + δ)."""
    eps = np.float32(delta)

    def leaf(g: jax.Array, hist: tuple, rate: jax.Array) -> tuple[jax.Array, tuple]:
        h = g * g + hist[0]
        return rate.astype(g.dtype) * (g / (jnp.sqrt(h) + _c(eps, g))), (h,)

    return Rule(1, leaf)


def rmsprop(rms_decay: float, delta: float) -> Rule:
    """RMSProp: h = (1−d)·g² + d·h; update local_rate · g / (√h + δ)."""
    decay, eps = np.float32(rms_decay), np.float32(delta)
    keep = np.float32(1.0) - decay

    def leaf(g: jax.Array, hist: tuple, rate: jax.Array) -> tuple[jax.Array, tuple]:
        h = _c(keep, g) * (g * g) + _c(decay, g) * hist[0]
        return rate.astype(g.dtype) * (g / (jnp.sqrt(h) + _c(eps, g))), (h,)

    return Rule(1, leaf)


def adadelta(momentum: float, delta: float) -> Rule:
    """AdaDelta (decay from ``momentum``, δ inside both roots).

    hg = (1−μ)·g² + μ·hg; d = g·√((δ + hu)/(δ + hg)) with the old hu;
    hu = (1−μ)·d² + μ·hu; update local_rate·d. History: (hg, hu).
    """
    mu, eps = np.float32(momentum), np.float32(delta)
    keep = np.float32(1.0) - mu

    def leaf(g: jax.Array, hist: tuple, rate: jax.Array) -> tuple[jax.Array, tuple]:
        hg = _c(keep, g) * (g * g) + _c(mu, g) * hist[0]
        step = g * jnp.sqrt((_c(eps, g) + hist[1]) / (_c(eps, g) + hg))
        hu = _c(keep, g) * (step * step) + _c(mu, g) * hist[1]
        return rate.astype(g.dtype) * step, (hg, hu)

    return Rule(2, leaf)


def adam(beta1: float, beta2: float, delta: float) -> Rule:
    """Adam (β1 = momentum, β2 = momentum2, ε = delta added to √v, not to √v̂).

    m = (1−β1)·g + β1·m; v = (1−β2)·g² + β2·v; update (local_rate·c)·m/(√v + ε) with
    c = √(1−β2^t)/(1−β1^t) computed in double and t = iter + 1. History: (m, v).
    """
    b1, b2, eps = np.float32(beta1), np.float32(beta2), np.float32(delta)
    keep1, keep2 = np.float32(1.0) - b1, np.float32(1.0) - b2

    def correction(iteration: jax.Array) -> jax.Array:
        t = iteration + 1
        one = dfl.const(1.0)
        num = dfl.sqrt(dfl.add(one, dfl.neg(dfl.pow_int(float(b2), t))))
        return dfl.div(num, dfl.add(one, dfl.neg(dfl.pow_int(float(b1), t)))).hi

    def leaf(g: jax.Array, hist: tuple, rate: jax.Array) -> tuple[jax.Array, tuple]:
        m = _c(keep1, g) * g + _c(b1, g) * hist[0]
        v = _c(keep2, g) * (g * g) + _c(b2, g) * hist[1]
        return rate.astype(g.dtype) * (m / (jnp.sqrt(v) + _c(eps, g))), (m, v)

    return Rule(2, leaf, correction)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _unit_interval(sp: Any, field: str) -> None:
    value = getattr(sp, field)
    _check(0.0 <= value < 1.0, f"{field} must be in [0, 1) for {sp.type}, got {value}")


def check_rule_params(sp: Any) -> None:
    """One-line ValueError for hyper-parameters Caffe rejects (or that cannot work).

    Caffe CHECKs momentum == 0 for AdaGrad and RMSProp and 0 <= rms_decay < 1; we also require
    momentum (and Adam's momentum2) in [0, 1) and a non-negative, finite delta (> 0 for AdaDelta,
    whose first step is otherwise 0/0).
    """
    kind = sp.type
    if kind in ("AdaGrad", "RMSProp"):
        _check(sp.momentum == 0, f"momentum cannot be used with {kind} (got {sp.momentum})")
    else:
        _unit_interval(sp, "momentum")
    if kind == "RMSProp":
        _unit_interval(sp, "rms_decay")
    if kind == "Adam":
        _unit_interval(sp, "momentum2")
    if kind != "SGD" and kind != "Nesterov":
        delta = sp.delta
        _check(np.isfinite(delta) and delta >= 0, f"delta must be >= 0, got {delta}")
        _check(kind != "AdaDelta" or delta > 0, f"delta must be > 0 for AdaDelta, got {delta}")


def check_solver_type(sp: Any, where: str = "", error: type[Exception] = SolverError) -> None:
    """Caffe's SolverRegistry lookup: ``sp.type`` must be one of :data:`SOLVER_RULES`;
    ``error`` (a SolverError unless given: the functional API's :func:`make_rule` raises a
    ValueError) naming ``where`` (the solver file) and the known types otherwise. The one check
    of the solver type: the solver setup, the solver loop, pycaffe's ``get_solver`` and
    :func:`make_rule` call it."""
    if sp.type not in SOLVER_RULES:
        prefix = f"{where}: " if where else ""
        known = ", ".join(SOLVER_RULES)
        raise error(f"{prefix}unknown solver type '{sp.type}'; known: {known}")


def make_rule(sp: Any) -> Rule:
    """The Rule for ``sp.type`` (validated; a ValueError otherwise)."""
    check_solver_type(sp, error=ValueError)
    check_rule_params(sp)
    return SOLVER_RULES[sp.type](sp)


# Caffe's solver type strings, each with the Rule its hyper-parameters make (one registry:
# the solver factory, the CLI and pycaffe's solver classes all read it).
SOLVER_RULES: dict[str, Any] = {
    "SGD": lambda sp: sgd(sp.momentum),
    "Nesterov": lambda sp: nesterov(sp.momentum),
    "AdaGrad": lambda sp: adagrad(sp.delta),
    "RMSProp": lambda sp: rmsprop(sp.rms_decay, sp.delta),
    "AdaDelta": lambda sp: adadelta(sp.momentum, sp.delta),
    "Adam": lambda sp: adam(sp.momentum, sp.momentum2, sp.delta),
}
