"""pycaffe's memory semantics: what scripts read from ``solver.net``, ``test_nets`` and held
arrays is what Caffe holds (BVLC's 01-learning-lenet loop, stale views, split blobs)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

import caffe2jax
from caffe2jax.runtime.train.loop import SolverLoop
from tests.runtime.train.test_solver_loop import close, load_npz, make_solver

jax.config.update("jax_default_matmul_precision", "highest")

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits"

FAN_OUT = """
name: "fan"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
layer { name: "a" type: "InnerProduct" bottom: "ip" top: "a"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "b" type: "InnerProduct" bottom: "ip" top: "b"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "sum" }
layer { name: "acc" type: "Accuracy" bottom: "sum" bottom: "label" top: "acc" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "sum" bottom: "label" top: "loss" }
"""


@pytest.fixture
def digits(tmp_path):
    work = tmp_path / "digits"
    shutil.copytree(DIGITS, work)
    old = os.getcwd()
    os.chdir(work)
    yield work
    os.chdir(old)


def _cli_losses(solver_path: Path, iters: int) -> dict[int, float]:
    """The losses the CLI's loop logs with display: 1 (Caffe's ``Iteration N …, loss = X``)."""
    records = []

    class Grab(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("test-cli-losses")
    logger.handlers[:] = [Grab()]
    logger.setLevel(logging.INFO)
    loop = SolverLoop(str(solver_path), logger=logger)
    loop.param.display, loop.param.test_interval = 1, 0
    loop.step(iters)
    loop.close()
    out = {}
    for line in records:
        if "), loss = " in line:
            out[int(line.split()[1])] = float(line.rsplit("= ", 1)[1])
    return out


def test_learning_lenet_notebook_loop(digits):
    """BVLC's 01-learning-lenet loop on the shipped digits, unchanged but for the import."""
    caffe = caffe2jax
    solver = caffe.get_solver(str(digits / "lenet_solver.prototxt"))
    assert type(solver).__name__ == "SGDSolver"
    niter = 500
    train_loss = np.zeros(niter)
    for it in range(niter):
        solver.step(1)
        train_loss[it] = solver.net.blobs["loss"].data
        if it == 0:
            conv1_diff = solver.net.params["conv1"][0].diff.copy()
    logged = _cli_losses(digits / "lenet_solver.prototxt", 30)
    for it in range(30):  # the CLI prints 6 significant digits
        assert f"{train_loss[it]:.6g}" == f"{logged[it]:.6g}", it
    assert train_loss[-1] < train_loss[0] / 3
    assert np.abs(conv1_diff).max() > 0
    out = solver.test_nets[0].forward()  # no solver.test(): the test net shares the weights
    assert out["accuracy"] >= 0.95, out
    solver.close()


def test_param_diff_is_the_update_caffe_applied(tmp_path):
    """After step, param diffs hold ApplyUpdate's value: SGD with momentum keeps
    V = μV + lr·(g + λw) in the diff, so w_before − w_after = diff (golden raw gradients)."""
    solver, trace, _ = make_solver("sgd_momentum_l2", tmp_path)
    p = solver.param
    history = {k: 0.0 for k in trace if k.startswith("rawgrad__")}
    before = {k: solver.net.params[k.split("__")[1]][int(k.split("__")[2])].data.copy()
              for k in history}  # fmt: skip
    for i in range(3):
        solver.step(1)
        for key in history:
            _, layer, j = key.split("__")
            w = before[key] if i == 0 else trace["param__" + key[9:]][i - 1]
            spec = solver.net.model.net.layer(layer).spec(int(j))
            grad = trace[key][i] + p.weight_decay * spec.decay_mult * w
            history[key] = p.momentum * history[key] + trace["lr"][i] * spec.lr_mult * grad
            diff = solver.net.params[layer][int(j)].diff
            err = np.linalg.norm(diff - history[key]) / np.linalg.norm(history[key])
            assert err <= 1e-5, (key, i, err)


