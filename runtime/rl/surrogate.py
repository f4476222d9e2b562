"""The likelihood-ratio objective TRPO and PPO share, on a batch of episodes (pure JAX).

Every array is time-major ``(T, B, ...)`` with the trajectory's ``mask`` (1 on real steps).
The advantage ``Â`` is MyCaffe's: the per-episode standardised discounted return
(:func:`.rule.standardize`, elite episodes only). Means run over the batch's real steps.

* ``surrogate``: ``mean(P_w(a|s) / P_old(a|s) · Â)`` (TensorForce 0.3's likelihood-ratio loss,
  Schulman et al. 2015 eq. 14, to be maximised);
* ``clipped_surrogate``: ``mean(min(ρ·Â, clip(ρ, 1 − ε, 1 + ε)·Â))`` (PPO, Schulman et al.
  2017 eq. 7);
* ``batch_standardize``: a value baseline's advantage ``R − V(s)`` standardised over the
  batch's real steps (as OpenAI baselines' ppo2 does);
* ``mean_kl``: ``mean(KL(P_old(·|s) ‖ P_w(·|s)))`` over the actions, the quantity TRPO bounds.

A Sigmoid policy's output is ``P(action 0)``; its two actions' probabilities are
``(p, 1 − p)``. Probabilities are floored at ``TINY`` before their log, so a saturated policy
gives finite log-probabilities.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

TINY = 1e-8


def action_probs(probs: jax.Array, sigmoid: bool) -> jax.Array:
    """Every action's probability, ``(..., n)``: a Sigmoid's ``(p, 1 − p)``."""
    if sigmoid:
        p0 = probs[..., 0]
        return jnp.stack([p0, 1.0 - p0], axis=-1)
    return probs


def log_prob(probs: jax.Array, actions: jax.Array, sigmoid: bool) -> jax.Array:
    """``log P(a)`` of the actions taken, shape of ``actions``."""
    every = action_probs(probs, sigmoid)
    taken = jnp.take_along_axis(every, actions[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.log(jnp.maximum(taken, TINY))


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean of ``values`` over the steps where ``mask`` is 1 (0 with none)."""
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def batch_standardize(values: jax.Array, mask: jax.Array) -> jax.Array:
    """``(v − mean) / std`` over the batch's real steps (population std; a zero std leaves
    ``v − mean``), zero on padded steps: PPO's advantage with a value baseline."""
    mean = masked_mean(values, mask)
    centred = (values - mean) * mask
    std = jnp.sqrt(masked_mean(centred * centred, mask))
    return centred / jnp.where(std > 0, std, 1.0)


def surrogate(
    logp: jax.Array, logp_old: jax.Array, advantage: jax.Array, mask: jax.Array
) -> jax.Array:
    """The likelihood-ratio objective ``mean(exp(logp − logp_old) · Â)``."""
    return masked_mean(jnp.exp(logp - logp_old) * advantage, mask)


def clipped_surrogate(
    logp: jax.Array, logp_old: jax.Array, advantage: jax.Array, mask: jax.Array, clip: float
) -> jax.Array:
    """PPO's objective ``mean(min(ρ·Â, clip(ρ, 1 − ε, 1 + ε)·Â))``, ``ρ = exp(logp − logp_old)``."""
    ratio = jnp.exp(logp - logp_old)
    clipped = jnp.clip(ratio, 1.0 - clip, 1.0 + clip)
    return masked_mean(jnp.minimum(ratio * advantage, clipped * advantage), mask)


def mean_kl(old: jax.Array, new: jax.Array, mask: jax.Array, sigmoid: bool) -> jax.Array:
    """``mean(Σ_a P_old(a) (log P_old(a) − log P_new(a)))`` over the real steps."""
    p = action_probs(old, sigmoid)
    q = action_probs(new, sigmoid)
    log_p = jnp.log(jnp.maximum(p, TINY))
    log_q = jnp.log(jnp.maximum(q, TINY))
    return masked_mean(jnp.sum(p * (log_p - log_q), axis=-1), mask)
