"""lowering/forks/crnn.py: CRNN's CtcLoss against CTC computed by enumerating every alignment,
Caffe's diff (N × the gradient of the top, as the fork scales warp-ctc's gradient) against
float64 finite differences, and LabelsequenceAccuracy against hand-decoded cases."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import net, ours


def _ctc_text(shape, label_shape, blank: int, steps: int | None = None) -> str:
    steps = shape[0] if steps is None else steps
    layer = ('layer { name: "ctc" type: "CtcLoss" bottom: "x" bottom: "label" top: "loss" '
             f"ctc_loss_param {{ alphabet_size: {shape[2]} time_step: {steps} "
             f"blank_label: {blank} }} }}")  # fmt: skip
    return net(layer, {"x": shape, "label": label_shape})


def _collapse(path, blank: int) -> tuple[int, ...]:
    out, prev = [], None
    for k in path:
        if k != prev and k != blank:
            out.append(k)
        prev = k
    return tuple(out)


def _enumerated_cost(scores: np.ndarray, target: tuple[int, ...], blank: int) -> float:
    """−log Σ over every alignment π (C^T of them) that collapses to ``target`` of Π p_t(π_t),
    with p the softmax over classes of the (T, C) scores."""
    x = scores.astype(np.float64)
    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    total = 0.0
    for path in itertools.product(range(x.shape[1]), repeat=x.shape[0]):
        if _collapse(path, blank) == target:
            total += float(np.prod([p[t, k] for t, k in enumerate(path)]))
    return -np.log(total) if total > 0 else 0.0  # warp-ctc: an unalignable sequence costs 0


RNG = np.random.default_rng(3)


@pytest.mark.parametrize(
    "blank, labels, targets",
    [
        # blank 0; padding (0) trailing, leading and in between: all dropped, order kept
        (0, [[1, 2, 0], [0, 2, 0], [1, 0, 1]], [(1, 2), (2,), (1, 1)]),
        # blank 2 (not 0): class 0 is a label; "1 1" needs a blank between (T = 3 suffices)
        (2, [[0, 1, 2], [2, 2, 0], [1, 2, 1]], [(0, 1), (0,), (1, 1)]),
        # 1 1 1 cannot be aligned in T = 3 steps (it needs 5: 1 b 1 b 1) and costs 0
        (2, [[1, 0, 1], [1, 1, 1], [0, 2, 2]], [(1, 0, 1), (1, 1, 1), (0,)]),
    ],
)
def test_ctc_loss_by_enumerating_alignments(blank, labels, targets):
    x = RNG.standard_normal((3, 3, 3)).astype(np.float32)  # (T, N, C)
    label = np.asarray(labels, np.float32)
    loss = ours(_ctc_text(x.shape, label.shape, blank), {"x": x, "label": label})["loss"]
    costs = [_enumerated_cost(x[:, n], targets[n], blank) for n in range(3)]
    np.testing.assert_allclose(loss, sum(costs) / 3, rtol=1e-5)


def test_ctc_loss_two_steps_hand_worked():
    """T = 2, C = 3, blank 0, target "1": alignments 1 1, 0 1, 1 0 (and, for target "1 2",
    only 1 2). Uniform scores: p = 1/3 each, so −log(3/9) and −log(1/9)."""
    x = np.zeros((2, 2, 3), np.float32)
    label = np.array([[1, 0], [1, 2]], np.float32)
    loss = ours(_ctc_text(x.shape, label.shape, 0), {"x": x, "label": label})["loss"]
    np.testing.assert_allclose(loss, (np.log(3.0) + np.log(9.0)) / 2, rtol=1e-6)


def test_ctc_loss_time_step_reads_the_first_steps():
    x = RNG.standard_normal((4, 2, 3)).astype(np.float32)
    label = np.array([[1, 0], [2, 1]], np.float32)
    loss = ours(_ctc_text(x.shape, label.shape, 0, steps=3), {"x": x, "label": label})["loss"]
    costs = [_enumerated_cost(x[:3, 0], (1,), 0), _enumerated_cost(x[:3, 1], (2, 1), 0)]
    np.testing.assert_allclose(loss, sum(costs) / 2, rtol=1e-5)


def test_ctc_loss_diff_is_n_times_the_gradient_of_the_top():
    """The fork's backward scales warp-ctc's per-sequence gradients by the top diff without
    the forward's 1/N: Caffe's diff = N · ∂top/∂x. Checked against float64 central
    differences of the top; the unread step (time_step 3 of 4) gets no gradient."""
    x0 = RNG.standard_normal((4, 2, 3))
    with jax.enable_x64(True):
        label = jnp.asarray([[1, 2, 0], [2, 2, 0]], jnp.float64)
        model = compile_net(_ctc_text(x0.shape, label.shape, 0, steps=3), dtype=jnp.float64)
        params, state = model.init(0)

        @jax.jit
        def top(x):
            return jitted.forward(model, params, state, {"x": x, "label": label})[0]["loss"]

        grad = np.asarray(jax.grad(top)(jnp.asarray(x0)))
        fd, eps = np.zeros_like(x0), 1e-6
        for i in np.ndindex(x0.shape):
            step = np.zeros_like(x0)
            step[i] = eps
            fd[i] = float(top(jnp.asarray(x0 + step))) - float(top(jnp.asarray(x0 - step)))
            fd[i] /= 2 * eps
    np.testing.assert_allclose(grad, 2 * fd, rtol=1e-6, atol=1e-8)
    assert np.all(grad[3] == 0)
    # warp-ctc's gradient is p − γ: each step's gradient sums to 0 over the classes
    np.testing.assert_allclose(grad[:3].sum(axis=2), 0, atol=1e-12)


@pytest.mark.parametrize(
    "label, why",
    [([[1, 3]], "label outside [0, alphabet_size)"), ([[0, 0]], "every label is blank")],
)
def test_ctc_loss_bad_labels_give_nan(label, why):
    x = RNG.standard_normal((3, 1, 3)).astype(np.float32)
    lab = np.asarray(label, np.float32)
    assert np.isnan(ours(_ctc_text(x.shape, lab.shape, 0), {"x": x, "label": lab})["loss"]), why


@pytest.mark.parametrize(
    "shape, label_shape, param, message",
    [
        ((3, 2, 3), (2, 2), "alphabet_size: 4 time_step: 3", "alphabet_size (4) must equal"),
        ((3, 2, 3), (2, 2), "alphabet_size: 3 time_step: 4", "time_step (4) must be in"),
        ((3, 2, 3), (2, 2), "alphabet_size: 3", "time_step (0) must be in"),
        ((3, 2, 3), (3, 2), "alphabet_size: 3 time_step: 3", "one row per sequence"),
        ((3, 2, 3), (2, 2), "alphabet_size: 3 time_step: 3 blank_label: 3", "blank_label (3)"),
    ],
)
def test_ctc_loss_refuses_what_the_fork_checks(shape, label_shape, param, message):
    layer = ('layer { name: "ctc" type: "CtcLoss" bottom: "x" bottom: "label" top: "loss" '
             f"ctc_loss_param {{ {param} }} }}")  # fmt: skip
    with pytest.raises(NetError, match="CtcLoss") as err:
        compile_net(net(layer, {"x": shape, "label": label_shape}))
    assert message in str(err.value)


def _acc_text(shape, label_shape, blank: int) -> str:
    layer = (
        'layer { name: "acc" type: "LabelsequenceAccuracy" bottom: "x" bottom: "label" '
        f'top: "acc" labelsequence_accuracy_param {{ blank_label: {blank} }} }}'
    )
    return net(layer, {"x": shape, "label": label_shape})


def _scores(paths, classes: int) -> np.ndarray:
    """(N, T, C) scores whose argmax per step is ``paths[n][t]``."""
    x = np.zeros((len(paths), len(paths[0]), classes), np.float32)
    for n, path in enumerate(paths):
        for t, k in enumerate(path):
            x[n, t, k] = 1.0
    return x


def test_labelsequence_accuracy_hand_decoded():
    """blank 3. Paths → decodings: 1 1 3 1 2 → 1 1 2 (repeat collapsed, blank splits);
    3 3 2 2 2 → 2; 0 3 0 3 3 → 0 0; 1 2 2 3 3 → 1 2. Labels (blank padding anywhere):
    [1 1 2 3] hit, [3 2 3 3] hit, [0 3 3 3] miss (one 0), [1 2 3 2] miss (1 2 2)."""
    x = _scores([[1, 1, 3, 1, 2], [3, 3, 2, 2, 2], [0, 3, 0, 3, 3], [1, 2, 2, 3, 3]], 4)
    label = np.array([[1, 1, 2, 3], [3, 2, 3, 3], [0, 3, 3, 3], [1, 2, 3, 2]], np.float32)
    acc = ours(_acc_text(x.shape, label.shape, 3), {"x": x, "label": label})["acc"]
    np.testing.assert_allclose(acc, 0.5)


def test_labelsequence_accuracy_ties_take_the_first_class():
    x = np.zeros((1, 2, 3), np.float32)  # every class ties: std::max_element picks class 0
    label = np.array([[0, 2]], np.float32)
    assert ours(_acc_text(x.shape, label.shape, 2), {"x": x, "label": label})["acc"] == 1.0
    assert ours(_acc_text(x.shape, label.shape, 0), {"x": x, "label": label})["acc"] == 0.0


def test_labelsequence_accuracy_refuses_other_layouts():
    with pytest.raises(NetError, match="LabelsequenceAccuracy"):
        compile_net(_acc_text((2, 3, 4), (3, 2), 0))
