"""Caffe's solvers replayed against the real-Caffe traces in golden/solvers (parity = correct)."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from google.protobuf import text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.runtime.train import solvers
from tests.golden import GOLDEN, load_npz, require
from tests.runtime.train.test_lr_policy import SOLVER_CASES

TOL = 1e-5
SNAPSHOT_ITER = 5


@dataclass
class Case:
    sp: caffe_pb2.SolverParameter
    lr_mult: dict
    decay_mult: dict
    order: list[tuple[str, int]]
    arrays: dict
    meta: dict

    def params_at(self, prefix: str, index: int | None = None) -> dict:
        """Params from the trace (`init` or `param` after update `index`) as the pytree."""
        out: dict = {}
        for layer, k in self.order:
            value = self.arrays[f"{prefix}__{layer}__{k}"]
            out.setdefault(layer, []).append(jnp.asarray(value if index is None else value[index]))
        return out

    def grads_at(self, i: int) -> dict:
        return {
            layer: [jnp.asarray(self.arrays[f"rawgrad__{layer}__{k}"][i]) for k in range(len(bl))]
            for layer, bl in self.lr_mult.items()
        }


def mults(net: caffe_pb2.NetParameter, order: list[tuple[str, int]]) -> tuple[dict, dict]:
    """lr_mult/decay_mult from the layers' ParamSpecs (default 1); BatchNorm forces lr_mult 0."""
    layers = {layer.name: layer for layer in net.layer}
    lr_mult: dict = {}
    decay_mult: dict = {}
    for name, k in order:
        layer = layers[name]
        spec = layer.param[k] if k < len(layer.param) else caffe_pb2.ParamSpec()
        lr_mult.setdefault(name, []).append(0.0 if layer.type == "BatchNorm" else spec.lr_mult)
        decay_mult.setdefault(name, []).append(spec.decay_mult)
    return lr_mult, decay_mult


def load_case(case: str) -> Case:
    root = GOLDEN / "solvers" / case
    sp = text_format.Parse(
        require(root / "solver.prototxt").read_text(), caffe_pb2.SolverParameter()
    )
    net = text_format.Parse(require(root / "net.prototxt").read_text(), caffe_pb2.NetParameter())
    arrays, meta = load_npz(root / "trace.npz")
    order = [(name.rsplit("__", 1)[0], int(name.rsplit("__", 1)[1])) for name in meta["params"]]
    lr_mult, decay_mult = mults(net, order)
    return Case(sp, lr_mult, decay_mult, order, arrays, meta)


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(ours) - ref) / max(np.linalg.norm(ref), 1e-30))


