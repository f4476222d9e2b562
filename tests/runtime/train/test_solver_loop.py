"""The Solver end to end against real Caffe's solver traces (golden/solvers).

Each trace: the net compiled from its prototxt, the Caffe-initialised weights loaded from
``<case>_init.caffemodel``, MemoryData fed the trace's arrays, and 10 jitted steps. Params after
every update and the lr sequence ≤ 1e-5 relative; the loss ≤ 1e-5 relative.
"""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import SolverError
from tests.golden import GOLDEN, load_npz, require

jax.config.update("jax_default_matmul_precision", "highest")

SOLVERS = GOLDEN / "solvers"
CASES = sorted(p.name for p in require(SOLVERS).iterdir() if p.is_dir())


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / scale) if scale else float(np.linalg.norm(a - b))


def close(ours, caffe) -> bool:
    """≤ 1e-5 relative, with a 3e-7 absolute floor: a conv bias feeding BatchNorm has an exact
    gradient of 0 (BN removes the mean), so both sides hold float32 cancellation noise there,
    where a relative error means nothing (~1e-8 per element on CPU; an H100's reduction order
    gave a difference of norm 1.3e-7 over 4 elements)."""
    diff = np.linalg.norm(np.asarray(ours, np.float64) - np.asarray(caffe, np.float64))
    return diff <= 1e-5 * np.linalg.norm(np.asarray(caffe, np.float64)) + 3e-7


def make_solver(case, tmp_path, rows_from: int = 0):
    """A solver for a golden case, run inside a copy of its folder (snapshots land there)."""
    work = tmp_path / case
    shutil.copytree(SOLVERS / case, work)
    os.chdir(work)
    trace, meta = load_npz(work / "trace.npz")
    solver = caffe2jax.get_solver(str(work / "solver.prototxt"))
    solver.copy_trained_layers(str(work / f"{case}_init.caffemodel"))
    shift = (rows_from * meta["batch_size"]) % meta["num_samples"]
    solver.set_input_arrays(
        np.roll(trace["data__X"], -shift, axis=0), np.roll(trace["data__y"], -shift, axis=0)
    )
    return solver, trace, meta


def params_of(solver, trace):
    return {k: solver.net.params[k.split("__")[1]][int(k.split("__")[2])].data
            for k in trace if k.startswith("param__")}  # fmt: skip


@pytest.fixture(autouse=True)
def _restore_cwd():
    cwd = os.getcwd()
    yield
    os.chdir(cwd)


@pytest.mark.parametrize("case", CASES)
def test_trace(case, tmp_path):
    solver, trace, meta = make_solver(case, tmp_path)
    iters = meta["iters"]
    for i in range(iters):
        lr = solver.lr
        assert lr == pytest.approx(float(trace["lr"][i]), rel=1e-7), f"lr of update {i}"
        solver.step(1)
        assert rel(solver.smoothed_loss, trace["loss"][i]) <= 1e-5, f"loss of step {i}"
        for key, ours in params_of(solver, trace).items():
            assert close(ours, trace[key][i]), f"{key} after update {i}: {rel(ours, trace[key][i])}"
    assert solver.iter == iters


@pytest.mark.parametrize("case", CASES)
def test_restore_caffes_snapshot_and_continue(case, tmp_path):
    """Caffe's own iteration-5 .solverstate (binary or HDF5) resumes the trace exactly."""
    _, meta = load_npz(SOLVERS / case / "trace.npz")
    at = meta["snapshot_at"]
    solver, trace, meta = make_solver(case, tmp_path, rows_from=at * meta["iter_size"])
    state = next(f for f in meta["snapshot"]["files"] if "solverstate" in f)
    solver.restore(state)
    assert solver.iter == at
    for i in range(at, meta["iters"]):
        solver.step(1)
        for key, ours in params_of(solver, trace).items():
            assert close(ours, trace[key][i]), f"{key} after update {i}: {rel(ours, trace[key][i])}"


def test_resume_from_our_snapshot_is_exact(tmp_path):
    """Train 10, or train 5 + snapshot + restore in a new solver + 5: identical params. The
    new solver is fed the same arrays from row 0: the snapshot's resume record puts MemoryData
    where it stood (a Caffe solverstate has none, see the golden restore test)."""
    first, trace, _ = make_solver("adam", tmp_path / "a")
    first.step(5)
    weights, state = (p.resolve() for p in first.snapshot())
    assert state.with_name(state.name + ".resume.json").exists()
    resumed, _, _ = make_solver("adam", tmp_path / "b")
    resumed.restore(state)
    assert resumed.iter == 5
    resumed.step(5)
    reference, _, _ = make_solver("adam", tmp_path / "c")
    reference.step(10)
    ours, theirs = params_of(resumed, trace), params_of(reference, trace)
    for key in theirs:
        np.testing.assert_array_equal(ours[key], theirs[key])


