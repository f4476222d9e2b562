"""How many data workers (runtime/data/workers.py): the cores the process may use, from its
affinity and its cgroup's CPU quota; the environment and the CLI's setting."""

from __future__ import annotations

import psutil
import pytest

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data import workers
from caffe2jax.runtime.data.feeding import Feeder


def affinity(monkeypatch, cores) -> None:
    """The CPUs psutil says this process may run on."""
    monkeypatch.setattr(psutil.Process, "cpu_affinity", lambda self, cpus=None: sorted(cores))


@pytest.fixture
def cgroup(tmp_path, monkeypatch):
    """A fake /sys/fs/cgroup and /proc/self/cgroup; returns a writer of cpu.max."""
    (tmp_path / "proc").write_text("0::/job\n")
    (tmp_path / "job").mkdir()
    real = workers._cgroup_quota
    monkeypatch.setattr(workers, "_cgroup_quota",
                        lambda: real(tmp_path, tmp_path / "proc"))  # fmt: skip
    return lambda text: (tmp_path / "job" / "cpu.max").write_text(text)


def test_workers_default_to_the_affinity(monkeypatch, cgroup):
    monkeypatch.delenv("CAFFE2JAX_DATA_WORKERS", raising=False)
    affinity(monkeypatch, {0, 2, 5})
    cgroup("max 100000\n")
    assert workers.available_cores() == 3
    assert workers.default_workers() == 3


def test_a_cgroup_quota_caps_the_affinity(monkeypatch, cgroup):
    affinity(monkeypatch, set(range(8)))
    cgroup("150000 100000\n")  # 1.5 CPUs: 2 workers
    assert workers.available_cores() == 2
    cgroup("50000 100000\n")
    assert workers.available_cores() == 1


def test_cgroup_v1_quota(tmp_path, monkeypatch):
    (tmp_path / "proc").write_text("4:cpu,cpuacct:/docker/abc\n")
    folder = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("300000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    assert workers._cgroup_quota(tmp_path, tmp_path / "proc") == 3.0
    (folder / "cpu.cfs_quota_us").write_text("-1\n")
    assert workers._cgroup_quota(tmp_path, tmp_path / "proc") is None


def test_environment_and_setting(monkeypatch):
    monkeypatch.setenv("CAFFE2JAX_DATA_WORKERS", "5")
    assert workers.default_workers() == 5
    workers.set_default_workers(0)
    try:
        assert workers.default_workers() == 0
    finally:
        workers.set_default_workers(None)
    monkeypatch.setenv("CAFFE2JAX_DATA_WORKERS", "many")
    with pytest.raises(DataError, match="CAFFE2JAX_DATA_WORKERS='many' is not a number"):
        workers.default_workers()
    with pytest.raises(DataError, match="must be >= 0"):
        workers.set_default_workers(-1)


def test_the_feeder_uses_the_default(monkeypatch):
    from caffe2jax.frontend.pipeline import load_net

    monkeypatch.setenv("CAFFE2JAX_DATA_WORKERS", "3")
    net = load_net('name: "n" layer { name: "x" type: "Input" top: "x" '
                   "input_param { shape { dim: 1 } } }", "TRAIN")  # fmt: skip
    assert Feeder(net).workers == 3
    assert Feeder(net, workers=1).workers == 1