def replay(case: Case, update, params: dict, state, steps: range) -> tuple[dict, object]:
    """Feed the golden raw gradients; check params after each update and lr_mult-0 freezing."""
    for i in steps:
        assert solvers.solver_iter(state) == i
        lr = float(solvers.current_lr(case.sp, state))
        assert abs(lr - case.arrays["lr"][i]) <= 1e-7 * case.arrays["lr"][i]
        for layer, k in case.order:  # forward-updated lr_mult-0 blobs (BatchNorm statistics)
            if case.lr_mult[layer][k] == 0:
                params[layer][k] = jnp.asarray(case.arrays[f"param__{layer}__{k}"][i])
        updates, state = update(case.grads_at(i), state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
        for layer, k in case.order:
            if case.lr_mult[layer][k] == 0:
                assert np.all(np.asarray(updates[layer][k]) == 0), (layer, k)
            err = rel_err(params[layer][k], case.arrays[f"param__{layer}__{k}"][i])
            assert err <= TOL, (i, layer, k, err)
    return params, state


def test_case_list_matches_golden() -> None:
    found = sorted(p.name for p in require(GOLDEN / "solvers").iterdir() if p.is_dir())
    assert found == SOLVER_CASES


@pytest.mark.parametrize("case_name", SOLVER_CASES)
def test_golden_trace_and_snapshot_history(case_name: str) -> None:
    case = load_case(case_name)
    tx = solvers.caffe_solver(case.sp, case.lr_mult, case.decay_mult)
    params = case.params_at("init")
    state = tx.init(params)
    snap = case.meta["snapshot_at"]
    assert snap == SNAPSHOT_ITER
    update = jax.jit(tx.update)
    params, state = replay(case, update, params, state, range(snap))
    inner = solvers.solver_state(state)
    assert int(inner.iter) == case.meta["snapshot"]["iter"]
    assert int(inner.current_step) == case.meta["snapshot"]["current_step"]
    history = solvers.history_blobs(state, case.order)
    assert [list(h.shape) for h in history] == case.meta["snapshot"]["history_shapes"]
    for j, blob in enumerate(history):
        ref = case.arrays[f"snapshot_history__{j}"]
        assert rel_err(blob, ref) <= TOL, (j, rel_err(blob, ref))
    replay(case, update, params, state, range(snap, len(case.arrays["lr"])))


@pytest.mark.parametrize("case_name", SOLVER_CASES)
def test_golden_resume_from_solverstate_history(case_name: str) -> None:
    case = load_case(case_name)
    snapshot = case.meta["snapshot"]
    count = len(snapshot["history_shapes"])
    blobs = [case.arrays[f"snapshot_history__{j}"] for j in range(count)]
    params = case.params_at("param", SNAPSHOT_ITER - 1)
    state = solvers.state_from_history(
        case.sp, params, blobs, case.order, snapshot["iter"], snapshot["current_step"]
    )
    tx = solvers.caffe_solver(case.sp, case.lr_mult, case.decay_mult)
    replay(case, jax.jit(tx.update), params, state, range(SNAPSHOT_ITER, len(case.arrays["lr"])))


# ---------------------------------------------------------------- unit tests of the pieces

F = np.float32


def solver(text: str) -> caffe_pb2.SolverParameter:
    return text_format.Parse(text, caffe_pb2.SolverParameter())


def small_params() -> dict:
    return {
        "a": [jnp.array([[1.0, -2.0], [0.0, 3.0]], jnp.float32), jnp.array([0.5, -0.5])],
        "b": [jnp.array([2.0, 0.0, -1.0], jnp.float32)],
    }


def small_grads(scale: float = 1.0) -> dict:
    return {
        "a": [scale * jnp.array([[0.5, 1.0], [-1.0, 2.0]]), scale * jnp.array([1.0, -1.0])],
        "b": [scale * jnp.array([0.0, 2.0, 1.0])],
    }


def ones(params: dict, value: float = 1.0) -> dict:
    return jax.tree.map(lambda _: value, params)


def leaves(tree: dict) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def run(sp, params: dict, grads: list[dict], lr_mult=None, decay_mult=None):
    tx = solvers.caffe_solver(sp, lr_mult or ones(params), decay_mult or ones(params))
    state = tx.init(params)
    all_updates = []
    for g in grads:
        updates, state = jax.jit(tx.update)(g, state, params)
        all_updates.append(updates)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
    return params, state, all_updates


def test_sgd_keeps_the_rate_inside_the_momentum_history() -> None:
    sp = solver('type: "SGD" base_lr: 0.1 momentum: 0.9 lr_policy: "step" gamma: 0.5 stepsize: 1')
    params = small_params()
    g1, g2 = small_grads(), small_grads(-2.0)
    _, state, (u1, u2) = run(sp, params, [g1, g2])
    h1 = [F(0.1) * x for x in leaves(g1)]
    h2 = [F(0.05) * x + F(0.9) * h for x, h in zip(leaves(g2), h1)]
    for ours, want in zip(leaves(u2), h2):
        np.testing.assert_allclose(ours, -want, rtol=1e-6)
    assert solvers.solver_iter(state) == 2
    assert solvers.current_lr(sp, state) == float(F(0.025))


@pytest.mark.parametrize("scale", [10.0, 0.01])
def test_clip_uses_one_global_norm_before_iter_size_and_decay(scale: float) -> None:
    sp = solver(
        'type: "SGD" base_lr: 1 lr_policy: "fixed" clip_gradients: 1 iter_size: 2 weight_decay: 0.1'
    )
    params, grads = small_params(), small_grads(scale)
    _, _, (updates,) = run(sp, params, [grads])
    norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in leaves(grads)))
    factor = min(1.0, 1.0 / norm)  # scale ≥ 10 clips, 0.01 does not
    for u, g, w in zip(leaves(updates), leaves(grads), leaves(params)):
        np.testing.assert_allclose(u, -(g * factor / 2 + 0.1 * w), rtol=1e-6, atol=1e-7)


def test_no_clipping_by_default() -> None:
    sp = solver('type: "SGD" base_lr: 1 lr_policy: "fixed"')
    params, grads = small_params(), small_grads(100.0)
    _, _, (updates,) = run(sp, params, [grads])
    for u, g in zip(leaves(updates), leaves(grads)):
        np.testing.assert_array_equal(u, -g)


def test_l1_weight_decay_uses_sign_and_decay_mult() -> None:
    sp = solver(
        'type: "SGD" base_lr: 0.5 lr_policy: "fixed" weight_decay: 0.01 regularization_type: "L1"'
    )
    params, grads = small_params(), small_grads()
    decay_mult = {"a": [1.0, 0.0], "b": [2.0]}
    _, _, (updates,) = run(sp, params, [grads], decay_mult=decay_mult)
    for u, g, w, dm in zip(leaves(updates), leaves(grads), leaves(params), [1.0, 0.0, 2.0]):
        np.testing.assert_allclose(u, -F(0.5) * (g + F(0.01) * F(dm) * np.sign(w)), rtol=1e-6)


