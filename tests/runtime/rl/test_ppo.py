"""PPO (runtime/rl/ppo.py, runtime/rl/surrogate.py and the PPO rule of runtime/rl/learners.py):
the clipped objective and its gradient by hand on a tiny batch, the minibatch deal, and one
PPO update through Caffe's SGD equal to the hand-computed step — all jitted."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.runtime.rl import ppo, rule
from caffe2jax.runtime.rl import surrogate as sur
from tests.runtime.rl.test_trpo import _batch, trainer_for


def test_clipped_objective_by_hand():
    """ρ = (0.5, 1, 1.5, 1.1), Â = (1, −1, 2, −2), the last step padded, ε = 0.2:
    min(0.5, 0.8) = 0.5; min(−1, −1) = −1; min(3, 2.4) = 2.4 → mean 1.9 / 3. The gradient
    in log ρ is ρ·Â where the unclipped term is the minimum, 0 where the clipped one is."""
    ratio = jnp.asarray([0.5, 1.0, 1.5, 1.1])
    adv = jnp.asarray([1.0, -1.0, 2.0, -2.0])
    mask = jnp.asarray([1.0, 1.0, 1.0, 0.0])
    logp_old = jnp.asarray([-0.3, -1.2, -0.7, -2.0])
    f = jax.jit(lambda lp: sur.clipped_surrogate(lp, logp_old, adv, mask, 0.2))
    logp = logp_old + jnp.log(ratio)
    assert float(f(logp)) == pytest.approx(1.9 / 3, rel=1e-6)
    grad = np.asarray(jax.jit(jax.grad(f))(logp))
    np.testing.assert_allclose(grad, [0.5 / 3, -1.0 / 3, 0.0, 0.0], rtol=1e-6, atol=1e-7)
    # the plain likelihood-ratio objective TRPO uses: mean(ρ·Â) = (0.5 − 1 + 3) / 3
    plain = jax.jit(sur.surrogate)(logp, logp_old, adv, mask)
    assert float(plain) == pytest.approx(2.5 / 3, rel=1e-6)


def test_minibatch_ids_deal_every_real_step_once():
    mask = np.ones((9, 4), np.float32)
    mask[3:, 1] = 0
    mask[7:, 2] = 0
    ids = np.asarray(jax.jit(ppo.minibatch_ids, static_argnums=2)(jax.random.key(0), mask, 4))
    assert (ids[mask == 0] == -1).all()
    sizes = np.bincount(ids[mask > 0], minlength=4)
    assert sizes.sum() == mask.sum() and sizes.max() - sizes.min() <= 1
    other = np.asarray(ppo.minibatch_ids(jax.random.key(1), jnp.asarray(mask), 4))
    assert not np.array_equal(ids, other)  # each epoch deals anew


@pytest.mark.parametrize("kind", ["softmax", "sigmoid"])
def test_one_ppo_update_through_sgd(kind):
    """epochs 1, one minibatch, SGD (lr 1): the update is w + lr·∇ mean(ρ·Â) at ρ = 1 (the
    clip is inactive there), the solver's iter one more; 2 epochs × 3 minibatches: iter + 6."""
    t = trainer_for(kind, 'type: "PPO" epochs: 1 minibatches: 1', env="cartpole-v1")
    ts, traj = _batch(t)
    params, opt_state = t.learn(ts.params, ts.state, ts.opt_state, traj)
    returns = rule.discounted_returns(traj.rewards, traj.mask, 0.99)
    adv = rule.standardize(returns, traj.mask)
    probs_of = t.learning.probs_fn(ts.state, traj)
    sig = kind == "sigmoid"

    def value(p):
        return sur.masked_mean(sur.log_prob(probs_of(p), traj.actions, sig) * adv, traj.mask)

    g = jax.jit(jax.grad(value))(ts.params)
    for got, w, d in zip(jax.tree.leaves(params), jax.tree.leaves(ts.params), jax.tree.leaves(g)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(w + d), rtol=1e-5, atol=1e-6)
    assert t.iterations(ts._replace(opt_state=opt_state)) == 1
    six = trainer_for(kind, 'type: "PPO" epochs: 2 minibatches: 3', env="cartpole-v1")
    _, opt_state = six.learn(ts.params, ts.state, ts.opt_state, traj)
    assert six.iterations(ts._replace(opt_state=opt_state)) == 6