def test_held_views_follow_every_operation(tmp_path):
    net = caffe2jax.Net(FAN_OUT, caffe2jax.TRAIN, seed=3)
    w = net.params["ip"][0].data
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    net.blobs["data"].data[...] = x
    net.blobs["label"].data[...] = [0, 1, 1, 0]
    out = net.blobs["sum"].data  # held before any forward
    net.forward()
    expect = np.maximum(x @ w.T + net.params["ip"][1].data, 0)
    np.testing.assert_allclose(net.blobs["ip"].data, expect, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out, net.blobs["a"].data + net.blobs["b"].data, rtol=1e-6)
    held_diff = net.blobs["ip"].diff
    grad_w = net.params["ip"][0].diff
    net.backward()
    assert np.abs(held_diff).max() > 0 and np.abs(grad_w).max() > 0
    first = grad_w.copy()
    net.backward()  # Caffe adds into param diffs
    np.testing.assert_allclose(grad_w, 2 * first, rtol=1e-6)
    net.clear_param_diffs()
    assert not grad_w.any()
    w[...] = 0  # writes through a held array are honoured
    net.forward()
    np.testing.assert_allclose(net.blobs["ip"].data, 0 * expect + np.maximum(
        net.params["ip"][1].data, 0), atol=1e-7)  # fmt: skip
    path = tmp_path / "w.caffemodel"
    other = caffe2jax.Net(FAN_OUT, caffe2jax.TRAIN, seed=4)
    other.save(str(path))
    net.copy_from(str(path))
    np.testing.assert_array_equal(w, other.params["ip"][0].data)
    loss = net.blobs["loss"].data
    net.blobs["data"].reshape(8, 3)  # reshape of another blob: held views stay live
    net.blobs["label"].reshape(8)
    net.forward(data=np.ones((8, 3), np.float32), label=np.zeros(8, np.float32))
    assert net.blobs["sum"].shape == (8, 2)
    assert loss is net.blobs["loss"].data and w is net.params["ip"][0].data
    np.testing.assert_allclose(loss, net.forward()["loss"], rtol=1e-6)


def test_solver_views_after_step_restore_and_writes(tmp_path):
    solver, trace, _ = make_solver("sgd_fixed", tmp_path)
    w = solver.net.params["ip1"][0].data
    loss = solver.net.blobs["loss"].data
    solver.step(1)
    np.testing.assert_allclose(w, trace["param__ip1__0"][0], rtol=1e-5)
    np.testing.assert_allclose(loss, trace["loss"][0], rtol=1e-5)
    snap = solver.snapshot()
    solver.step(2)
    np.testing.assert_allclose(w, trace["param__ip1__0"][2], rtol=1e-5)
    solver.restore(str(snap[1]))
    np.testing.assert_allclose(w, trace["param__ip1__0"][0], rtol=1e-5)
    assert solver.iter == 1
    w[...] = 0  # what the script writes is what the next step starts from
    solver.net.params["ip2"][0].data[...] = 0
    solver.step(1)
    assert np.abs(w).max() < np.abs(trace["param__ip1__0"][1]).max() / 10
    solver.iter = 7
    assert solver.iter == 7


def test_blobs_and_layers_list_caffe_split_blobs_in_order():
    net = caffe2jax.Net(FAN_OUT, caffe2jax.TRAIN)
    # Caffe's Net::Init: a blob with several readers gets <blob>_<layer>_<i>_split_<j>.
    assert list(net.blobs) == [
        "data", "label", "label_data_1_split_0", "label_data_1_split_1",
        "ip", "ip_relu_0_split_0", "ip_relu_0_split_1", "a", "b", "sum",
        "sum_sum_0_split_0", "sum_sum_0_split_1", "acc", "loss",
    ]  # fmt: skip
    assert [(layer.name, layer.type) for layer in net.layers][:4] == [
        ("data", "Input"), ("label_data_1_split", "Split"), ("ip", "InnerProduct"),
        ("relu", "ReLU"),
    ]  # fmt: skip
    assert net.bottom_names["a"] == ["ip_relu_0_split_0"]
    assert net.blob_loss_weights["loss"] == 1.0 and net.blob_loss_weights["acc"] == 0.0
    net.blobs["data"].data[...] = np.random.default_rng(1).normal(size=(4, 3))
    net.forward()
    net.backward()
    split = [net.blobs[f"ip_relu_0_split_{j}"] for j in range(2)]
    np.testing.assert_array_equal(split[0].data, net.blobs["ip"].data)
    # the split bottom's diff is the sum of what its readers sent back (before the ReLU
    # mask, which Caffe applies in place into the same diff buffer)
    np.testing.assert_allclose(
        net.blobs["ip"].diff, (split[0].diff + split[1].diff) * (net.blobs["ip"].data > 0),
        rtol=1e-6, atol=1e-7)  # fmt: skip


def test_forward_and_backward_ranges():
    net = caffe2jax.Net(FAN_OUT, caffe2jax.TRAIN, seed=5)
    net.blobs["data"].data[...] = np.random.default_rng(2).normal(size=(4, 3))
    full = {k: v.copy() for k, v in net.forward().items()}
    out = net.forward(start="a", end="sum")
    assert list(out) == ["sum"]
    np.testing.assert_allclose(net.forward(start="sum")["loss"], full["loss"], rtol=1e-6)
    net.backward()
    whole = {n: net.blobs[n].diff.copy() for n in ("ip", "a", "sum_sum_0_split_1")}
    net.clear_param_diffs()
    net.blobs["ip"].diff[...] = 0
    diffs = net.backward(start="sum", end="a")  # layers a..sum, top diffs as stored
    assert list(diffs) == ["ip_relu_0_split_0"]
    np.testing.assert_allclose(net.blobs["a"].diff, whole["a"], rtol=1e-6)
    assert not net.blobs["ip"].diff.any()  # relu and ip did not run
    assert not net.params["ip"][0].diff.any() and net.params["a"][0].diff.any()


