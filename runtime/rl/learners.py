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
* ``PPO``: :mod:`.ppo`'s epochs of minibatch updates, k times, through the solver, each
  minibatch evaluating only its own steps (gathered, :meth:`Learning.ppo_pass`). With a
  value head (``value_blob``) the advantage is ``R − V_old(s)`` — the discounted return less
  the value the params that played the batch give the step — standardised over the batch's
  real steps (zero on the elite filter's dropped episodes), and each minibatch's loss adds
  ``c · mean((V(s) − R)²)`` over its steps (the PPO paper's ``c₁ L^VF``, unclipped), ``c``
  the ``loss_weight`` the net gives the value top (:attr:`Learning.value_weight`).

The policy (and value head) is evaluated over the batch's ``T·B`` rows at most
``chunk_rows`` at a time (:func:`chunked_rows`): a ``lax.map`` over chunks of a
rematerialised forward, so a batch of Pong frames never holds every frame's activations at
once, in the forward pass or the backward one; the outputs are the unchunked ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.lowering.graph import Params
from caffe2jax.runtime.rl import ppo, trpo
from caffe2jax.runtime.rl import surrogate as sur
from caffe2jax.runtime.rl.rollout import Trajectory
from caffe2jax.runtime.rl.update import PPO, TRPO, UpdateSettings
from caffe2jax.runtime.train import solvers

# (params, state, rows (N, obs)) -> (action probabilities (N, k), values (N, 1) or (N, 0))
Forward = Callable[[Params, Params, jax.Array], tuple[jax.Array, jax.Array]]
# (params, state, opt_state, diff) -> (params, opt_state): the solver's ApplyUpdate
Apply = Callable[[Params, Params, Any, Params], tuple[Params, Any]]


def rows_of(traj: Trajectory) -> jax.Array:
    """The trajectory's net inputs as rows ``(T·B, obs)``, zero on padded steps."""
    x = traj.x
    if jnp.issubdtype(x.dtype, jnp.floating):  # packed inputs are zero where padded
        x = jnp.where(traj.mask.reshape(traj.mask.shape + (1,) * (x.ndim - 2)) > 0, x, 0.0)
    return x.reshape(traj.mask.size, -1)


def chunked_rows(fn: Callable[[jax.Array], Any], rows: jax.Array, chunk: int) -> Any:
    """``fn(rows)`` (a pytree of per-row arrays) evaluated at most ``chunk`` rows at a time:
    ``⌈N/chunk⌉`` equal chunks (the last padded with zero rows, dropped after) through a
    ``lax.map`` of ``jax.checkpoint(fn)``, so differentiating it keeps one chunk's
    activations at a time. ``chunk`` ≤ 0 or ``N`` ≤ ``chunk``: one call."""
    n = rows.shape[0]
    if chunk <= 0 or n <= chunk:
        return fn(rows)
    count = -(-n // chunk)
    size = -(-n // count)
    padded = jnp.pad(rows, [(0, count * size - n)] + [(0, 0)] * (rows.ndim - 1))
    out = lax.map(jax.checkpoint(fn), padded.reshape(count, size, *rows.shape[1:]))
    return jax.tree.map(lambda o: o.reshape(count * size, *o.shape[2:])[:n], out)


def bump_iter(opt_state: Any) -> Any:
    """The solver state with Caffe's ``iter`` one more (a TRPO step is one update)."""
    inner = solvers.solver_state(opt_state)
    return solvers.replace_solver_state(opt_state, inner._replace(iter=inner.iter + 1))


class Fit(NamedTuple):
    """What PPO's minibatches fit: the advantage, the log-probabilities of the policy that
    played the batch, and the discounted returns (the value head's targets; None without)."""

    advantage: jax.Array
    logp_ref: jax.Array
    returns: jax.Array | None


@dataclass(frozen=True)
class Learning:
    """One update rule bound to a trainer's policy and solver (module docstring)."""

    settings: UpdateSettings
    forward: Forward
    apply: Apply
    sigmoid: bool
    seed: int
    keep: Params | None = None  # 1.0/0.0 per param blob (lr_mult != 0); None: all learn
    value_weight: float = 0.0  # the value top's loss_weight (PPO's c₁), with value_blob

    def heads_fn(
        self, state: Params, traj: Trajectory
    ) -> Callable[[Params], tuple[jax.Array, jax.Array]]:
        """``w ↦`` (action probabilities (T, B, k), values (T, B, 1) or (T, B, 0)) of every
        step of ``traj`` under ``w``, evaluated ``chunk_rows`` rows at a time."""
        rows, shape, chunk = rows_of(traj), traj.mask.shape, self.settings.chunk_rows

        def heads(p: Params) -> tuple[jax.Array, jax.Array]:
            out = chunked_rows(lambda r: self.forward(p, state, r), rows, chunk)
            return jax.tree.map(lambda o: o.reshape(*shape, -1), out)

        return heads

    def probs_fn(self, state: Params, traj: Trajectory) -> Callable[[Params], jax.Array]:
        """``w ↦`` the action probabilities of every step of ``traj`` under ``w``, (T, B, k)."""
        heads = self.heads_fn(state, traj)
        return lambda p: heads(p)[0]

    def learn(
        self, params: Params, state: Params, opt_state: Any, traj: Trajectory, adv: jax.Array,
        returns: jax.Array | None = None, elite: jax.Array | None = None,
    ) -> tuple[Params, Any]:  # fmt: skip
        """``settings.steps`` updates by the configured rule: ``(params, opt_state)``.

        ``adv`` is MyCaffe's advantage; with a value head PPO uses ``returns`` (the discounted
        returns, (T, B)) and ``elite`` (the kept episodes, (B,)) instead."""
        s = self.settings
        heads = self.heads_fn(state, traj)
        probs_of = lambda p: heads(p)[0]  # noqa: E731
        probs, values = lax.stop_gradient(heads(params))
        logp_ref = sur.log_prob(probs, traj.actions, self.sigmoid)
        if s.type == TRPO:
            one = lambda p, o: self.trpo_step(probs_of, p, o, traj, adv, logp_ref)  # noqa: E731
        elif s.type == PPO:
            if s.value_blob:
                adv = sur.batch_standardize(returns - values[..., 0], traj.mask) * elite
            fit = Fit(adv, logp_ref, returns)
            one = lambda p, o: self.ppo_pass(p, state, o, traj, fit)  # noqa: E731
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

    def group_loss(
        self, state: Params, rows: jax.Array, actions: jax.Array, fit: Fit, valid: jax.Array
    ) -> Callable[[Params], jax.Array]:
        """``w ↦`` PPO's loss on one minibatch, its steps gathered as ``rows`` (flat per-step
        ``actions`` and ``fit``; ``valid`` 1 on the group's steps, 0 on filler):
        ``−clipped_surrogate``, plus ``value_weight · mean((V − R)²)`` with a value head."""
        s, sig = self.settings, self.sigmoid

        def loss(p: Params) -> jax.Array:
            out = chunked_rows(lambda r: self.forward(p, state, r), rows, s.chunk_rows)
            logp = sur.log_prob(out[0], actions, sig)
            total = -sur.clipped_surrogate(logp, fit.logp_ref, fit.advantage, valid, s.clip)
            if s.value_blob:
                error = out[1][:, 0] - fit.returns
                total = total + self.value_weight * sur.masked_mean(error * error, valid)
            return total

        return loss

    def ppo_pass(
        self, params: Params, state: Params, opt_state: Any, traj: Trajectory, fit: Fit
    ) -> tuple[Params, Any]:
        """``epochs × minibatches`` solver updates on the clipped objective (:mod:`.ppo`),
        each evaluating only its group's steps: gathered (in step order) into
        ``⌈T·B / minibatches⌉`` rows, the largest a group can hold, the rest filler."""
        s = self.settings
        rows, actions = rows_of(traj), traj.actions.reshape(-1)
        flat = Fit(*(None if a is None else a.reshape(-1) for a in fit))
        size = -(-traj.mask.size // s.minibatches)

        def grads_of(p: Params, group: jax.Array) -> Params:
            member = group.reshape(-1) > 0
            idx = jnp.nonzero(member, size=size, fill_value=0)[0]
            valid = (jnp.arange(size) < jnp.sum(member)).astype(group.dtype)
            picked = Fit(*(None if a is None else a[idx] for a in flat))
            return jax.grad(self.group_loss(state, rows[idx], actions[idx], picked, valid))(p)

        def apply(p: Params, o: Any, diff: Params) -> tuple[Params, Any]:
            return self.apply(p, state, o, diff)

        key = jax.random.fold_in(jax.random.key(self.seed), solvers.solver_state(opt_state).iter)
        return ppo.epochs_of_minibatches(
            grads_of, apply, params, opt_state, traj.mask, key, s.epochs, s.minibatches
        )
