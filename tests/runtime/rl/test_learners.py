"""runtime/rl/learners.py: PPO's value baseline head (its gradient against float64 finite
differences of a NumPy transcription of the loss, through the trainer's jitted update), the
one-line errors of a bad value head, and the chunked evaluation of a batch's rows (the same
numbers as the unchunked program, for TRPO and PPO)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.cli.main import main
from caffe2jax.runtime.rl import learners, ppo, rule
from caffe2jax.runtime.rl import surrogate as sur
from caffe2jax.runtime.rl.policy import RLError
from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer
from tests.runtime.rl.test_rule import solver_text
from tests.runtime.rl.test_trpo import linear_net, toy_batch

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "rl"
CLIP, VALUE_WEIGHT, GAMMA = 0.2, 0.5, 0.99
VALUE_HEAD = (
    'layer { name: "vip" type: "InnerProduct" bottom: "data" top: "value" loss_weight: 0.5 '
    "inner_product_param { num_output: 1 weight_filler { type: 'gaussian' std: 0.5 } "
    "bias_filler { type: 'gaussian' std: 0.3 } } }"
)


def value_trainer(update: str = "", net_extra: str = VALUE_HEAD) -> PolicyGradientTrainer:
    """A linear Softmax policy with a linear value head "value" beside it, SGD lr 1."""
    settings = f'type: "PPO" epochs: 1 minibatches: 1 clip: {CLIP} {update}'
    rl = f'env: "cartpole-v1" batch_size: 3 update {{ {settings} }}'
    net = linear_net("softmax") + "\n" + net_extra
    return PolicyGradientTrainer(solver_text(net, rl), seed=0)


# -- the float64 transcription -------------------------------------------------------------


def np_loss(w: dict, w_old: dict, traj, returns: np.ndarray) -> float:
    """PPO's minibatch loss with a value baseline, in float64: the advantage is R − V_old(s)
    standardised over the real steps (population std), the loss −mean(min(ρ·Â, clip(ρ)·Â)) +
    0.5 · mean((V(s) − R)²), ρ = P_w(a|s) / P_old(a|s)."""
    mask = np.asarray(traj.mask, np.float64).reshape(-1) > 0
    x = np.asarray(traj.x, np.float64).reshape(-1, 4)[mask]
    a = np.asarray(traj.actions).reshape(-1)[mask]
    r = returns.reshape(-1)[mask]

    def heads(p: dict) -> tuple[np.ndarray, np.ndarray]:
        z = x @ p["ip"][0].T + p["ip"][1]
        e = np.exp(z - z.max(axis=1, keepdims=True))
        probs = e / e.sum(axis=1, keepdims=True)
        return probs[np.arange(len(a)), a], (x @ p["vip"][0].T + p["vip"][1])[:, 0]

    p_old, v_old = heads(w_old)
    adv = r - v_old
    adv = (adv - adv.mean()) / adv.std()
    p_new, v_new = heads(w)
    ratio = p_new / p_old
    clipped = np.clip(ratio, 1 - CLIP, 1 + CLIP)
    policy = -np.mean(np.minimum(ratio * adv, clipped * adv))
    return float(policy + VALUE_WEIGHT * np.mean((v_new - r) ** 2))


def finite_difference(w: dict, traj, returns: np.ndarray, h: float = 1e-6) -> dict:
    """Central differences of :func:`np_loss` in every param (V_old held at ``w``)."""
    grads = {}
    for name, blobs in w.items():
        grads[name] = []
        for i, blob in enumerate(blobs):
            g = np.zeros_like(blob)
            for idx in np.ndindex(blob.shape):
                up = {k: [b.copy() for b in v] for k, v in w.items()}
                down = {k: [b.copy() for b in v] for k, v in w.items()}
                up[name][i][idx] += h
                down[name][i][idx] -= h
                g[idx] = (np_loss(up, w, traj, returns) - np_loss(down, w, traj, returns)) / (2 * h)
            grads[name].append(g)
    return grads


def test_value_head_gradient_is_the_float64_finite_difference():
    """One PPO update (1 epoch, 1 minibatch, SGD lr 1) through the trainer's jitted learn
    step: ``w − w'`` is the loss's gradient, the value head's included, which must equal
    float64 central differences of the NumPy transcription. Tolerance: the update runs in
    float32 (rtol 1e-4 on gradients of size ~1; atol 1e-5 for the near-zero ones)."""
    t = value_trainer("value_blob: 'value'")
    ts = t.init()
    traj = toy_batch("softmax")
    traj = traj._replace(rewards=traj.rewards * jnp.arange(1.0, 8.0)[:, None] * traj.mask)
    params, _ = t.learn(ts.params, ts.state, ts.opt_state, traj)
    returns = np.asarray(rule.discounted_returns(traj.rewards, traj.mask, GAMMA), np.float64)
    w = {k: [np.asarray(b, np.float64) for b in v] for k, v in ts.params.items()}
    fd = finite_difference(w, traj, returns)
    for name in ("ip", "vip"):
        for before, after, want in zip(ts.params[name], params[name], fd[name]):
            got = np.asarray(before, np.float64) - np.asarray(after, np.float64)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.abs(fd["vip"][0]).max() > 1.0  # the value head does move (returns up to ~20)


def test_value_baseline_changes_only_ppo_with_the_field():
    """Without value_blob the same net's PPO ignores the head (its params stay; the policy
    moves as MyCaffe's advantage says)."""
    t = value_trainer()
    ts = t.init()
    params, _ = t.learn(ts.params, ts.state, ts.opt_state, toy_batch("softmax"))
    for before, after in zip(ts.params["vip"], params["vip"]):
        np.testing.assert_array_equal(np.asarray(before), np.asarray(after))
    assert not np.array_equal(np.asarray(ts.params["ip"][0]), np.asarray(params["ip"][0]))


