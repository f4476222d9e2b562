"""The memory check compares with the process's own limits (runtime/host/memory.py):
RLIMIT_AS (``ulimit -v``), the cgroup's memory limit (v2 ``memory.max``, v1
``memory.limit_in_bytes``), not only MemAvailable; a net or a batch needing more is refused
before anything is allocated, with the figure and the limit in one line.

No cgroup can be made in this sandbox (the session's own cgroup belongs to its machinery), so
the cgroup limit is simulated through ``$CAFFE2JAX_CGROUP_DIR``: a folder holding the two files
a real cgroup folder holds, read by the same code as /sys/fs/cgroup is."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from caffe2jax.frontend.errors import DataError, NetError
from caffe2jax.runtime.host import memory

GIB = 1 << 30
# a net of 2 blobs x 256 x 64 x 128 x 128 x 4 bytes = 2 GiB (4 GiB with their diffs)
BIG_NET = """name: "big"
layer { name: "in" type: "Input" top: "data"
        input_param { shape { dim: 256 dim: 64 dim: 128 dim: 128 } } }
layer { name: "relu" type: "ReLU" bottom: "data" top: "relu" }
"""


def _cgroup(folder: Path, limit: str, used: int, v1: bool = False) -> Path:
    folder.mkdir()
    v1_names = ("memory.limit_in_bytes", "memory.usage_in_bytes")
    names = v1_names if v1 else ("memory.max", "memory.current")
    (folder / names[0]).write_text(limit + "\n")
    (folder / names[1]).write_text(f"{used}\n")
    return folder


def test_cgroup_v2_limit_binds(tmp_path, monkeypatch):
    monkeypatch.setenv(memory.CGROUP_ENV, str(_cgroup(tmp_path / "g", str(2 * GIB), GIB // 2)))
    budget = memory.memory_budget()
    left = int(1.5 * GIB)
    assert budget.bytes == left - memory.HEADROOM - left // 10
    assert budget.limit.startswith("cgroup memory.max 2 GiB, 512 MiB in use (")


def test_cgroup_v1_limit_binds_and_unlimited_does_not(tmp_path, monkeypatch):
    monkeypatch.setenv(memory.CGROUP_ENV, str(_cgroup(tmp_path / "v1", str(GIB), 0, v1=True)))
    assert memory.memory_budget().limit.startswith("cgroup memory.limit_in_bytes 1 GiB")
    monkeypatch.setenv(memory.CGROUP_ENV, str(_cgroup(tmp_path / "free", "max", 0)))
    assert not memory.memory_budget().limit.startswith("cgroup")
    monkeypatch.setenv(memory.CGROUP_ENV, str(_cgroup(tmp_path / "big", "9223372036854771712", 0,
                                                      v1=True)))  # fmt: skip
    assert not memory.memory_budget().limit.startswith("cgroup")


def test_the_process_cgroups_are_found_from_proc():
    # whatever the machine: the folders listed exist and are cgroup folders
    for folder in memory._cgroup_folders():
        assert folder.is_dir()
        assert str(folder).startswith("/sys/fs/cgroup")


def test_address_space_limit_binds_in_a_limited_process():
    script = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (4000000 * 1024,) * 2)\n"
        "from caffe2jax.runtime.host import memory\n"
        "print(memory.memory_budget())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    assert "RLIMIT_AS (ulimit -v) 3.81 GiB" in out


def test_check_net_fits_names_the_figure_and_the_limit():
    model_net = _compiled(BIG_NET)
    budget = memory.Budget(GIB, "cgroup memory.max 1.5 GiB, 512 MiB in use (/x)")
    with pytest.raises(NetError) as err:
        memory.check_net_fits(model_net, itemsize=8, available=budget)
    text = str(err.value)
    assert "its blobs need 4 GiB, more than the 1 GiB available under cgroup memory.max" in text
    assert "(largest: 'data' [256, 64, 128, 128])" in text


def test_check_batches_fit_refuses_before_a_reader_allocates():
    budget = memory.Budget(GIB, "RLIMIT_AS (ulimit -v) 2 GiB, 1 GiB in use")
    with pytest.raises(DataError, match=r"layer 'd': top 'data' \[2147483647, 3, 8, 8\] holds"):
        memory.check_batches_fit("d", ["data"], [(2**31 - 1, 3, 8, 8)], 6, budget)
    with pytest.raises(DataError, match=r"6 batches of \[100000, 3, 32, 32\] need 6.87 GiB, more "
                       r"than the 1 GiB available under RLIMIT_AS"):  # fmt: skip
        memory.check_batches_fit("d", ["data"], [(100000, 3, 32, 32)], 6, budget)
    assert memory.check_batches_fit("d", ["data"], [(10, 3, 32, 32)], 6, budget) == 737280


def _compiled(text: str):
    import caffe2jax

    return caffe2jax.compile(text).net


def _limited(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``caffe2jax ARGS`` under ``ulimit -v 4000000`` (as the shell sets it), or in a
    simulated cgroup when ``env`` names one."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4000000 * 1024,) * 2)

    return subprocess.run([sys.executable, "-m", "caffe2jax", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300, preexec_fn=None if env else limit,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})})  # fmt: skip


def test_time_under_ulimit_v_refuses_a_net_needing_more(tmp_path):
    (tmp_path / "big.prototxt").write_text(BIG_NET)
    proc = _limited("--no-compile-cache", "time", "--model", "big.prototxt", "--iterations", "1",
                    cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr
    assert line.startswith("caffe2jax time: error: net 'big': its blobs need 4 GiB, more than the")
    assert "available under RLIMIT_AS (ulimit -v) 3.81 GiB" in line


def test_train_under_a_cgroup_limit_refuses_a_net_needing_more(tmp_path):
    (tmp_path / "big.prototxt").write_text(BIG_NET.replace('name: "big"', 'name: "big"\n'
                                           'force_backward: true'))  # fmt: skip
    solver = 'net: "big.prototxt"\nbase_lr: 0.1\nmax_iter: 1\nlr_policy: "fixed"\n'
    (tmp_path / "solver.prototxt").write_text(solver + 'snapshot_prefix: "s"\n')
    group = _cgroup(tmp_path / "group", str(3 * GIB), GIB // 4)
    proc = _limited("--no-compile-cache", "train", "--solver", "solver.prototxt", cwd=tmp_path,
                    env={memory.CGROUP_ENV: str(group)})  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert "its blobs need 4 GiB, more than the" in line
    assert "available under cgroup memory.max 3 GiB, 256 MiB in use" in line


def test_memory_exhausted_past_the_checks_is_one_line(tmp_path):
    # a MemoryError inside a command (the checks' estimate too low) is reported, not a traceback
    script = (
        "import sys\n"
        "from caffe2jax.cli import main as m, summary\n"
        "def boom(args): raise MemoryError()\n"
        "summary.run = boom\n"
        "sys.exit(m.main(['summary', 'x']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.startswith("caffe2jax summary: error: out of memory (MemoryError);")
    assert "available (" in proc.stderr and "Traceback" not in proc.stderr
