"""PPO's update as pure JAX: ``epochs`` passes of ``minibatches`` solver updates over the
steps of a batch of episodes, each on the clipped likelihood-ratio objective.

Reproduced behaviour (Schulman et al. 2017, "Proximal Policy Optimization Algorithms",
algorithm 1 and eq. 7; the ratio's reference is the policy that played the batch):

* each epoch shuffles the batch's real steps (padded steps take no part) and deals them into
  ``minibatches`` groups of (nearly) equal size: a step of random rank ``r`` among the ``n``
  real steps joins group ``⌊r·minibatches / n⌋``;
* each group gives one solver update (Caffe's ApplyUpdate: the solver's lr, momentum, history
  and ``iter`` all move) with the diff ``−∇ clipped_surrogate`` over the group's steps, so
  ``w −= lr·diff`` climbs the objective;
* the shuffles come from a key the caller derives from the run's seed and the solver's
  ``iter``, so a resumed run deals the same groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.lowering.graph import Params


def minibatch_ids(key: jax.Array, mask: jax.Array, count: int) -> jax.Array:
    """Each step's group in ``[0, count)`` (−1 on padded steps), same shape as ``mask``."""
    flat = mask.reshape(-1) > 0
    score = jnp.where(flat, jax.random.uniform(key, flat.shape), 2.0)
    rank = jnp.argsort(jnp.argsort(score))
    n = jnp.maximum(jnp.sum(flat), 1)
    ids = (rank * count) // n
    return jnp.where(flat, ids, -1).astype(jnp.int32).reshape(mask.shape)


def epochs_of_minibatches(
    grads_of: Callable[[Params, jax.Array], Params],
    apply: Callable[[Params, Any, Params], tuple[Params, Any]],
    params: Params,
    opt_state: Any,
    mask: jax.Array,
    key: jax.Array,
    epochs: int,
    count: int,
) -> tuple[Params, Any]:
    """``epochs × count`` updates in one ``lax.fori_loop``: ``grads_of(params, group_mask)``
    gives the diff on one group's steps, ``apply(params, opt_state, diff)`` the solver update."""

    def one(i: jax.Array, carry: tuple) -> tuple:
        p, s = carry
        epoch, group = i // count, i % count
        ids = minibatch_ids(jax.random.fold_in(key, epoch), mask, count)
        group_mask = mask * (ids == group).astype(mask.dtype)
        return apply(p, s, grads_of(p, group_mask))

    return lax.fori_loop(0, epochs * count, one, (params, opt_state))