@pytest.mark.parametrize(
    ("update", "net_extra", "message"),
    [
        ("value_blob: 'nope'", VALUE_HEAD, "value_blob 'nope' is not a blob"),
        ("value_blob: 'prob'", VALUE_HEAD, "must hold one value per step"),
        ("value_blob: 'logits'", VALUE_HEAD, "must hold one value per step"),
        ("value_blob: 'value'", VALUE_HEAD.replace("num_output: 1", "num_output: 2"),
         r"value_blob 'value' \[3, 2\] must hold one value per step"),
        ("value_blob: 'value'", VALUE_HEAD.replace("loss_weight: 0.5 ", ""),
         "value_blob 'value' needs a loss_weight in the net"),
    ],
)  # fmt: skip
def test_bad_value_heads_fail_in_one_line(update, net_extra, message):
    with pytest.raises(RLError, match=message) as err:
        value_trainer(update, net_extra)
    assert "\n" not in str(err.value)


def test_value_blob_is_ppos_only():
    rl = 'env: "cartpole-v1" batch_size: 3 update { type: "TRPO" value_blob: "value" }'
    net = linear_net("softmax") + "\n" + VALUE_HEAD
    with pytest.raises(RLError, match="value_blob \\('value'\\) is PPO's value baseline"):
        PolicyGradientTrainer(solver_text(net, rl), seed=0)


