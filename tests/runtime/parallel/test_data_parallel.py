"""Data-parallel training on several devices (Caffe's ``-gpu``), on forced CPU devices.

JAX fixes its device count when it initialises, so every multi-device case runs in a
subprocess started with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.runtime.parallel.devices_worker import LMDB, TEST_LMDB, solver_file

ROOT = Path(__file__).resolve().parents[3]
DIGITS = ROOT / "examples" / "digits"
TOL = 1e-5


def env_with(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"  # the forced devices are CPU devices, also on a GPU machine
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    return env


def cli(*args: object, devices: int = 4, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "caffe2jax", *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env_with(devices),
    )  # fmt: skip


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hdf5_params(path: Path) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path, "r") as f:
        f["data"].visititems(
            lambda name, item: out.__setitem__(name, item[()])
            if isinstance(item, h5py.Dataset) else None
        )  # fmt: skip
    return out


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


@pytest.fixture(scope="module")
def parity() -> dict:
    assert LMDB.exists() and TEST_LMDB.exists()
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("devices_worker.py"))],
        capture_output=True, text=True, env=env_with(4), cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_four_devices_of_16_equal_one_of_64(parity):
    assert parity["devices"] == 4
    assert parity["sgd"] <= TOL
    assert parity["adam"] <= TOL
    assert parity["iter_size"] <= TOL


def test_batchnorm_statistics_are_per_device(parity):
    """Caffe's solvers each normalise their own batch: 4 × 16 with BatchNorm equals one
    device running the same 16-row batches (iter_size 4), not one batch of 64; the
    statistics kept are device 0's."""
    assert parity["bn_vs_iter_size4"] <= TOL
    assert parity["bn_vs_batch64"] > 1e-3
    assert parity["bn_state_device0"] <= TOL


def test_test_net_on_mesh_scores_as_one_device(parity):
    assert parity["test_net"] <= 1e-6
    assert 0.0 <= parity["test_acc"] <= 1.0


def test_snapshot_from_four_devices_continues_on_one(parity):
    assert parity["restored_iter"] == 10
    assert parity["snapshot_restore"] <= TOL


def test_pycaffe_view_shows_device_zero(parity):
    assert parity["view_rows"] == [16, 1, 8, 8]
    assert parity["view_device0"] == 0.0
    assert np.isfinite(parity["view_loss"])
    assert (parity["solver_count"], parity["solver_rank"]) == (4, 0)


def test_refusals_name_what_is_supported(parity):
    assert "Input blobs (x, y) cannot be split over devices" in parity["input_error"]
    assert "no CPU device 9" in parity["ids_error"]


def lenet_solver(folder: Path, batch: int) -> Path:
    """The digits example with ``batch`` rows per forward, 10 iterations, a test at the end
    and an HDF5 snapshot."""
    net = (DIGITS / "lenet_train_test.prototxt").read_text()
    net = net.replace("batch_size: 64", f"batch_size: {batch}")
    net = net.replace('"digits_train_lmdb"', f'"{DIGITS / "digits_train_lmdb"}"')
    net = net.replace('"digits_test_lmdb"', f'"{DIGITS / "digits_test_lmdb"}"')
    assert f"batch_size: {batch}" in net and str(DIGITS) in net
    (folder / f"net{batch}.prototxt").write_text(net)
    solver = (DIGITS / "lenet_solver.prototxt").read_text()
    solver = solver.replace('"lenet_train_test.prototxt"', f'"net{batch}.prototxt"')
    solver = solver.replace('"lenet_digits"', f'"{folder}/b{batch}"')
    solver = solver.replace("test_interval: 500", "test_interval: 10")
    solver += "snapshot_format: HDF5\n"
    path = folder / f"solver{batch}.prototxt"
    path.write_text(solver)
    return path