@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"])
def test_lr_mult_zero_freezes_but_histories_still_run(kind: str) -> None:
    momentum = "" if kind in ("AdaGrad", "RMSProp") else "momentum: 0.9"
    sp = solver(f'type: "{kind}" base_lr: 0.1 lr_policy: "fixed" weight_decay: 0.1 {momentum}')
    params = small_params()
    lr_mult = {"a": [0.0, 1.0], "b": [1.0]}
    final, state, updates = run(sp, params, [small_grads(), small_grads(-1.0)], lr_mult=lr_mult)
    for u in updates:
        assert np.all(np.asarray(u["a"][0]) == 0)
        assert np.any(np.asarray(u["b"][0]) != 0)
    np.testing.assert_array_equal(final["a"][0], params["a"][0])
    history = solvers.history_blobs(state, [("a", 0), ("a", 1), ("b", 0)])
    frozen_history = history[0]
    if kind in ("SGD", "Nesterov"):  # h = 0·g + μ·h stays 0
        assert np.all(frozen_history == 0)
    else:  # Caffe still accumulates squared gradients (and Adam's m) for lr_mult-0 blobs
        assert np.any(frozen_history != 0)


def test_shared_param_slots_are_none() -> None:
    sp = solver('type: "Adam" base_lr: 0.01 lr_policy: "fixed" momentum: 0.9 weight_decay: 0.1')
    params = {"a": [jnp.ones((2, 2)), jnp.zeros(2)], "b": [None, jnp.ones(3)]}
    grads = {"a": [jnp.ones((2, 2)), jnp.ones(2)], "b": [None, jnp.ones(3)]}
    mult = ones(params)
    assert mult["b"][0] is None
    final, state, (updates,) = run(sp, params, [grads], lr_mult=mult, decay_mult=mult)
    assert updates["b"][0] is None and final["b"][0] is None
    order = [("a", 0), ("a", 1), ("b", 1)]
    blobs = solvers.history_blobs(state, order)
    assert [b.shape for b in blobs] == [(2, 2), (2,), (3,)] * 2
    resumed = solvers.state_from_history(sp, final, blobs, order, 1, 0)
    assert solvers.solver_iter(resumed) == 1
    with pytest.raises(ValueError, match="not a learnable param slot"):
        solvers.history_blobs(state, [("b", 0)])


def test_update_traces_once_for_the_same_shapes() -> None:
    sp = solver('type: "Adam" base_lr: 0.01 lr_policy: "inv" gamma: 0.1 power: 0.75')
    params = small_params()
    tx = solvers.caffe_solver(sp, ones(params), ones(params))
    traces = []

    def step(grads, state, params):
        traces.append(1)  # runs only while tracing
        return tx.update(grads, state, params)

    jitted = jax.jit(step)
    state = tx.init(params)
    for scale in (1.0, -3.0, 0.5):
        updates, state = jitted(small_grads(scale), state, params)
    assert len(traces) == 1 and solvers.solver_iter(state) == 3


def test_adam_bias_correction_in_double_at_a_late_iteration() -> None:
    sp = solver('type: "Adam" base_lr: 0.001 lr_policy: "fixed" momentum: 0.9 momentum2: 0.999')
    params = {"w": [jnp.array([0.3, -0.2, 0.1], jnp.float32)]}
    m0, v0 = np.array([0.01, -0.02, 0.0], F), np.array([1e-4, 4e-4, 1e-6], F)
    state = solvers.state_from_history(sp, params, [m0, v0], [("w", 0)], 1000, 0)
    g = np.array([0.5, -0.1, 0.2], F)
    tx = solvers.caffe_solver(sp, ones(params), ones(params))
    updates, _ = tx.update({"w": [jnp.asarray(g)]}, state, params)
    t = 1001
    correction = np.sqrt(1 - np.float64(F(0.999)) ** t) / (1 - np.float64(F(0.9)) ** t)
    m = F(0.1) * g + F(0.9) * m0
    v = (F(1) - F(0.999)) * g * g + F(0.999) * v0
    want = -F(F(0.001) * F(correction)) * (m / (np.sqrt(v) + F(1e-8)))
    np.testing.assert_allclose(updates["w"][0], want, rtol=1e-6)


