"""Issue 14 on the command line: nothing overwritten without --force, a train run never
clobbers an earlier one, size checks before compiling, Caffe's signal effects, short errors."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from caffe2jax.frontend.errors import MAX_MESSAGE
from caffe2jax.runtime.data.records.datum import array_to_datum
from caffe2jax.runtime.data.records.db import Writer
from tests.cli_runner import run_cli
from tests.golden import GOLDEN, ROOT, require

DIGITS = ROOT / "examples" / "digits"
LOG = (
    "I1122 10:00:00.000000  1 solver.cpp:218] Iteration 0 (0 iter/s, 0.1s/100 iters), "
    "loss = 2.3\n"
    "I1122 10:00:01.000000  1 solver.cpp:218] Iteration 100 (9 iter/s, 0.1s/100 iters), "
    "loss = 0.5\n"
)


def _error_line(proc) -> str:
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    # a message is at most MAX_MESSAGE characters, after the "caffe2jax <verb>: error: " prefix
    assert len(lines) == 1 and len(lines[0]) <= MAX_MESSAGE + 40, proc.stderr
    return lines[0]


def test_plot_needs_force_to_overwrite(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "train.log").write_text(LOG)
    out = tmp_path / "loss.png"
    out.write_bytes(b"mine")
    line = _error_line(run_cli("plot", tmp_path / "train.log", out))
    assert "already exists; pass --force" in line and out.read_bytes() == b"mine"
    assert run_cli("plot", tmp_path / "train.log", out, "--force").returncode == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_compute_image_mean_needs_force_to_overwrite(tmp_path):
    with Writer(tmp_path / "db") as writer:
        for i in range(3):
            writer.put(
                f"{i:08d}", array_to_datum(np.full((1, 2, 2), i, np.uint8)).SerializeToString()
            )
    out = tmp_path / "mean.binaryproto"
    out.write_bytes(b"mine")
    line = _error_line(run_cli("compute_image_mean", tmp_path / "db", out))
    assert "already exists; pass --force" in line and out.read_bytes() == b"mine"
    assert run_cli("compute_image_mean", tmp_path / "db", out, "--force").returncode == 0
    assert out.read_bytes() != b"mine"


def test_export_needs_force_to_overwrite(tmp_path):
    out = tmp_path / "net.jax"
    out.write_bytes(b"mine")
    formats = GOLDEN / "formats"
    args = ("export", "--model", require(formats / "format_net.prototxt"),
            "--weights", formats / "format_net.caffemodel", "--out", out)  # fmt: skip
    line = _error_line(run_cli(*args))
    assert "already exists; pass --force" in line and out.read_bytes() == b"mine"


def _digits_run(tmp_path):
    """The digits example's solver in ``tmp_path`` (its snapshots land there)."""
    for name in ("lenet_solver.prototxt", "lenet_train_test.prototxt"):
        shutil.copy(DIGITS / name, tmp_path / name)
    for name in ("digits_train_lmdb", "digits_test_lmdb"):
        (tmp_path / name).symlink_to(DIGITS / name)
    (tmp_path / "digits_mean.binaryproto").symlink_to(DIGITS / "digits_mean.binaryproto")
    return tmp_path / "lenet_solver.prototxt"


def test_train_refuses_to_overwrite_an_earlier_run(tmp_path):
    solver = _digits_run(tmp_path)
    earlier = tmp_path / "lenet_digits_iter_500.caffemodel"
    earlier.write_bytes(b"an earlier run")
    line = _error_line(run_cli("train", "--solver", solver, cwd=tmp_path))
    assert "snapshots of an earlier run exist" in line and "--snapshot" in line
    assert earlier.read_bytes() == b"an earlier run"
    earlier.unlink()
    (tmp_path / "lenet_solver.log").write_text("an earlier log")
    line = _error_line(run_cli("train", "--solver", solver, cwd=tmp_path))
    assert "lenet_solver.log exists" in line
    assert (tmp_path / "lenet_solver.log").read_text() == "an earlier log"


