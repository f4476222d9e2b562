"""MyCaffe's policy-gradient rule against a NumPy transcription of its formulas.

The reference follows MyCaffe's TrainerPG (pg.st) step by step on fixed episodes, in float64:
GetDiscountedRewards' backward loop, Blob.NormalizeData with the population std, Dlogps (or
softmax − onehot), the product with the standardised rewards, MemoryLoss's ÷ episode length,
a hand-written backward through InnerProduct → ReLU → InnerProduct, the sum over the batch's
episodes, and one SGD ApplyUpdate (lr 1, so the step equals the accumulated diff).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.runtime.rl import rule
from caffe2jax.runtime.rl.rollout import Trajectory
from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer

GAMMA = 0.9
LENGTHS = (5, 1, 7)  # episodes of the batch; the 1-step one has a zero std
T = 8
HIDDEN = 6


def net_text(
    kind: str = "sigmoid",
    actions: int = 2,
    wiring: str = "logits",
    normalization: str = "VALID",
    data: bool = True,
    loss: bool = True,
    hidden: int = HIDDEN,
) -> str:
    """A MyCaffe-shaped policy net: MemoryData → IP → ReLU → IP → Sigmoid/Softmax, MemoryLoss
    on the logits (``wiring="logits"``) or on the probabilities (``"probs"``)."""
    outputs = 1 if kind == "sigmoid" else actions
    layers = []
    if data:
        layers.append(
            'layer { name: "data" type: "MemoryData" top: "data" top: "label" '
            "memory_data_param { batch_size: 3 channels: 4 height: 1 width: 1 } }"
        )
    else:
        layers.append(
            'layer { name: "data" type: "Input" top: "data" '
            "input_param { shape { dim: 3 dim: 4 dim: 1 dim: 1 } } }"
        )
    for name, bottom, top, n in (("ip1", "data", "h", hidden), ("ip2", "h", "logits", outputs)):
        layers.append(
            f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{top}" '
            f"inner_product_param {{ num_output: {n} weight_filler {{ type: 'gaussian' "
            "std: 0.5 } bias_filler { type: 'gaussian' std: 0.1 } } }"
        )
        if name == "ip1":
            layers.append('layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }')
    prob_type = "Sigmoid" if kind == "sigmoid" else "Softmax"
    layers.append(f'layer {{ name: "prob" type: "{prob_type}" bottom: "logits" top: "prob" }}')
    if loss:
        bottom = "logits" if wiring == "logits" else "prob"
        layers.append(
            f'layer {{ name: "loss" type: "MemoryLoss" bottom: "{bottom}" top: "loss" '
            f"loss_param {{ normalization: {normalization} }} }}"
        )
    return 'name: "policy"\n' + "\n".join(layers)


def solver_text(net: str, rl: str = "", solver: str = 'type: "SGD" base_lr: 1') -> str:
    return f'{solver}\nlr_policy: "fixed"\nnet_param {{ {net} }}\nrl_param {{ {rl} }}'


# -- the NumPy transcription ---------------------------------------------------------------


def np_discounted(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """MemoryCollection.GetDiscountedRewards for one episode."""
    out = np.zeros_like(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = running * gamma + rewards[t]
        out[t] = running
    return out


def np_normalize(values: np.ndarray, population: bool = True) -> np.ndarray:
    """Blob.mean / Blob.std / Blob.NormalizeData."""
    mean = values.mean()
    n = len(values) if population else len(values) - 1
    std = np.sqrt(np.sum((values - mean) ** 2) / n) if n > 0 else 0.0
    out = values - mean if mean != 0 else values.copy()
    if std != 0 and std != 1:
        out = out / std
    return out


def np_forward(p: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.maximum(x @ p["W1"].T + p["b1"], 0)
    return h, h @ p["W2"].T + p["b2"]


def np_backward(p: dict, x: np.ndarray, diff: np.ndarray) -> dict:
    """Caffe's Backward from the logits' diff through InnerProduct → ReLU → InnerProduct."""
    h, _ = np_forward(p, x)
    dh = (diff @ p["W2"]) * (h > 0)
    return {"W2": diff.T @ h, "b2": diff.sum(0), "W1": dh.T @ x, "b1": dh.sum(0)}


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_episode_diff(kind, p, x, actions, rewards, wiring="logits", by_length=True):
    """MemoryLoss's bottom diff for one episode, mapped back to the logits."""
    _, z = np_forward(p, x)
    adv = np_normalize(np_discounted(rewards, GAMMA))
    scale = 1.0 / len(rewards) if by_length else 1.0
    if kind == "sigmoid":
        aprob = 1 / (1 + np.exp(-z[:, 0]))
        dlogps = (actions == 0).astype(float) - aprob
        diff = (-dlogps * adv * scale)[:, None]
        if wiring == "probs":  # the diff is set on the Sigmoid's top: its backward follows
            diff = diff * (aprob * (1 - aprob))[:, None]
        return diff
    onehot = np.eye(z.shape[1])[actions]
    base = softmax(z) if wiring == "logits" else softmax(softmax(z))
    diff = (base - onehot) * (adv * scale)[:, None]
    if wiring == "probs":  # Softmax backward: y ⊙ (d − Σ d·y)
        y = softmax(z)
        diff = y * (diff - np.sum(diff * y, axis=1, keepdims=True))
    return diff