def test_float64_params_under_x64() -> None:
    sp = solver('type: "RMSProp" base_lr: 0.01 lr_policy: "exp" gamma: 0.9 weight_decay: 0.01')
    f32_final, _, _ = run(sp, small_params(), [small_grads(), small_grads(2.0)])
    with jax.enable_x64(True):
        params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), small_params())
        grads = [
            jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), small_grads(s)) for s in (1, 2)
        ]
        final, state, _ = run(sp, params, grads)
        assert all(x.dtype == jnp.float64 for x in jax.tree.leaves(final))
        assert all(h.dtype == np.float64 for h in solvers.history_blobs(state, [("b", 0)]))
    for ours, ref in zip(leaves(final), leaves(f32_final)):
        np.testing.assert_allclose(ours, ref, rtol=1e-6)


def test_bfloat16_params_keep_their_dtype() -> None:
    sp = solver('type: "Nesterov" base_lr: 0.1 lr_policy: "fixed" momentum: 0.9 clip_gradients: 1')
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), small_params())
    grads = jax.tree.map(lambda x: x.astype(jnp.bfloat16), small_grads())
    final, state, _ = run(sp, params, [grads])
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(final))
    assert solvers.history_blobs(state, [("b", 0)])[0].dtype == jnp.bfloat16


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('type: "sgd" base_lr: 0.1 lr_policy: "fixed"', "type"),
        ('type: "LBFGS" base_lr: 0.1 lr_policy: "fixed"', "type"),
        ('type: "SGD" base_lr: 0.1 lr_policy: "fixed" momentum: 1.0', "momentum"),
        ('type: "Nesterov" base_lr: 0.1 lr_policy: "fixed" momentum: -0.1', "momentum"),
        ('type: "AdaGrad" base_lr: 0.1 lr_policy: "fixed" momentum: 0.9', "momentum"),
        ('type: "RMSProp" base_lr: 0.1 lr_policy: "fixed" rms_decay: 1.0', "rms_decay"),
        ('type: "Adam" base_lr: 0.1 lr_policy: "fixed" momentum2: 1.5', "momentum2"),
        ('type: "Adam" base_lr: 0.1 lr_policy: "fixed" delta: -1e-8', "delta"),
        ('type: "AdaDelta" base_lr: 1 lr_policy: "fixed" delta: 0', "delta"),
        ('type: "SGD" base_lr: -0.1 lr_policy: "fixed"', "base_lr"),
        ('type: "SGD" base_lr: 0.1 lr_policy: "step"', "stepsize"),
        ('type: "SGD" base_lr: 0.1 lr_policy: "fixed" weight_decay: -1', "weight_decay"),
        (
            'type: "SGD" base_lr: 0.1 lr_policy: "fixed" weight_decay: 1 regularization_type: "L3"',
            "regularization_type",
        ),
        ('type: "SGD" base_lr: 0.1 lr_policy: "fixed" iter_size: 0', "iter_size"),
    ],
)
def test_bad_solver_params(text: str, field: str) -> None:
    params = small_params()
    with pytest.raises(ValueError, match=field) as info:
        solvers.caffe_solver(solver(text), ones(params), ones(params))
    assert "\n" not in str(info.value)


def test_state_from_history_checks_blobs() -> None:
    sp = solver('type: "AdaDelta" base_lr: 1 lr_policy: "fixed" momentum: 0.95 delta: 1e-6')
    params = small_params()
    order = [("a", 0), ("a", 1), ("b", 0)]
    good = [np.zeros((2, 2), F), np.zeros(2, F), np.zeros(3, F)] * 2
    with pytest.raises(ValueError, match="has 3 history blobs, AdaDelta needs 6"):
        solvers.state_from_history(sp, params, good[:3], order, 5, 0)
    bad = list(good)
    bad[4] = np.zeros(4, F)
    with pytest.raises(ValueError, match=r"history blob 4 \('a' param 1\).*\(4,\).*\(2,\)"):
        solvers.state_from_history(sp, params, bad, order, 5, 0)
    with pytest.raises(ValueError, match="missing"):
        solvers.state_from_history(sp, params, good[:4], order[:2], 5, 0)
    legacy = list(good)
    legacy[5] = np.arange(3, dtype=F).reshape(1, 1, 1, 3)  # Caffe's legacy 4-D blob shape
    state = solvers.state_from_history(sp, params, legacy, order, 5, 0)
    np.testing.assert_array_equal(solvers.history_blobs(state, order)[5], np.arange(3, dtype=F))


def test_current_lr_reports_the_next_updates_rate() -> None:
    case = load_case("sgd_multistep")
    blobs = [case.arrays[f"snapshot_history__{j}"] for j in range(len(case.order))]
    params = case.params_at("param", SNAPSHOT_ITER - 1)
    state = solvers.state_from_history(case.sp, params, blobs, case.order, 5, 1)
    # Iteration 5 reaches stepvalue 5: the lazy multistep advances to step 2 for this update.
    assert solvers.current_lr(case.sp, state) == case.arrays["lr"][SNAPSHOT_ITER]
