"""The RL trainer on several devices: the episode batch is split over them (lanes sharded,
the rule's gradient summed inside the one program) and the run equals one device's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOLVER = ROOT / "examples" / "rl" / "cartpole_sigmoid_solver.prototxt"

WORKER = """
import sys, numpy as np
from caffe2jax.runtime.rl import PolicyGradientTrainer
from caffe2jax.frontend.errors import CaffeError
one = PolicyGradientTrainer(sys.argv[1], env="cartpole-v1", seed=3)
two = PolicyGradientTrainer(sys.argv[1], env="cartpole-v1", seed=3, devices="all")
assert two.mesh is not None and two.mesh.size == 2
a, b = one.init(), two.init()
for _ in range(3):
    a, ma = one.train_batch(a)
    b, mb = two.train_batch(b)
    assert np.array_equal(np.asarray(ma.returns), np.asarray(mb.returns))
assert tuple(b.lanes.last.sharding.spec) == ("data",), b.lanes.last.sharding
for name, blobs in a.params.items():
    for x, y in zip(blobs, b.params[name]):
        if x is not None:
            x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
            assert np.linalg.norm(x - y) <= 1e-5 * np.linalg.norm(x), name
try:
    PolicyGradientTrainer(sys.argv[1], env="cartpole-v1", batch_size=9, devices="all")
except CaffeError as err:
    assert "cannot be split over 2 devices" in str(err), err
else:
    raise AssertionError("an odd batch was split over 2 devices")
print("OK")
"""


def test_episode_batch_split_over_two_devices_equals_one():
    # the forced devices are CPU devices, also on a GPU machine
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", WORKER, str(SOLVER)], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]
