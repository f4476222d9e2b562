"""TRPO's update as pure JAX: TensorForce 0.3's ``NaturalGradient`` inside ``OptimizedStep``.

Reproduced behaviour (Schulman et al. 2015, "Trust Region Policy Optimization", appendix C,
and his modular_rl ``trpo.py``; TensorForce 0.3 ``optimizers/natural_gradient.py`` and
``optimized_step.py``):

* the Fisher-vector product ``F v`` is the Hessian of the mean KL ``KL(P_w ‖ P_w')`` at
  ``w' = w`` times ``v``, by forward-over-reverse differentiation (``jax.jvp`` of
  ``jax.grad``), never forming ``F``; ``damping · v`` is added (modular_rl's
  ``cg_damping``), in the solve and in the step length alike;
* ``x ≈ F⁻¹ g`` by conjugate gradients from 0 (``jax.scipy.sparse.linalg.cg``, a
  ``lax.while_loop``): at most ``cg_iterations`` iterations, stopping once ``rᵀr < 1e-10``
  (modular_rl's ``residual_tol``);
* the full step is ``x / λ`` with ``λ = √(xᵀFx / (2·max_kl))`` (TensorForce's
  ``λ² = Δw̃ᵀ F Δw̃ / 2c``), so the quadratic model's KL of the step is ``max_kl``; the
  predicted improvement of a fraction ``m`` of it is ``m · gᵀ step``; a non-positive
  ``xᵀFx`` gives no step;
* the line search tries ``m = 1, b, b², …`` (``line_search_steps`` of them) and takes the
  first whose actual improvement is positive and at least ``accept_ratio`` of the predicted
  one; with ``kl_factor > 0`` the step's mean KL must also stay within ``kl_factor · max_kl``
  (OpenAI baselines' trpo_mpi check, which bounds the KL the quadratic model only predicts).
  None accepted: the params stay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.lowering.graph import Params

RESIDUAL_TOL = 1e-10  # modular_rl's cg residual_tol, on rᵀr


class SearchResult(NamedTuple):
    """The line search's outcome: the params and the fraction of the full step taken."""

    params: Params
    fraction: jax.Array  # m of the accepted step, 0 when none was accepted
    tried: jax.Array  # int32, fractions evaluated


def tree_vdot(a: Params, b: Params) -> jax.Array:
    """``Σ aᵢ·bᵢ`` over every leaf of two params-shaped pytrees."""
    parts = [jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
    return sum(parts, jnp.zeros((), jnp.float32))


def axpy(alpha: jax.Array | float, x: Params, y: Params) -> Params:
    """``alpha·x + y`` leaf by leaf."""
    return jax.tree.map(lambda a, b: alpha * a + b, x, y)


def fisher_vector_product(
    kl_of: Callable[[Params], jax.Array], params: Params, damping: float
) -> Callable[[Params], Params]:
    """``v ↦ (F + damping·I) v`` with ``F`` the Hessian of ``kl_of`` at ``params``
    (``kl_of(w')`` is the mean KL from the policy at ``params`` to the one at ``w'``)."""
    grad_kl = jax.grad(kl_of)

    def product(v: Params) -> Params:
        _, fv = jax.jvp(grad_kl, (params,), (v,))
        return axpy(damping, v, fv)

    return product


def natural_step(
    g: Params, fvp: Callable[[Params], Params], iterations: int, max_kl: float
) -> tuple[Params, jax.Array]:
    """The full step ``x / λ`` along ``x ≈ (F + δI)⁻¹ g`` and its predicted improvement
    ``gᵀ step`` (module docstring)."""
    atol = RESIDUAL_TOL**0.5  # jax's cg stops at ‖r‖ ≤ atol: rᵀr ≤ residual_tol
    x, _ = jax.scipy.sparse.linalg.cg(fvp, g, tol=0.0, atol=atol, maxiter=iterations)
    shs = 0.5 * tree_vdot(x, fvp(x))
    scale = jnp.where(shs > 0, jnp.sqrt(max_kl / jnp.where(shs > 0, shs, 1.0)), 0.0)
    step = jax.tree.map(lambda a: a * scale, x)
    return step, tree_vdot(g, step)


def line_search(
    objective: Callable[[Params], tuple[jax.Array, jax.Array]],
    params: Params,
    step: Params,
    expected: jax.Array,
    settings: tuple[int, float, float, float],
) -> SearchResult:
    """Backtracking over ``m = 1, b, b², …`` (module docstring), as one ``lax.while_loop``.

    ``objective(w)`` gives ``(surrogate, mean KL from params)``; ``settings`` is
    ``(steps, backtrack, accept_ratio, kl_bound)`` with ``kl_bound`` ≤ 0 for no KL check."""
    steps, backtrack, accept, kl_bound = settings
    before = objective(params)[0]

    def accepts(m: jax.Array) -> jax.Array:
        value, kl = objective(axpy(m, step, params))
        actual = value - before
        ok = (actual > 0) & (actual >= accept * expected * m)
        return ok & (kl <= kl_bound) if kl_bound > 0 else ok

    def cond(carry: tuple) -> jax.Array:
        k, found = carry
        return (k < steps) & ~found

    def body(carry: tuple) -> tuple:
        k, _ = carry
        return k + 1, accepts(jnp.asarray(backtrack, jnp.float32) ** k)

    tried, found = lax.while_loop(cond, body, (jnp.int32(0), jnp.bool_(False)))
    m = jnp.where(found, jnp.asarray(backtrack, jnp.float32) ** (tried - 1), 0.0)
    return SearchResult(axpy(m, step, params), m, tried)