# -- fixtures ------------------------------------------------------------------------------


def _episodes(seed: int, kind: str, params: dict) -> tuple[Trajectory, list]:
    """Fixed episodes padded to T steps, with the probabilities the net gives them."""
    rng = np.random.default_rng(seed)
    x = np.zeros((T, len(LENGTHS), 4))
    actions = np.zeros((T, len(LENGTHS)), np.int32)
    rewards = np.zeros((T, len(LENGTHS)))
    mask = np.zeros((T, len(LENGTHS)))
    outputs = 1 if kind == "sigmoid" else 2
    probs = np.zeros((T, len(LENGTHS), outputs))
    episodes = []
    for b, n in enumerate(LENGTHS):
        xe = rng.normal(size=(n, 4))
        ae = rng.integers(0, 2, n).astype(np.int32)
        re = rng.choice([0.0, 1.0, 2.0], size=n)
        _, z = np_forward(params, xe)
        pe = 1 / (1 + np.exp(-z)) if kind == "sigmoid" else softmax(z)
        x[:n, b], actions[:n, b], rewards[:n, b], mask[:n, b], probs[:n, b] = xe, ae, re, 1, pe
        episodes.append((xe, ae, re))
    traj = Trajectory(
        jnp.asarray(x, jnp.float32),
        jnp.asarray(actions),
        jnp.asarray(probs, jnp.float32),
        jnp.asarray(rewards, jnp.float32),
        jnp.asarray(mask, jnp.float32),
    )
    return traj, episodes


def _np_params(params) -> dict:
    return {
        "W1": np.asarray(params["ip1"][0], np.float64),
        "b1": np.asarray(params["ip1"][1], np.float64),
        "W2": np.asarray(params["ip2"][0], np.float64),
        "b2": np.asarray(params["ip2"][1], np.float64),
    }


def _check_update(trainer: PolicyGradientTrainer, kind: str, wiring: str, by_length: bool):
    ts = trainer.init(seed=7)
    p = _np_params(ts.params)
    traj, episodes = _episodes(3, kind, p)
    expected = {k: np.zeros_like(v) for k, v in p.items()}
    for xe, ae, re in episodes:  # accumulated over the batch's episodes
        diff = np_episode_diff(kind, p, xe, ae, re, wiring, by_length)
        for k, g in np_backward(p, xe, diff).items():
            expected[k] += g
    new_params, _ = trainer.learn(ts.params, ts.state, ts.opt_state, traj)
    got = _np_params(new_params)
    for k in p:  # SGD, lr 1, no momentum: w_new = w − diff
        np.testing.assert_allclose(p[k] - got[k], expected[k], rtol=2e-5, atol=2e-6, err_msg=k)
    assert np.abs(expected["W1"]).sum() > 0.1  # the episodes do move the weights


# -- the tests -----------------------------------------------------------------------------


def test_discounted_returns_match_mycaffe_loop():
    rng = np.random.default_rng(0)
    rewards = np.zeros((T, len(LENGTHS)))
    mask = np.zeros_like(rewards)
    for b, n in enumerate(LENGTHS):
        rewards[:n, b] = rng.normal(size=n)
        mask[:n, b] = 1
    got = np.asarray(rule.discounted_returns(jnp.asarray(rewards), jnp.asarray(mask), GAMMA))
    for b, n in enumerate(LENGTHS):
        np.testing.assert_allclose(got[:n, b], np_discounted(rewards[:n, b], GAMMA), rtol=1e-6)
        assert np.all(got[n:, b] == 0)


def test_allow_discount_reset_against_a_hand_computed_case():
    """Pong's shape: a point won at step 2, one lost at step 5, gamma 0.5. Without the reset
    the sum runs across the point; MyCaffe's AllowDiscountReset (pg-pong's "game boundary")
    starts it again at each non-zero reward. Padded steps (6, 7) stay 0."""
    rewards = jnp.asarray([0, 0, 1, 0, 0, -1, 0, 0], jnp.float32)[:, None]
    mask = jnp.asarray([1, 1, 1, 1, 1, 1, 0, 0], jnp.float32)[:, None]
    plain = rule.discounted_returns(rewards, mask, 0.5)[:, 0]
    reset = rule.discounted_returns(rewards, mask, 0.5, allow_reset=True)[:, 0]
    # R5 = -1, R4 = -0.5, R3 = -0.25; R2 = 1 + 0.5 * -0.25 = 0.875, R1 = 0.4375, R0 = 0.21875
    np.testing.assert_array_equal(
        np.asarray(plain), [0.21875, 0.4375, 0.875, -0.25, -0.5, -1, 0, 0]
    )
    # with the reset, R2 = 1 (the -0.25 after the point is dropped), R1 = 0.5, R0 = 0.25
    np.testing.assert_array_equal(np.asarray(reset), [0.25, 0.5, 1, -0.25, -0.5, -1, 0, 0])