def test_cli_digits_four_devices_equal_one(tmp_path):
    four = cli("train", "--solver", lenet_solver(tmp_path, 16), "--gpu", "all", "--iterations",
               10, "--progress", "log", "--log", tmp_path / "four.log", cwd=tmp_path)  # fmt: skip
    code, _, err = finish(four)
    assert code == 0, err[-2000:]
    one = cli("train", "--solver", lenet_solver(tmp_path, 64), "--iterations", 10,
              "--progress", "log", "--log", tmp_path / "one.log", cwd=tmp_path)  # fmt: skip
    code, _, err = finish(one)
    assert code == 0, err[-2000:]
    a = hdf5_params(tmp_path / "b16_iter_10.caffemodel.h5")
    b = hdf5_params(tmp_path / "b64_iter_10.caffemodel.h5")
    assert max_diff(a, b) <= TOL

    def accuracy(log: Path) -> float:
        line = [x for x in log.read_text().splitlines() if "Test net output #0" in x][-1]
        return float(line.rsplit("= ", 1)[1])

    assert abs(accuracy(tmp_path / "four.log") - accuracy(tmp_path / "one.log")) <= 1e-6


def test_two_processes_match_one(tmp_path):
    """2 processes × 2 CPU devices joined on 127.0.0.1 (gloo) train as 1 device × 64."""
    solver = solver_file(tmp_path, 16, "SGD", snapshot=10)
    reference = solver_file(tmp_path, 64, "SGD", snapshot=10)
    reference.write_text(reference.read_text().replace(f"{tmp_path}/snap", f"{tmp_path}/ref"))
    for path in (solver, reference):
        path.write_text(path.read_text() + "snapshot_format: HDF5\n")
    port = free_port()
    start = time.monotonic()
    procs = [
        cli("train", "--solver", solver, "--iterations", 10, "--progress", "log",
            "--log", tmp_path / f"p{i}.log", "--coordinator", f"127.0.0.1:{port}",
            "--num-processes", 2, "--process-id", i, "--timeout", 60, devices=2, cwd=tmp_path)
        for i in range(2)
    ]  # fmt: skip
    one = cli("train", "--solver", reference, "--iterations", 10, "--progress", "log",
              "--log", tmp_path / "ref.log", devices=1, cwd=tmp_path)  # fmt: skip
    results = [finish(p, timeout=300) for p in [*procs, one]]
    for code, _, err in results:
        assert code == 0, err[-2000:]
    assert time.monotonic() - start < 300
    assert (tmp_path / "p0.log").exists() and not (tmp_path / "p1.log").exists()
    multi = hdf5_params(tmp_path / "snap_iter_10.caffemodel.h5")
    single = hdf5_params(tmp_path / "ref_iter_10.caffemodel.h5")
    assert max_diff(multi, single) <= TOL


def one_line_error(proc: subprocess.Popen, timeout: float = 120) -> str:
    code, _, err = finish(proc, timeout)
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert code == 1, err[-2000:]
    assert "Traceback" not in err
    return lines[-1]


def test_bad_device_ids(tmp_path):
    solver = solver_file(tmp_path, 16, "SGD")
    line = one_line_error(cli("train", "--solver", solver, "--gpu", "0,7", devices=2))
    assert "no CPU device 7" in line and "sees 2" in line
    line = one_line_error(cli("train", "--solver", solver, "--gpu", "1,1", devices=2))
    assert "distinct" in line


def test_coordinator_that_does_not_answer(tmp_path):
    solver = solver_file(tmp_path, 16, "SGD")
    start = time.monotonic()
    line = one_line_error(
        cli("train", "--solver", solver, "--coordinator", f"127.0.0.1:{free_port()}",
            "--num-processes", 2, "--process-id", 1, "--timeout", 3, devices=1)
    )  # fmt: skip
    assert "did not gather all 2 processes within 3 s" in line
    assert time.monotonic() - start < 60
    line = one_line_error(cli("train", "--solver", solver, "--num-processes", 2, devices=1))
    assert "--coordinator HOST:PORT" in line


def test_annotated_data_on_two_devices_equals_iter_size_two(tmp_path):
    """AnnotatedData sizes each batch's label to its bucket of rows (issue 37); a mesh needs
    one shape for every device's batch, so there the labels are padded back to the declared
    worst batch: 2 devices × batch 2 train and test as one device with iter_size 2 (whose two
    passes share the larger bucket). Tolerance TOL as above (pmean against a sum of passes)."""
    worker = "tests.runtime.train.annotated_buckets"
    proc = subprocess.run([sys.executable, "-m", worker, str(tmp_path)], capture_output=True,
                          text=True, env=env_with(2), cwd=ROOT, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["params"] <= TOL and result["test"] <= TOL * max(1.0, result["loss"])