def test_snapshot_files_follow_caffes_names_and_layout(tmp_path):
    solver, _, meta = make_solver("adam", tmp_path)
    solver.step(3)
    weights, state = solver.snapshot()
    assert weights.name == "adam_iter_3.caffemodel" and state.name == "adam_iter_3.solverstate"
    from caffe2jax.runtime.formats.solverstate import read_solverstate

    saved = read_solverstate(state)
    assert saved.iter == 3 and saved.learned_net == "adam_iter_3.caffemodel"
    assert len(saved.history) == 8  # Adam: all first moments, then all second moments
    assert [h.shape for h in saved.history] == [
        tuple(s) for s in meta["snapshot"]["history_shapes"]
    ]


def test_thousand_steps_compile_once_and_keep_memory_flat(tmp_path):
    import resource

    solver, _, _ = make_solver("sgd_momentum_l2", tmp_path)
    solver.param.max_iter = 2000
    solver.step(100)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    solver.step(1000)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert solver._loop.trainer.traces == 1
    assert rss_after - rss_before < 20_000, "peak RSS grew by more than 20 MB over 1000 steps"


BAD = [
    ('type: "Momentum" net: "net.prototxt"', "unknown solver type 'Momentum'"),
    ('base_lr: 0.1 lr_policy: "fixed"', "exactly one train net"),
    ('net: "missing.prototxt" base_lr: 0.1 lr_policy: "fixed"', "not found"),
    ('net: "net.prototxt" base_lr: -0.1 lr_policy: "fixed"', "base_lr must be > 0"),
    ('net: "net.prototxt" base_lr: 0.1 lr_policy: "step"', "stepsize must be > 0"),
    ('net: "net.prototxt" base_lr: 0.1 lr_policy: "cosine"', "unknown learning rate policy"),
    ('net: "net.prototxt" base_lr: 0.1 lr_policy: "fixed" test_iter: 3', "test_interval"),
]


@pytest.mark.parametrize("text, message", BAD)
def test_bad_solver_files(tmp_path, text, message):
    shutil.copy(SOLVERS / "sgd_fixed" / "net.prototxt", tmp_path)
    path = tmp_path / "solver.prototxt"
    path.write_text(text)
    with pytest.raises(SolverError, match=message) as err:
        caffe2jax.get_solver(str(path))
    assert "\n" not in str(err.value)


def test_hdf5_snapshots_round_trip(tmp_path):
    solver, trace, _ = make_solver("sgd_momentum_l2", tmp_path)  # snapshot_format: HDF5
    solver.step(4)
    weights, state = (p.resolve() for p in solver.snapshot())
    assert weights.name.endswith(".caffemodel.h5") and state.name.endswith(".solverstate.h5")
    resumed, _, _ = make_solver("sgd_momentum_l2", tmp_path / "again")
    resumed.restore(state)
    solver.step(3)
    resumed.step(3)
    for key, value in params_of(solver, trace).items():
        np.testing.assert_array_equal(params_of(resumed, trace)[key], value)


INPUT_NET = """
layer { name: "data" type: "Input" top: "x" top: "y"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip"
        inner_product_param { num_output: 2 weight_filler { type: "constant" value: 0 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "y" top: "loss" }
"""


def test_pycaffe_style_feeding_through_net_blobs(tmp_path):
    """``solver.net.blobs['x'].data[...] = batch`` before ``step`` trains on that batch."""
    net = tmp_path / "net.prototxt"
    net.write_text(INPUT_NET)
    path = tmp_path / "solver.prototxt"
    path.write_text(f'net: "{net}" base_lr: 0.5 lr_policy: "fixed" display: 0 max_iter: 100')
    solver = caffe2jax.get_solver(str(path))
    solver.net.blobs["x"].data[...] = np.array([[1, 0, 0], [0, 1, 0], [1, 0, 0], [0, 1, 0]])
    solver.net.blobs["y"].data[...] = np.array([0, 1, 0, 1])
    solver.step(1)
    first = solver.smoothed_loss
    assert first == pytest.approx(np.log(2), rel=1e-6)  # zero weights: uniform softmax
    solver.step(50)
    assert solver.smoothed_loss < 0.1 * first
