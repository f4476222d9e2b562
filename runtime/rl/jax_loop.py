"""The JAX environments' driver: a batch of episodes, MyCaffe's rule and one solver update as
ONE XLA program (the built-in Cart-Poles, gymnax).

With a step cap (``horizon``) the whole batch is one jitted program (:meth:`JaxLoop.batch_fn`,
``jax.vmap``-ed over seeds by :mod:`.seeds`). Without one (MyCaffe's gym) the batch runs as
bounded rollout programs of ``rollout_chunk`` steps until every lane's episode ended, then one
learn program on the whole trajectory, padded to a power-of-two number of segments so it
compiles once per length bucket. With several devices the lanes stay split over them inside
the program.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from caffe2jax.lowering.graph import Params
from caffe2jax.runtime.rl.rollout import (
    Carry,
    Lanes,
    Trajectory,
    rollout,
    rollout_continue,
    rollout_start,
)
from caffe2jax.runtime.rl.state import BatchMetrics, PolicyState, episode_metrics

if TYPE_CHECKING:
    from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer


class JaxLoop:
    """Drives a JAX environment for a trainer (:class:`~.driver.EnvDriver`)."""

    def __init__(self, trainer: PolicyGradientTrainer, mesh: Any = None):
        self.trainer, self.mesh = trainer, mesh
        self.traces = 0  # how often the batch program was traced
        self._batch = jax.jit(self.batch_fn)
        self._start = self._continue = self._learn = None  # uncapped: built on first use

    def policy_fn(self, params: Params, state: Params) -> Callable[[jax.Array], jax.Array]:
        """Net inputs → the policy's action probabilities under ``params``."""
        policy = self.trainer.policy
        return lambda x: policy.forward(params, state, x)[0]

    def _keep_split(self, lanes: Lanes) -> Lanes:
        """Inside the program: the lanes stay split over the devices."""
        if self.mesh is None:
            return lanes
        from caffe2jax.runtime.parallel.devices import sharded

        keep = lambda x: jax.lax.with_sharding_constraint(x, sharded(self.mesh))  # noqa: E731
        return lanes.replace(last=keep(lanes.last), has_last=keep(lanes.has_last))

    def batch_fn(self, ts: PolicyState) -> tuple[PolicyState, BatchMetrics]:
        """``batch_size`` episodes in the JAX env, the rule and one update (to jit)."""
        self.traces += 1
        t = self.trainer
        key, k_roll = jax.random.split(ts.key)
        act = self.policy_fn(ts.params, ts.state)
        traj, lanes = rollout(t.env, t.rollout_options, t.policy.spec.kind, act, k_roll,
                              ts.lanes)  # fmt: skip
        params, opt_state = t.learn_fn(ts.params, ts.state, ts.opt_state, traj)
        metrics = episode_metrics(traj)
        return PolicyState(params, ts.state, opt_state, key, self._keep_split(lanes)), metrics

    def train_batch(self, ts: PolicyState) -> tuple[PolicyState, BatchMetrics]:
        """One update from ``batch_size`` new episodes."""
        if self.trainer.config.horizon is None:
            return self._uncapped_batch(ts)
        return self._batch(ts)

    def _uncapped_batch(self, ts: PolicyState) -> tuple[PolicyState, BatchMetrics]:
        """No step cap: bounded rollout programs until every lane's episode ended, then one
        learn program on the padded trajectory (module docstring)."""
        if self._start is None:
            self._start = jax.jit(self._start_fn)
            self._continue = jax.jit(self._continue_fn)
            self._learn = jax.jit(self._learn_fn)
        key, k_roll = jax.random.split(ts.key)
        traj, carry = self._start(ts.params, ts.state, k_roll, ts.lanes)
        parts = [traj]
        while bool(jnp.any(carry.alive)):
            key_i = jax.random.fold_in(k_roll, len(parts))
            traj, carry = self._continue(ts.params, ts.state, carry, key_i)
            parts.append(traj)
        bucket = 1 << (len(parts) - 1).bit_length()
        parts += [jax.tree.map(jnp.zeros_like, parts[0])] * (bucket - len(parts))
        full = jax.tree.map(lambda *a: jnp.concatenate(a), *parts)
        params, opt_state, metrics = self._learn(ts.params, ts.state, ts.opt_state, full)
        return PolicyState(params, ts.state, opt_state, key, carry.lanes), metrics

    def _start_fn(self, params: Params, state: Params, key: jax.Array, lanes: Lanes) -> tuple:
        t = self.trainer
        return rollout_start(t.env, t.rollout_options, t.policy.spec.kind,
                             self.policy_fn(params, state), key, lanes)  # fmt: skip

    def _continue_fn(self, params: Params, state: Params, carry: Carry, key: jax.Array) -> tuple:
        t = self.trainer
        return rollout_continue(t.env, t.rollout_options, t.policy.spec.kind,
                                self.policy_fn(params, state), carry, key)  # fmt: skip

    def _learn_fn(self, params: Params, state: Params, opt_state: Any, traj: Trajectory) -> tuple:
        params, opt_state = self.trainer.learn_fn(params, state, opt_state, traj)
        return params, opt_state, episode_metrics(traj)
