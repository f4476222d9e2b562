"""MyCaffe's policy-gradient learning rule as pure, jittable functions.

Every array is time-major: ``(T, B, ...)`` for ``B`` episodes padded to ``T`` steps, with a
``mask`` that is 1 on an episode's real steps and 0 after it ended.

Reproduced behaviour (MyCaffe/MyCaffe, ``MyCaffe.trainers/pg.st/TrainerPG.cs`` and
``pg.simple/TrainerPG.cs``; the MyCaffe paper, Brown 2018, arXiv:1810.02272):

* ``GetDiscountedRewards``: ``running = running·gamma + r_t`` backwards in time from the
  episode's last step (gamma defaults to 0.99); with ``AllowDiscountReset`` (PG.MT,
  ``Memory.GetDiscountedRewards(fGamma, bAllowReset)``) the running sum restarts at 0 at
  every step whose reward is non-zero, before that reward is added;
* PG.MT's ``MemoryCache.PurgeNonElite(EpisodeElitePercent)``: of the episodes gathered for
  one update only those whose reward sum is at least ``min + (1 − p)(max − min)`` are learned
  from (``p`` ≤ 0 or ≥ 1 keeps all);
* PG.MT's ``Agent.getEpsilon``: ``eps_start + n·(eps_end − eps_start)/eps_steps`` for the
  ``n``-th episode (0-based) while ``n < eps_steps``, then ``eps_end``; 0 when eps_steps is 0;
* ``SetDiscountedR`` / ``Blob.NormalizeData``: per episode, subtract the mean and divide by the
  standard deviation; MyCaffe's ``Blob.std`` is the population one (÷T) and a zero std skips
  the division (``population=False`` gives the sample std, ÷(T−1));
* the initial gradient: Sigmoid ``Dlogps = (action == 0 ? 1 : 0) − Aprob`` negated ("invert
  for ApplyUpdate subtracts the gradients"), i.e. ``Aprob − (action == 0)``; Softmax the
  SoftmaxCrossEntropyLoss backward on MemoryLoss's bottom, ``softmax(bottom) − onehot(action)``
  (no normalisation); both multiplied by the standardised discounted reward — so Caffe's
  ``w −= lr·diff`` raises the probability of actions followed by above-average returns;
* MemoryLoss's backward then scales the diff by ``loss_weight / normalizer`` (see
  :mod:`caffe2jax.lowering.forks.mycaffe`; by default the normaliser is the episode length);
* the parameter diffs of ``batch_size`` episodes are summed before one ``ApplyUpdate``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.lowering.graph import Params

LEARN_CHUNK = 64


def discounted_returns(
    rewards: jax.Array, mask: jax.Array, gamma: float, allow_reset: bool = False
) -> jax.Array:
    """``R_t = r_t + gamma·R_{t+1}`` within each episode (zero on padded steps); with
    ``allow_reset`` (MyCaffe's AllowDiscountReset) ``R_t = r_t`` wherever ``r_t != 0``."""

    def back(running: jax.Array, step: tuple[jax.Array, jax.Array]) -> tuple:
        r, m = step
        if allow_reset:
            running = jnp.where(r != 0, 0.0, running)
        running = (running * gamma + r) * m
        return running, running

    _, out = lax.scan(
        back, jnp.zeros(rewards.shape[1:], rewards.dtype), (rewards, mask), reverse=True
    )
    return out


def elite_mask(reward_sums: jax.Array, percent: float) -> jax.Array:
    """PG.MT's ``PurgeNonElite``: 1.0 for the episodes kept, 0.0 for the others, shape (B,)."""
    if percent <= 0.0 or percent >= 1.0:
        return jnp.ones_like(reward_sums)
    low, high = jnp.min(reward_sums), jnp.max(reward_sums)
    cutoff = low + (1.0 - percent) * (high - low)
    return (reward_sums >= cutoff).astype(reward_sums.dtype)


def epsilon(episode: jax.Array, steps: int, start: float, end: float) -> jax.Array:
    """PG.MT's ``getEpsilon`` for the 0-based ``episode`` index (any shape)."""
    episode = jnp.asarray(episode)
    if steps == 0:
        return jnp.zeros(episode.shape, jnp.float32)
    ramp = start + episode.astype(jnp.float32) * ((end - start) / steps)
    return jnp.where(episode >= steps, end, ramp).astype(jnp.float32)


def standardize(returns: jax.Array, mask: jax.Array, population: bool = True) -> jax.Array:
    """Per episode (axis 0): ``(R − mean) / std``; a zero std leaves ``R − mean``."""
    n = jnp.sum(mask, axis=0)
    mean = jnp.sum(returns * mask, axis=0) / jnp.maximum(n, 1)
    centred = (returns - mean) * mask
    ddof = 0 if population else 1
    var = jnp.sum(centred * centred, axis=0) / jnp.maximum(n - ddof, 1)
    std = jnp.where(n > ddof, jnp.sqrt(var), 0.0)
    safe = jnp.where(std != 0, std, 1.0)
    return centred / safe


def sigmoid_diff(aprob: jax.Array, actions: jax.Array, advantage: jax.Array) -> jax.Array:
    """MemoryLoss bottom diff of a Sigmoid policy: ``−((a == 0) − Aprob) · R̂``, shape (T, B, 1)."""
    dlogps = (actions == 0).astype(aprob.dtype) - aprob
    return (-dlogps * advantage)[..., None]


def softmax_diff(bottom: jax.Array, actions: jax.Array, advantage: jax.Array) -> jax.Array:
    """MemoryLoss bottom diff of a Softmax policy: ``(softmax(bottom) − onehot(a)) · R̂``."""
    onehot = jax.nn.one_hot(actions, bottom.shape[-1], dtype=bottom.dtype)
    return (jax.nn.softmax(bottom, axis=-1) - onehot) * advantage[..., None]


def loss_scale(mask: jax.Array, loss_weight: float, per_step: int, by_length: bool) -> jax.Array:
    """MemoryLoss backward's ``loss_weight / normalizer`` per episode, shape (B,)."""
    if not by_length:
        return jnp.full(mask.shape[1:], loss_weight, mask.dtype)
    lengths = jnp.sum(mask, axis=0)
    return loss_weight / jnp.maximum(per_step * lengths, 1.0)


def param_grads(
    bottom_fn: Callable[[Params], jax.Array],
    params: Params,
    make_diff: Callable[[jax.Array], jax.Array],
) -> Params:
    """Back-propagate MemoryLoss's bottom diff into the params: ``make_diff(bottom)`` gives
    the diff of every row from the bottom's forward values; the vector-Jacobian product of
    ``bottom_fn`` is Caffe's Backward from that blob, summed over all rows."""
    bottom, vjp = jax.vjp(bottom_fn, params)
    (grads,) = vjp(make_diff(bottom))
    return grads


def batch_grads(
    bottom_of: Callable[[Params, jax.Array], jax.Array],
    params: Params,
    traj: Any,
    advantage: jax.Array,
    sigmoid: bool,
    chunk: int = LEARN_CHUNK,
) -> Params:
    """The params' diff summed over every step of every episode in ``traj`` (a
    :class:`~caffe2jax.runtime.rl.rollout.Trajectory`), given each step's modulated advantage
    (standardised return × MemoryLoss's scale, 0 on padded steps).

    ``bottom_of(params, x)`` is the net's MemoryLoss bottom for rows ``x``. The work runs
    ``chunk`` steps at a time and only over the steps the longest episode reached.
    """
    steps, batch = traj.mask.shape
    if chunk <= 0 or steps % chunk:
        chunk = steps
    longest = jnp.max(jnp.sum(traj.mask, axis=0)).astype(jnp.int32)
    count = (longest + chunk - 1) // chunk

    def grads_of(i: jax.Array) -> Params:
        def part(a: jax.Array) -> jax.Array:
            return lax.dynamic_slice_in_dim(a, i * chunk, chunk)

        mask, actions, adv = part(traj.mask), part(traj.actions), part(advantage)
        x = part(traj.x)
        if jnp.issubdtype(x.dtype, jnp.floating):  # packed inputs are zero where padded
            x = jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 2)) > 0, x, 0.0)
        x = x.reshape(chunk * batch, -1)

        def make_diff(bottom: jax.Array) -> jax.Array:
            if sigmoid:
                diff = sigmoid_diff(part(traj.probs)[..., 0], actions, adv)
            else:
                diff = softmax_diff(bottom.reshape(chunk, batch, -1), actions, adv)
            return diff.reshape(chunk * batch, -1)

        return param_grads(lambda p: bottom_of(p, x), params, make_diff)

    zeros = jax.tree.map(jnp.zeros_like, params)
    return lax.fori_loop(0, count, lambda i, g: jax.tree.map(jnp.add, g, grads_of(i)), zeros)