@pytest.mark.parametrize("population", [True, False])
def test_standardize_matches_normalize_data(population):
    rng = np.random.default_rng(1)
    values = np.zeros((T, len(LENGTHS)), np.float32)
    mask = np.zeros_like(values)
    for b, n in enumerate(LENGTHS):
        values[:n, b] = rng.normal(3.0, 2.0, n)
        mask[:n, b] = 1
    got = np.asarray(rule.standardize(jnp.asarray(values), jnp.asarray(mask), population))
    for b, n in enumerate(LENGTHS):
        want = np_normalize(values[:n, b].astype(np.float64), population)
        np.testing.assert_allclose(got[:n, b], want, rtol=1e-5, atol=1e-6)
        assert np.all(got[n:, b] == 0)
    assert np.all(got[:1, 1] == 0)  # one step: the mean is removed and the zero std skipped


def test_dlogps_and_softmax_diff_signs():
    """Caffe subtracts lr·diff: a positive advantage must lower the diff of the taken action."""
    aprob = jnp.asarray([[0.3, 0.8]])
    actions = jnp.asarray([[0, 1]])
    adv = jnp.asarray([[2.0, 2.0]])
    sig = np.asarray(rule.sigmoid_diff(aprob, actions, adv))[..., 0]
    np.testing.assert_allclose(sig, [[-(1 - 0.3) * 2, -(0 - 0.8) * 2]], rtol=1e-6)
    logits = jnp.asarray([[[0.1, 0.5, -0.2]]])
    soft = np.asarray(rule.softmax_diff(logits, jnp.asarray([[2]]), jnp.asarray([[1.5]])))
    want = (softmax(np.asarray(logits[0, 0], np.float64)) - np.eye(3)[2]) * 1.5
    np.testing.assert_allclose(soft[0, 0], want, rtol=1e-5)


@pytest.mark.parametrize(
    ("kind", "wiring"),
    [("sigmoid", "logits"), ("softmax", "logits"), ("sigmoid", "probs"), ("softmax", "probs")],
)
def test_learning_step_matches_numpy(kind, wiring):
    trainer = PolicyGradientTrainer(
        solver_text(net_text(kind, wiring=wiring), f"gamma: {GAMMA} batch_size: 3"), seed=0
    )
    _check_update(trainer, kind, wiring, by_length=True)


def test_normalization_none_and_override():
    plain = PolicyGradientTrainer(
        solver_text(net_text(normalization="NONE"), f"gamma: {GAMMA} batch_size: 3"), seed=0
    )
    _check_update(plain, "sigmoid", "logits", by_length=False)
    forced = PolicyGradientTrainer(
        solver_text(net_text(normalization="NONE"), f"gamma: {GAMMA} normalize_by_length: true"),
        seed=0,
    )
    _check_update(forced, "sigmoid", "logits", by_length=True)


def test_param_grads_is_the_vjp_of_the_bottom():
    w = {"a": [jnp.asarray([[1.0, -2.0]]), None]}
    x = jnp.asarray([[0.5, 0.25], [1.0, 3.0]])

    def bottom_fn(p):
        return x @ p["a"][0].T

    grads = rule.param_grads(bottom_fn, w, lambda bottom: jnp.ones_like(bottom) * 2)
    np.testing.assert_allclose(np.asarray(grads["a"][0]), [[3.0, 6.5]])
    assert grads["a"][1] is None
    assert jax.tree.structure(grads) == jax.tree.structure(w)


@pytest.mark.parametrize("kind", ["sigmoid", "softmax"])
def test_chunked_grads_equal_whole_batch(kind):
    """batch_grads works ``chunk`` steps at a time and stops after the longest episode."""
    trainer = PolicyGradientTrainer(solver_text(net_text(kind)), seed=0)
    ts = trainer.init(seed=2)
    traj, _ = _episodes(4, kind, _np_params(ts.params))
    advantage = jnp.asarray(np.random.default_rng(5).normal(size=traj.mask.shape)) * traj.mask

    def bottom_of(p, x):
        return trainer.policy.forward(p, ts.state, x)[1]

    whole = rule.batch_grads(bottom_of, ts.params, traj, advantage, kind == "sigmoid", 0)
    for chunk in (2, 4):
        parts = rule.batch_grads(bottom_of, ts.params, traj, advantage, kind == "sigmoid", chunk)
        for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(parts)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
