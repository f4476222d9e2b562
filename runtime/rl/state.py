"""What the RL trainer carries from batch to batch (:class:`PolicyState`) and what one batch
reports (:class:`BatchMetrics`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from caffe2jax.lowering.graph import Params
from caffe2jax.runtime.rl.rollout import Lanes, Trajectory


class PolicyState(NamedTuple):
    """Everything a batch changes: net params/state, solver state, PRNG key, lane memory."""

    params: Params
    state: Params
    opt_state: Any
    key: jax.Array
    lanes: Lanes


class BatchMetrics(NamedTuple):
    """One batch: each episode's return and length, and the real env steps taken."""

    returns: jax.Array  # (batch_size,)
    lengths: jax.Array  # (batch_size,) int32
    steps: jax.Array  # () int32, the sum of lengths


def episode_metrics(traj: Trajectory) -> BatchMetrics:
    lengths = jnp.sum(traj.mask, axis=0).astype(jnp.int32)
    return BatchMetrics(jnp.sum(traj.rewards, axis=0), lengths, jnp.sum(lengths))
