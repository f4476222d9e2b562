"""TRPO (runtime/rl/trpo.py, the TRPO rule of runtime/rl/learners.py): the natural-gradient
step against a dense Fisher matrix solved in float64, the line search's accepted step
against its rule, the KL after a step within its bound — all jitted, as the trainer runs them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.runtime.rl import rollout as ro
from caffe2jax.runtime.rl import surrogate as sur
from caffe2jax.runtime.rl import trpo
from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer
from tests.runtime.rl.test_rule import solver_text

MAX_KL, DAMPING = 0.01, 0.1


def linear_net(kind: str) -> str:
    """The tiniest policy: MemoryData(4) → InnerProduct → Sigmoid (1 output) or Softmax (2),
    MemoryLoss on the logits: 5 or 10 params, so 10 CG iterations solve exactly."""
    outputs, prob = (1, "Sigmoid") if kind == "sigmoid" else (2, "Softmax")
    return (
        'name: "linear"\n'
        'layer { name: "data" type: "MemoryData" top: "data" top: "label" '
        "memory_data_param { batch_size: 3 channels: 4 height: 1 width: 1 } }\n"
        f'layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "logits" '
        f"inner_product_param {{ num_output: {outputs} weight_filler {{ type: 'gaussian' "
        "std: 0.5 } bias_filler { type: 'gaussian' std: 0.3 } } }\n"
        f'layer {{ name: "prob" type: "{prob}" bottom: "logits" top: "prob" }}\n'
        'layer { name: "loss" type: "MemoryLoss" bottom: "logits" top: "loss" }'
    )


def trainer_for(kind: str, update: str = 'type: "TRPO"', env: str = "cartpole-v1"):
    rl = f'env: "{env}" batch_size: 3 update {{ {update} }}'
    return PolicyGradientTrainer(solver_text(linear_net(kind), rl), seed=0)


def toy_batch(kind: str, steps: int = 7, batch: int = 3, seed: int = 0) -> ro.Trajectory:
    rng = np.random.default_rng(seed)
    mask = np.ones((steps, batch), np.float32)
    mask[5:, 0] = 0  # a short episode: padded steps take no part
    x = rng.normal(size=(steps, batch, 4)).astype(np.float32)
    actions = rng.integers(0, 2, size=(steps, batch)).astype(np.int32)
    k = 1 if kind == "sigmoid" else 2
    probs = np.full((steps, batch, k), 0.5, np.float32)
    rewards = np.ones((steps, batch), np.float32) * mask
    return ro.Trajectory(*(jnp.asarray(a) for a in (x, actions, probs, rewards, mask)))


# -- the float64 oracle --------------------------------------------------------------------


def np_policy(params: dict, kind: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the two actions' probabilities and d logits(as 2 classes) / d params,
    (N, 2) and (N, 2, P), params flattened as W row-major then b."""
    w = np.asarray(params["ip"][0], np.float64)
    b = np.asarray(params["ip"][1], np.float64)
    z = x @ w.T + b
    n, k = z.shape
    jac = np.zeros((n, 2, w.size + b.size))
    for row in range(k):  # dz_row/dW[row, :] = x, dz_row/db[row] = 1
        jac[:, row, row * 4 : row * 4 + 4] = x
        jac[:, row, w.size + row] = 1.0
    logits = z if k == 2 else np.concatenate([z, np.zeros_like(z)], axis=1)  # σ(z) = (z, 0)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True), jac


def dense_step(params: dict, kind: str, traj: ro.Trajectory, adv: np.ndarray) -> tuple:
    """g, F (the Hessian of the mean KL: mean Jᵀ(diag p − ppᵀ)J), the damped solve and the
    step scaled to MAX_KL, all in float64 NumPy."""
    mask = np.asarray(traj.mask, np.float64).reshape(-1)
    x = np.asarray(traj.x, np.float64).reshape(-1, 4)
    a = np.asarray(traj.actions).reshape(-1)
    p, jac = np_policy(params, kind, x)
    n = mask.sum()
    onehot = np.eye(2)[a]
    g = np.einsum("n,nk,nkp->p", mask * adv.reshape(-1), onehot - p, jac) / n
    cov = np.einsum("nk,kl->nkl", p, np.eye(2)) - np.einsum("nk,nl->nkl", p, p)
    fisher = np.einsum("n,nkp,nkl,nlq->pq", mask, jac, cov, jac) / n
    damped = fisher + DAMPING * np.eye(len(g))
    xs = np.linalg.solve(damped, g)
    step = xs * np.sqrt(2 * MAX_KL / (xs @ damped @ xs))
    return g, fisher, step, g @ step