def test_absurd_batch_is_refused_before_compiling(tmp_path):
    solver = _digits_run(tmp_path)
    net = tmp_path / "lenet_train_test.prototxt"
    net.write_text(net.read_text().replace("batch_size: 64", "batch_size: 100000000"))
    start = time.monotonic()
    for args in (("time", "--model", net), ("train", "--solver", solver)):
        line = _error_line(run_cli(*args, cwd=tmp_path))
        # Caffe's Blob::Reshape refuses a count past INT_MAX (lowering/limits.py)
        assert "layer 'digits'" in line and "top 'data' [100000000, 1, 8, 8] holds 6.4e+09 " in line
        assert line.endswith("values, over Caffe's INT_MAX (2147483647); lower the dims"), line
    assert time.monotonic() - start < 60
    line = _error_line(run_cli("time", "--model", DIGITS / "lenet_train_test.prototxt",
                               "--iterations", "0"))  # fmt: skip
    assert "--iterations must be > 0" in line


def test_prototxt_errors_are_short_and_located(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_bytes(b'name: "x"\nlayer {\n  name: "a"\x01\n  type: "Input"\n}\n')
    line = _error_line(run_cli("summary", path))
    assert line.endswith(
        f"{path}:3:12: layer 'a' (type Input): Expected identifier or number, got \\x01 "
        "(at token '\\x01')"
    )
    path.write_text('layer { name: "a" type: "' + "x" * 60000 + '" bottom: 3 }\n')
    line = _error_line(run_cli("summary", path))
    # the type is unsupported: said first (the field error matters less), the type cut at 40
    assert re.search(r"net\.prototxt:1:\d+: layer 'a' \(type x{40}…\): unsupported type", line)


def test_solver_errors_name_the_solver_file(tmp_path):
    solver = _digits_run(tmp_path)
    solver.write_text(solver.read_text().replace('lr_policy: "inv"', 'lr_policy: "nope"'))
    line = _error_line(run_cli("train", "--solver", solver, cwd=tmp_path))
    assert f"{solver}: lr_policy: unknown learning rate policy 'nope'" in line


def _start_training(tmp_path, *extra, batch=None, until=100):
    solver = _digits_run(tmp_path)
    if batch is not None:
        net = tmp_path / "lenet_train_test.prototxt"
        net.write_text(net.read_text().replace("batch_size: 64", f"batch_size: {batch}"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "caffe2jax", "train", "--solver", str(solver),
         "--progress", "log", *extra],  # fmt: skip
        cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    for line in proc.stderr:  # wait until it is training
        if f"Iteration {until}," in line or f"Iteration {until} (" in line:
            return proc
    raise AssertionError(f"training never reached iteration {until} (exit {proc.wait()})")


def test_sigint_stops_between_iterations_and_snapshots(tmp_path):
    """Caffe's default -sigint_effect stop: the current iteration ends, the run snapshots
    (snapshot_after_train) and exits 0 well before max_iter (1500)."""
    proc = _start_training(tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "Traceback" not in err, err
    stopped = re.search(r"Stopped at iteration (\d+)", out)
    assert stopped and int(stopped.group(1)) < 1000, out
    iteration = int(stopped.group(1))
    assert (tmp_path / f"lenet_digits_iter_{iteration}.caffemodel").exists()
    assert (tmp_path / f"lenet_digits_iter_{iteration}.solverstate").exists()


def test_second_sigint_exits_at_once(tmp_path):
    # big batches: an iteration lasts long enough to interrupt it twice
    proc = _start_training(tmp_path, batch=4096, until=0)
    proc.send_signal(signal.SIGINT)
    for line in proc.stderr:  # the first one is acknowledged: the iteration is finishing
        if "Ctrl-C again" in line:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "interrupted again; exiting now" in err
