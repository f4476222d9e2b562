"""The RL trainer's learning step for each update rule (:mod:`.update`), traced into the one
program a driver compiles: no host round-trip inside the conjugate gradients, the line search
or PPO's epochs.

:class:`Learning` holds what the rules need of the trainer (the policy's forward, the solver's
ApplyUpdate, the settings); :meth:`Learning.learn` takes the params, the solver state, the
trajectory and the advantage MyCaffe's rule computes (standardised discounted returns of the
elite episodes) and returns the new params and solver state.

* ``PG`` with ``steps`` k > 1 (TensorForce's ``MultiStep``): MyCaffe's rule and one solver
  update, k times on the same batch (each at the params the previous one left);
* ``TRPO``: :mod:`.trpo`'s step, k times; the likelihood ratio's reference is the policy that
  played the batch, the Fisher matrix and the KL bound are the current step's. The solver's
  own rule is not applied (TRPO's step is its update); its ``iter`` counts the steps. Params
  with ``lr_mult: 0`` stay fixed (the step is projected off them);
* ``PPO``: :mod:`.ppo`'s epochs of minibatch updates, k times, through the solver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.lowering.graph import Params
from caffe2jax.runtime.rl import ppo, trpo
from caffe2jax.runtime.rl import surrogate as sur
from caffe2jax.runtime.rl.rollout import Trajectory
from caffe2jax.runtime.rl.update import PPO, TRPO, UpdateSettings
from caffe2jax.runtime.train import solvers

# (params, state, rows (N, obs)) -> action probabilities (N, k)
Forward = Callable[[Params, Params, jax.Array], jax.Array]
# (params, state, opt_state, diff) -> (params, opt_state): the solver's ApplyUpdate
Apply = Callable[[Params, Params, Any, Params], tuple[Params, Any]]


def rows_of(traj: Trajectory) -> jax.Array:
    """The trajectory's net inputs as rows ``(T·B, obs)``, zero on padded steps."""
    x = traj.x
    if jnp.issubdtype(x.dtype, jnp.floating):  # packed inputs are zero where padded
        x = jnp.where(traj.mask.reshape(traj.mask.shape + (1,) * (x.ndim - 2)) > 0, x, 0.0)
    return x.reshape(traj.mask.size, -1)


def bump_iter(opt_state: Any) -> Any:
    """The solver state with Caffe's ``iter`` one more (a TRPO step is one update)."""
    inner = solvers.solver_state(opt_state)
    return solvers.replace_solver_state(opt_state, inner._replace(iter=inner.iter + 1))


@dataclass(frozen=True)
class Learning:
    """One update rule bound to a trainer's policy and solver (module docstring)."""

    settings: UpdateSettings
    forward: Forward
    apply: Apply
    sigmoid: bool
    seed: int
    keep: Params | None = None  # 1.0/0.0 per param blob (lr_mult != 0); None: all learn

    def probs_fn(self, state: Params, traj: Trajectory) -> Callable[[Params], jax.Array]:
        """``w ↦`` the action probabilities of every step of ``traj`` under ``w``, (T, B, k)."""
        rows = rows_of(traj)
        shape = traj.mask.shape
        return lambda p: self.forward(p, state, rows).reshape(*shape, -1)

    def learn(
        self, params: Params, state: Params, opt_state: Any, traj: Trajectory, adv: jax.Array
    ) -> tuple[Params, Any]:
        """``settings.steps`` updates by the configured rule: ``(params, opt_state)``."""
        s = self.settings
        probs_of = self.probs_fn(state, traj)
        logp_ref = lax.stop_gradient(sur.log_prob(probs_of(params), traj.actions, self.sigmoid))
        if s.type == TRPO:
            one = lambda p, o: self.trpo_step(probs_of, p, o, traj, adv, logp_ref)  # noqa: E731
        elif s.type == PPO:
            one = lambda p, o: self.ppo_pass(probs_of, p, state, o, traj, adv, logp_ref)  # noqa: E731
        else:
            raise ValueError("PG's multi-step runs in the trainer (MyCaffe's rule)")
        if s.steps == 1:
            return one(params, opt_state)
        return lax.fori_loop(0, s.steps, lambda _, c: one(*c), (params, opt_state))

    def _project(self, tree: Params) -> Params:
        if self.keep is None:
            return tree
        return jax.tree.map(lambda k, x: x * k, self.keep, tree)

    def trpo_step(
        self, probs_of: Callable, params: Params, opt_state: Any, traj: Trajectory,
        adv: jax.Array, logp_ref: jax.Array,
    ) -> tuple[Params, Any]:  # fmt: skip
        """One natural-gradient step with its line search (:mod:`.trpo`)."""
        s, mask, sig = self.settings, traj.mask, self.sigmoid
        old = lax.stop_gradient(probs_of(params))

        def objective(p: Params) -> tuple[jax.Array, jax.Array]:
            new = probs_of(p)
            value = sur.surrogate(sur.log_prob(new, traj.actions, sig), logp_ref, adv, mask)
            return value, sur.mean_kl(old, new, mask, sig)

        g = self._project(jax.grad(lambda p: objective(p)[0])(params))
        fvp = trpo.fisher_vector_product(lambda p: objective(p)[1], params, s.cg_damping)
        step, expected = trpo.natural_step(
            g, lambda v: self._project(fvp(v)), s.cg_iterations, s.max_kl
        )
        rule = (s.line_search_steps, s.backtrack, s.accept_ratio, s.kl_factor * s.max_kl)
        found = trpo.line_search(objective, params, step, expected, rule)
        return found.params, bump_iter(opt_state)

    def ppo_pass(
        self, probs_of: Callable, params: Params, state: Params, opt_state: Any,
        traj: Trajectory, adv: jax.Array, logp_ref: jax.Array,
    ) -> tuple[Params, Any]:  # fmt: skip
        """``epochs × minibatches`` solver updates on the clipped objective (:mod:`.ppo`)."""
        s, sig = self.settings, self.sigmoid

        def loss(p: Params, group: jax.Array) -> jax.Array:
            logp = sur.log_prob(probs_of(p), traj.actions, sig)
            return -sur.clipped_surrogate(logp, logp_ref, adv, group, s.clip)

        def apply(p: Params, o: Any, diff: Params) -> tuple[Params, Any]:
            return self.apply(p, state, o, diff)

        key = jax.random.fold_in(jax.random.key(self.seed), solvers.solver_state(opt_state).iter)
        return ppo.epochs_of_minibatches(
            jax.grad(loss), apply, params, opt_state, traj.mask, key, s.epochs, s.minibatches
        )
