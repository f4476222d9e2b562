"""Data-parallel training: steps/s and samples/s of LeNet's compiled train step against the
number of devices (Caffe's ``-gpu``), each device running batch 64.

Without GPUs it forces CPU devices (``--xla_force_host_platform_device_count``, set before
JAX starts): those devices share the machine's cores, so the table measures the overhead of
the sharded program and its gradient all-reduce, not a speed-up. With GPUs it uses them.

``--feed step`` times the compiled step alone on one batch placed beforehand; ``--feed
lmdb`` times whole solver iterations (``SolverLoop.step``) reading an LMDB of 28×28 Datums
through the Data layer: prefetch thread, read round, assembly and step together.

    python benchmarks/multi_device.py [--devices 1,2,4] [--steps 30] [--feed step|lmdb]
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
    parser.add_argument("--feed", choices=("step", "lmdb"), default="step")
    args = parser.parse_args()
    counts = [int(n) for n in args.devices.split(",")]
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={max(counts)}")
    import jax

    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores; jax {jax.__version__}, backend {jax.default_backend()}, "
          f"{jax.device_count()} devices; feed: {args.feed}")  # fmt: skip
    print("| devices | global batch | steps/s | samples/s | samples/s vs 1 device |")
    print("|---|---|---|---|---|")
    base = None
    for n in counts:
        timer = steps_per_second if args.feed == "step" else fed_steps_per_second
        rate = timer(n, args.steps)
        samples = rate * n * BATCH
        base = base or samples
        print(f"| {n} | {n * BATCH} | {rate:.1f} | {samples:.0f} | {samples / base:.2f}× |")


def steps_per_second(n: int, steps: int) -> float:
    """Median steps/s of the data-parallel LeNet step over ``n`` devices."""
    import jax
    import numpy as np

    from caffe2jax.frontend import caffe_pb2
    from caffe2jax.lowering.model import compile as compile_net
    from caffe2jax.runtime.parallel import data_parallel, devices
    from caffe2jax.runtime.train.step import Trainer

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


def fed_steps_per_second(n: int, steps: int) -> float:
    """Median iterations/s of the solver loop over ``n`` devices, fed by a Data layer."""
    import tempfile

    from caffe2jax.runtime.train.loop import SolverLoop

    with tempfile.TemporaryDirectory() as tmp:
        solver = fed_solver(Path(tmp))
        loop = SolverLoop(solver, devices=list(range(n)) if n > 1 else None)
        try:
            loop.step(2)  # compile
            times = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                loop.step(steps)
                jax_block(loop.ts.params)
                times.append((time.perf_counter() - start) / steps)
        finally:
            loop.close()
    return 1.0 / statistics.median(times)


def jax_block(tree: object) -> None:
    import jax

    jax.block_until_ready(tree)


def fed_solver(folder: Path) -> Path:
    """LeNet over an LMDB of 2048 random 28×28 Datums (batch 64 per device)."""
    import numpy as np

    from caffe2jax.runtime.data import Writer, array_to_datum

    rng = np.random.default_rng(0)
    with Writer(folder / "lmdb", "lmdb") as writer:
        for i in range(2048):
            item = rng.integers(0, 256, (1, 28, 28), dtype=np.uint8)
            writer.put(f"{i:08d}", array_to_datum(item, int(i % 10)).SerializeToString())
    net = LENET.read_text().replace('"examples/mnist/mnist_train_lmdb"', f'"{folder}/lmdb"')
    (folder / "net.prototxt").write_text(net)
    solver = folder / "solver.prototxt"
    solver.write_text(f'net: "{folder}/net.prototxt"\nbase_lr: 0.01\nmomentum: 0.9\n'
                      'weight_decay: 0.0005\nlr_policy: "fixed"\nmax_iter: 100000\n'
                      "random_seed: 1\n")  # fmt: skip
    return solver


if __name__ == "__main__":
    main()