def flat(tree) -> np.ndarray:
    return np.concatenate([np.asarray(tree["ip"][0]).reshape(-1), np.asarray(tree["ip"][1])])


@pytest.mark.parametrize("kind", ["softmax", "sigmoid"])
def test_natural_step_matches_dense_fisher_in_float64(kind):
    t = trainer_for(kind)
    params, state = t.init().params, t.init().state
    traj = toy_batch(kind)
    adv = np.random.default_rng(1).normal(size=traj.mask.shape).astype(np.float32)
    g64, fisher, step64, expected64 = dense_step(params, kind, traj, adv)

    @jax.jit
    def pieces(params, v):
        probs_of = t.learning.probs_fn(state, traj)
        old = jax.lax.stop_gradient(probs_of(params))
        logp_old = sur.log_prob(old, traj.actions, kind == "sigmoid")

        def value(p):
            logp = sur.log_prob(probs_of(p), traj.actions, kind == "sigmoid")
            return sur.surrogate(logp, logp_old, jnp.asarray(adv), traj.mask)

        kl_of = lambda p: sur.mean_kl(old, probs_of(p), traj.mask, kind == "sigmoid")  # noqa: E731
        fvp = trpo.fisher_vector_product(kl_of, params, DAMPING)
        g = jax.grad(value)(params)
        step, expected = trpo.natural_step(g, fvp, 10, MAX_KL)
        return g, fvp(v), step, expected

    v = jax.tree.map(lambda a: jnp.ones_like(a) * 0.3, params)
    g, fv, step, expected = pieces(params, v)
    # float32 arithmetic against float64: the CG of a 5-10 dim system, well conditioned by
    # the damping, agrees to a few float32 ulps of the step's scale
    np.testing.assert_allclose(flat(g), g64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(flat(fv), (fisher + DAMPING * np.eye(len(g64))) @ flat(v),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    np.testing.assert_allclose(flat(step), step64, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(expected), expected64, rtol=1e-4)
    assert expected64 > 0


def _line(k: int, b: float = 0.5) -> float:
    return b**k


def python_rule(objective, params, step, expected, steps=10, b=0.5, accept=0.1, bound=0.0):
    """The line search as written in modular_rl's ``linesearch`` (plus the KL check), a
    Python loop: the first fraction accepted, or 0."""
    before = float(objective(params)[0])
    for k in range(steps):
        m = _line(k, b)
        value, kl = objective(trpo.axpy(m, step, params))
        actual = float(value) - before
        if actual > 0 and actual >= accept * float(expected) * m and (bound <= 0 or kl <= bound):
            return m, k + 1
    return 0.0, steps


def test_line_search_on_a_known_objective():
    """f(w) = w − 3w² along step 1 with slope 1: ratio 1 − 3m fails at m = 1, ½ and is 0.25
    at m = ¼ (≥ 0.1): accepted there; a falling objective accepts nothing."""
    params = {"w": [jnp.zeros(())]}
    step = {"w": [jnp.ones(())]}
    objective = lambda p: (p["w"][0] - 3 * p["w"][0] ** 2, p["w"][0] ** 2)  # noqa: E731
    run = jax.jit(lambda p, s, e: trpo.line_search(objective, p, s, e, (10, 0.5, 0.1, 0.0)))
    found = run(params, step, jnp.float32(1.0))
    assert float(found.fraction) == 0.25 and int(found.tried) == 3
    assert float(found.params["w"][0]) == 0.25
    # KL bound 0.05: m = ¼ has KL 1/16 > 0.05, m = ⅛ (ratio 0.625, KL 1/64) is taken
    bounded = jax.jit(lambda p, s: trpo.line_search(objective, p, s, 1.0, (10, 0.5, 0.1, 0.05)))
    assert float(bounded(params, step).fraction) == 0.125
    falling = lambda p: (-p["w"][0], 0.0 * p["w"][0])  # noqa: E731
    none = jax.jit(lambda p, s: trpo.line_search(falling, p, s, 1.0, (10, 0.5, 0.1, 0.0)))(
        params, step
    )
    assert float(none.fraction) == 0.0 and int(none.tried) == 10
    assert float(none.params["w"][0]) == 0.0


@pytest.mark.parametrize("kind", ["softmax", "sigmoid"])
def test_line_search_accepts_what_the_rule_accepts(kind):
    """On a policy's surrogate: a huge max_kl (5000) makes the full step overshoot, and the
    accepted fraction, with the improvement rule alone and with the KL check (bound 0.075),
    is the first the Python transcription of the rule accepts."""
    t = trainer_for(kind)
    params, state = t.init().params, t.init().state
    traj = toy_batch(kind, seed=3)
    adv = jnp.asarray(np.random.default_rng(4).normal(size=traj.mask.shape), jnp.float32)
    sig = kind == "sigmoid"
    probs_of = t.learning.probs_fn(state, traj)
    old = probs_of(params)
    logp_old = sur.log_prob(old, traj.actions, sig)

    def objective(p):
        new = probs_of(p)
        return (sur.surrogate(sur.log_prob(new, traj.actions, sig), logp_old, adv, traj.mask),
                sur.mean_kl(old, new, traj.mask, sig))  # fmt: skip

    g = jax.grad(lambda p: objective(p)[0])(params)
    fvp = trpo.fisher_vector_product(lambda p: objective(p)[1], params, DAMPING)
    step, expected = jax.jit(lambda g: trpo.natural_step(g, fvp, 10, 5000.0))(g)
    for bound in (0.0, 0.075):
        found = jax.jit(lambda p, s, e, b=bound: trpo.line_search(
            objective, p, s, e, (10, 0.5, 0.1, b)))(params, step, expected)  # fmt: skip
        m, tried = python_rule(jax.jit(objective), params, step, expected, bound=bound)
        assert (float(found.fraction), int(found.tried)) == (m, tried)
        assert 0 < m < 1  # the overshooting full step was refused, a fraction taken


def _batch(t: PolicyGradientTrainer):
    ts = t.init()
    act = t.driver.policy_fn(ts.params, ts.state)
    traj, _ = ro.rollout(t.env, t.rollout_options, t.policy.spec.kind, act,
                         jax.random.key(5), ts.lanes)  # fmt: skip
    return ts, traj


@pytest.mark.parametrize("kind", ["softmax", "sigmoid"])
def test_kl_after_a_trpo_step_stays_within_the_bound(kind):
    """The trainer's TRPO update (jitted) on a Cart-Pole batch: a step is taken, its mean KL
    from the batch's policy is at most kl_factor·max_kl = 0.015. Without the KL check and
    with little damping (which otherwise shrinks the step: λ is taken with F + δI) the full
    step's KL is the quadratic model's max_kl to within 25 %."""
    t = trainer_for(kind)
    ts, traj = _batch(t)
    params, opt_state = t.learn(ts.params, ts.state, ts.opt_state, traj)
    sig = kind == "sigmoid"
    probs_of = t.learning.probs_fn(ts.state, traj)
    kl = float(sur.mean_kl(probs_of(ts.params), probs_of(params), traj.mask, sig))
    assert 0 < kl <= 1.5 * MAX_KL
    assert t.iterations(ts._replace(opt_state=opt_state)) == 1
    free = trainer_for(
        kind, ('type: "TRPO" kl_factor: 0 accept_ratio: 0 line_search_steps: 1 cg_damping: 0.001')
    )
    params, _ = free.learn(ts.params, ts.state, ts.opt_state, traj)
    kl = float(sur.mean_kl(probs_of(ts.params), probs_of(params), traj.mask, sig))
    assert kl == pytest.approx(MAX_KL, rel=0.25)
