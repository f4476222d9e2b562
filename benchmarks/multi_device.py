"""Data-parallel training: steps/s and samples/s of LeNet's compiled train step against the
number of devices (Caffe's ``-gpu``), each device running batch 64.

Without GPUs it forces CPU devices (``--xla_force_host_platform_device_count``, set before
JAX starts): those devices share the machine's cores, so the table measures the overhead of
the sharded program and its gradient all-reduce, not a speed-up. With GPUs it uses them.

    python benchmarks/multi_device.py [--devices 1,2,4] [--steps 30]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LENET = ROOT.parent / "shared/caffe/models/examples/mnist/lenet_train_test.prototxt"
BATCH, REPEATS = 64, 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="1,2,4")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    counts = [int(n) for n in args.devices.split(",")]
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={max(counts)}")
    import jax

    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores; jax {jax.__version__}, backend {jax.default_backend()}, "
          f"{jax.device_count()} devices")  # fmt: skip
    print("| devices | global batch | steps/s | samples/s | samples/s vs 1 device |")
    print("|---|---|---|---|---|")
    base = None
    for n in counts:
        rate = steps_per_second(n, args.steps)
        samples = rate * n * BATCH
        base = base or samples
        print(f"| {n} | {n * BATCH} | {rate:.1f} | {samples:.0f} | {samples / base:.2f}× |")


def steps_per_second(n: int, steps: int) -> float:
    """Median steps/s of the data-parallel LeNet step over ``n`` devices."""
    import jax
    import numpy as np

    from caffe2jax.api import compile as compile_net
    from caffe2jax.frontend import caffe_pb2
    from caffe2jax.runtime import data_parallel, devices
    from caffe2jax.runtime.training import Trainer

    model = compile_net(
        LENET, "TRAIN", input_shapes={"data": (BATCH, 1, 28, 28), "label": (BATCH,)}
    )
    solver = caffe_pb2.SolverParameter(base_lr=0.01, momentum=0.9, weight_decay=5e-4,
                                       lr_policy="fixed")  # fmt: skip
    params, state = model.init(jax.random.key(0))
    mesh = devices.make_mesh(list(range(n)))
    trainer = Trainer(model, solver, params, state, mesh)
    carry = [params, state, trainer.init(params, state)]
    rng = np.random.default_rng(0)
    slices = [
        {"data": rng.random((BATCH, 1, 28, 28), dtype=np.float32) * 255,
         "label": rng.integers(0, 10, BATCH).astype(np.float32)}
        for _ in range(n)
    ]  # fmt: skip
    batch = slices[0] if mesh is None else data_parallel.assemble(slices, mesh)
    key = jax.random.key(1)

    def run(i: int) -> jax.Array:
        p, s, o, loss, _, _ = trainer.step(*carry, [batch], key, i)
        carry[:] = [p, s, o]
        return loss

    run(0).block_until_ready()
    times = []
    for r in range(REPEATS):
        start = time.perf_counter()
        for i in range(steps):
            loss = run(1 + r * steps + i)
        loss.block_until_ready()
        times.append((time.perf_counter() - start) / steps)
    return 1.0 / statistics.median(times)


if __name__ == "__main__":
    main()
