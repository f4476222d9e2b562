"""caffe2jax/logs.py: the terminal check reads the stderr of the moment, and a closed
stream (a test's captured stderr, a detached pipe) is not a terminal rather than an error."""

from __future__ import annotations

import io
import re
import sys

from caffe2jax import logs


def test_is_terminal_reads_the_current_stderr(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Tty())
    assert logs.is_terminal() is True
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert logs.is_terminal() is False


def test_a_closed_stream_is_not_a_terminal():
    stream = io.StringIO()
    stream.close()
    assert logs.is_terminal(stream) is False


def test_the_progress_bar_is_tqdm_with_rate_eta_and_lines_above():
    from tqdm import tqdm

    out = io.StringIO()
    bar = logs.ProgressBar(100, stream=out)
    assert isinstance(bar.bar, tqdm)
    bar.update(41)  # a run resumed at iteration 40: its clock starts here
    for done in range(42, 61):
        bar.status = f"loss {done}"
        bar.update(done)
    bar.write("Test net output #0: accuracy = 0.9")
    bar.update(100)
    bar.close()
    text = out.getvalue()
    frames = [f for f in text.split("\r") if "/100 [" in f]
    # tqdm's frame: n/total [elapsed<remaining, rate, status]
    assert re.search(r"60/100 \[\d\d:\d\d<\d\d:\d\d, +[\d.]+iter/s, loss 60\]", text), frames
    assert "100/100" in frames[-1]
    # the test line stands alone on its own line, above the bar redrawn after it
    lines = text.replace("\r", "\n").splitlines()
    assert "Test net output #0: accuracy = 0.9" in lines
    assert bar.bar.initial == 40 and bar.bar.n == 100


NET = """
layer { name: "d" type: "Data" top: "data" top: "label"
  data_param { source: "db" batch_size: 4 backend: LMDB } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""
SOLVER = """net: "net.prototxt" base_lr: 0.01 lr_policy: "fixed" max_iter: 20 display: 5
test_iter: 1 test_interval: 10 snapshot_prefix: "tiny" solver_mode: CPU
"""


def test_train_draws_the_bar_only_when_asked_or_on_a_terminal(tmp_path):
    """``--progress bar``: tqdm's bar with the test results above it; the default on a pipe
    (not a terminal): Caffe's log lines and no bar."""
    import numpy as np

    from caffe2jax.runtime.data.records.datum import array_to_datum
    from caffe2jax.runtime.data.records.db import Writer
    from tests.cli_runner import run_cli

    with Writer(tmp_path / "db") as writer:
        for i in range(8):
            item = np.full((1, 2, 2), i, np.uint8)
            writer.put(f"{i:08d}", array_to_datum(item, i % 3).SerializeToString())
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(SOLVER)
    bar = run_cli("train", "--solver", "solver.prototxt", "--progress", "bar", cwd=tmp_path)
    assert bar.returncode == 0, bar.stderr[-2000:]
    assert re.search(r"20/20 \[\d\d:\d\d<\d\d:\d\d", bar.stderr), bar.stderr[-2000:]
    lines = bar.stderr.replace("\r", "\n").splitlines()
    assert any(
        line.startswith("    Test net output #0: loss = ")
        or line.startswith("Test net output #0: loss = ")
        for line in lines
    ), lines
    assert not any("] Iteration 5 " in line for line in lines)  # those go to the log file
    log = run_cli(
        "train", "--solver", "solver.prototxt", "--log", "again.log", "--force", cwd=tmp_path
    )
    assert log.returncode == 0, log.stderr[-2000:]
    assert "] Iteration 5 " in log.stderr and not re.search(r"\d+/20 \[", log.stderr)