def test_test_net_sees_current_weights_and_share_with(tmp_path):
    solver, _, _ = make_solver("sgd_fixed", tmp_path)
    if not solver.test_nets:
        net = caffe2jax.Net(FAN_OUT, caffe2jax.TEST)
        train = caffe2jax.Net(FAN_OUT, caffe2jax.TRAIN, seed=9)
        net.share_with(train)
        assert net.params["ip"][0] is train.params["ip"][0]
        train.params["ip"][0].data[...] = 1.5
        assert (net.params["ip"][0].data == 1.5).all()


def test_apply_update_uses_the_scripts_diffs(tmp_path):
    solver, trace, _ = make_solver("sgd_fixed", tmp_path)
    net = solver.net
    net.forward()
    net.clear_param_diffs()
    net.backward()
    before = net.params["ip1"][0].data.copy()
    grad = net.params["ip1"][0].diff.copy()
    solver.apply_update()
    assert solver.iter == 1
    lr, wd = trace["lr"][0], solver.param.weight_decay
    np.testing.assert_allclose(net.params["ip1"][0].data, before - lr * (grad + wd * before),
                               rtol=1e-5, atol=1e-8)  # fmt: skip
    np.testing.assert_allclose(before, load_npz(tmp_path / "sgd_fixed" / "trace.npz")[0][
        "init__ip1__0"], rtol=1e-6)  # fmt: skip


def test_forward_backward_all_hdf5_round_trip_and_layer_reshape(tmp_path):
    net = caffe2jax.Net(FAN_OUT, caffe2jax.TRAIN, seed=11)
    x = np.random.default_rng(3).normal(size=(6, 3)).astype(np.float32)
    y = np.array([0, 1, 1, 0, 1, 0], np.float32)
    outs, diffs = net.forward_backward_all(blobs=["sum"], data=x, label=y)
    assert outs["sum"].shape == (6, 2) and diffs["data"].shape == (6, 3)
    net.forward(data=x[:4], label=y[:4])
    net.backward()
    np.testing.assert_allclose(diffs["data"][:4], net.blobs["data"].diff, rtol=1e-5, atol=1e-7)
    path = tmp_path / "w.caffemodel.h5"
    net.save_hdf5(str(path))
    other = caffe2jax.Net(FAN_OUT, caffe2jax.TRAIN, seed=12)
    other.load_hdf5(str(path))
    np.testing.assert_array_equal(other.params["a"][0].data, net.params["a"][0].data)
    other.blobs["data"].reshape(2, 3)
    other.blobs["label"].reshape(2)
    other.layer_dict["ip"].reshape()
    assert other.blobs["sum"].shape == (2, 2)


def test_callbacks_and_solve_with_resume_file(tmp_path):
    solver, trace, _ = make_solver("sgd_fixed", tmp_path)
    seen = []
    solver.add_callback(lambda: seen.append(("start", solver.iter)),
                        lambda: seen.append(("ready", solver.iter)))  # fmt: skip
    solver.step(2)
    assert seen == [("start", 0), ("ready", 1), ("start", 1), ("ready", 2)]
    state = solver.snapshot()[1].resolve()
    again, _, _ = make_solver("sgd_fixed", tmp_path / "again")
    again.param.max_iter = 4
    again.solve(str(state))
    assert again.iter == 4
    assert close(again.net.params["ip1"][0].data, trace["param__ip1__0"][3])


BN_SOLVER = """
base_lr: 0.1 lr_policy: "fixed" max_iter: 10 random_seed: 5
net_param {
  layer { name: "in" type: "Input" top: "x" top: "y"
          input_param { shape { dim: 8 dim: 3 } shape { dim: 8 dim: 2 } } }
  layer { name: "bn" type: "BatchNorm" bottom: "x" top: "h" }
  layer { name: "ip" type: "InnerProduct" bottom: "h" top: "p"
          inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.3 } } }
  layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
}
"""


def test_a_scripts_own_forward_moves_the_state_the_solver_trains_from():
    solver = caffe2jax.get_solver(BN_SOLVER)
    rng = np.random.default_rng(0)
    solver.net.blobs["x"].data[...] = rng.normal(size=(8, 3)) + 2
    solver.net.blobs["y"].data[...] = rng.normal(size=(8, 2))
    solver.step(1)
    before = solver.net.params["bn"][2].data.copy()  # the moving-average scale factor
    solver.net.forward()  # TRAIN-phase forward: Caffe's BatchNorm updates its statistics
    moved = solver.net.params["bn"][2].data.copy()
    assert moved[0] > before[0]
    solver.step(1)  # the step starts from the statistics the script's forward left
    assert solver.net.params["bn"][2].data[0] > moved[0]
    # the input blobs the script wrote fed every step
    np.testing.assert_allclose(solver.net.blobs["x"].data.mean(), 2, atol=0.5)