def test_minibatches_gather_their_steps_as_the_masked_full_batch_would():
    """PPO's minibatches evaluate only their group's steps (gathered rows): the trainer's
    jitted update (2 epochs × 3 minibatches, value head) equals the same deal computed over
    the whole batch with each group's mask. Sums over the group's steps run in another
    order: rtol 1e-5."""
    net = linear_net("softmax") + "\n" + VALUE_HEAD
    rl = ('env: "cartpole-v1" batch_size: 3 update { type: "PPO" epochs: 2 minibatches: 3 '
          'value_blob: "value" }')  # fmt: skip
    t = PolicyGradientTrainer(solver_text(net, rl, 'type: "SGD" base_lr: 0.1'), seed=0)
    ts, traj = t.init(), toy_batch("softmax")
    got, _ = t.learn(ts.params, ts.state, ts.opt_state, traj)

    def reference(params, state, opt_state):
        heads = t.learning.heads_fn(state, traj)
        probs, values = heads(params)
        returns = rule.discounted_returns(traj.rewards, traj.mask, GAMMA)
        adv = sur.batch_standardize(returns - values[..., 0], traj.mask)
        ref = sur.log_prob(probs, traj.actions, False)

        def loss(p, group):
            probs, values = heads(p)
            logp = sur.log_prob(probs, traj.actions, False)
            err = values[..., 0] - returns
            return (-sur.clipped_surrogate(logp, ref, adv, group, CLIP)
                    + VALUE_WEIGHT * sur.masked_mean(err * err, group))  # fmt: skip

        def apply(p, o, diff):
            return t.learning.apply(p, state, o, diff)

        key = jax.random.fold_in(jax.random.key(0), 0)
        return ppo.epochs_of_minibatches(jax.grad(loss), apply, params, opt_state, traj.mask,
                                         key, 2, 3)[0]  # fmt: skip

    want = jax.jit(reference)(ts.params, ts.state, ts.opt_state)
    for a, b, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), jax.tree.leaves(ts.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        assert not np.allclose(np.asarray(a), np.asarray(w))


# -- chunked evaluation ----------------------------------------------------------------------


def test_chunked_rows_match_one_call_with_gradients():
    """``chunked_rows`` (21 rows in chunks of at most 5: 5 chunks of 5, 4 padded rows) gives
    the one-call outputs and the same gradient and forward-over-reverse product, jitted."""
    rng = np.random.default_rng(0)
    rows = jnp.asarray(rng.normal(size=(21, 4)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)

    def f(w, chunk):
        out = learners.chunked_rows(lambda r: jax.nn.softmax(jnp.tanh(r @ w)), rows, chunk)
        return jnp.sum(out * jnp.arange(3.0))

    for chunk in (5, 21, 0):
        assert learners.chunked_rows(lambda r: r * 2, rows, chunk).shape == (21, 4)
    whole, parts = jax.jit(lambda w: f(w, 0)), jax.jit(lambda w: f(w, 5))
    np.testing.assert_array_equal(np.asarray(whole(w)), np.asarray(parts(w)))
    g0, g1 = jax.jit(jax.grad(whole))(w), jax.jit(jax.grad(parts))(w)
    np.testing.assert_allclose(np.asarray(g1), np.asarray(g0), rtol=1e-6, atol=1e-7)
    hvp = lambda fn: jax.jit(lambda v: jax.jvp(jax.grad(fn), (w,), (v,))[1])  # noqa: E731
    np.testing.assert_allclose(np.asarray(hvp(parts)(w)), np.asarray(hvp(whole)(w)),
                               rtol=1e-5, atol=1e-6)  # fmt: skip


@pytest.mark.parametrize(
    "update", ['type: "TRPO"', 'type: "PPO" epochs: 2 minibatches: 2 value_blob: "value"']
)
def test_chunked_update_equals_the_unchunked_one(update):
    """The trainer's jitted update with ``chunk_rows: 4`` (21 rows → 6 chunks) against
    ``chunk_rows: 0`` (one call) on the same batch: the same params. The gradient's sum over
    the rows runs in another order when chunked (per chunk, then over chunks), so equal to
    float32 rounding: rtol 1e-5."""
    net = linear_net("softmax") + "\n" + VALUE_HEAD
    rl = f'env: "cartpole-v1" batch_size: 3 update {{ {update} chunk_rows: 4 }}'
    t = PolicyGradientTrainer(solver_text(net, rl, 'type: "SGD" base_lr: 0.1'), seed=0)
    ts = t.init()
    traj = toy_batch("softmax")
    chunked = t.learn(ts.params, ts.state, ts.opt_state, traj)
    whole_settings = dataclasses.replace(t.config.update, chunk_rows=0)
    t.learning = dataclasses.replace(t.learning, settings=whole_settings)
    whole = jax.jit(t.learn_fn)(ts.params, ts.state, ts.opt_state, traj)
    moved = False
    for a, b, w in zip(jax.tree.leaves(chunked[0]), jax.tree.leaves(whole[0]),
                       jax.tree.leaves(ts.params)):  # fmt: skip
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        moved |= not np.allclose(np.asarray(a), np.asarray(w))
    assert moved


@pytest.mark.slow
def test_ppo_with_a_value_baseline_solves_cartpole_v1_from_the_cli(tmp_path, monkeypatch, capsys):
    """examples/rl/cartpole_ppo_value_solver.prototxt solves CartPole-v1 (mean ≥ 475 over 100
    episodes) from ``caffe2jax rl`` with seed 0 within 240 s."""
    monkeypatch.chdir(tmp_path)
    solver = EXAMPLES / "cartpole_ppo_value_solver.prototxt"
    assert main(["rl", "--solver", str(solver), "--seed", "0"]) == 0
    out = capsys.readouterr().out
    solved = [line for line in out.splitlines() if line.startswith("Solved:")]
    assert len(solved) == 1, out
    match = re.fullmatch(r"Solved: mean return (\d+\.\d) over the last 100 episodes at episode "
                         r"(\d+) \((\d+\.\d) s, \d+ env-steps/s\)", solved[0])  # fmt: skip
    assert match and float(match.group(1)) >= 475 and float(match.group(3)) <= 240
