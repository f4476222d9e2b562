"""pycaffe's views against the functional core they sit on (issue: live views must not slow
the step or the forward down).

* digits LeNet (batch 64): a pycaffe ``solver.step(1)`` loop against the CLI's loop
  (``SolverLoop.step(n)``) on the same solver, ms per iteration;
* CIFAR-10 full and GoogLeNet deploy at batch 1: pycaffe ``Net.forward()`` (outputs as
  numpy) against the
  jitted functional forward (``jax.jit(model.apply)``, outputs fetched to the host).

Median of timed blocks after warm-up, in one process; prints the ratio view / core.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
CIFAR = ROOT.parent / "shared/caffe/models/examples/cifar10/cifar10_full.prototxt"
GOOGLENET = ROOT.parent / "shared/caffe/models/models/bvlc_googlenet/deploy.prototxt"
BLOCKS = 7


def median_ms(fn, per_block: int) -> float:
    fn()  # warm-up (compiles)
    times = []
    for _ in range(BLOCKS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3 / per_block)
    return statistics.median(times)


def step_loops(iters: int = 200, read_loss: bool = False) -> tuple[float, float]:
    import logging

    import caffe2jax
    from caffe2jax.runtime.train.loop import SolverLoop

    os.chdir(DIGITS)
    quiet = logging.getLogger("bench-quiet")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    solver = caffe2jax.get_solver("lenet_solver.prototxt")
    solver.log.disabled = True
    solver.param.test_interval = solver.param.snapshot = solver.param.display = 0
    solver.param.max_iter = 10**9

    def pycaffe_loop():
        for _ in range(iters):
            solver.step(1)
            if read_loss:  # what the notebook reads each iteration
                float(solver.net.blobs["loss"].data)

    loop = SolverLoop("lenet_solver.prototxt", logger=quiet)
    loop.param.test_interval = loop.param.snapshot = loop.param.display = 0

    def cli_loop():
        loop.step(iters)
        float(loop.ts.params["conv1"][0][0, 0, 0, 0])  # wait for the device

    result = median_ms(pycaffe_loop, iters), median_ms(cli_loop, iters)
    solver.close()
    loop.close()
    return result


def forwards(prototxt: Path = CIFAR, shape=(1, 3, 32, 32), reps: int = 200) -> tuple[float, float]:
    import caffe2jax

    net = caffe2jax.Net(str(prototxt), caffe2jax.TEST)
    net.blobs["data"].reshape(*shape)
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    net.blobs["data"].data[...] = x
    model = caffe2jax.compile(str(prototxt), input_shapes={"data": shape})
    params, state = model.init(0)
    apply = jax.jit(model.apply)

    def view():
        for _ in range(reps):
            net.forward()["prob"]

    def core():
        for _ in range(reps):
            np.asarray(apply(params, state, {"data": x})[0]["prob"])

    return median_ms(view, reps), median_ms(core, reps)


def main() -> None:
    print(
        f"machine: {platform.machine()} {os.cpu_count()} cores, {platform.processor()}; "
        f"jax {jax.__version__} on {jax.default_backend()}; python {sys.version.split()[0]}"
    )
    print("| case | pycaffe view | functional core | ratio |")
    print("|---|---|---|---|")
    for read in (False, True):
        view, core = step_loops(read_loss=read)
        what = "step(1) + read loss" if read else "step(1)"
        print(
            f"| digits LeNet b64: {what} loop vs CLI loop | {view:.2f} ms/iter | "
            f"{core:.2f} ms/iter | {view / core:.3f} |"
        )
    view, core = forwards()
    print(
        f"| CIFAR-10 full deploy b1: Net.forward vs jitted apply | {view:.3f} ms | "
        f"{core:.3f} ms | {view / core:.3f} |"
    )
    view, core = forwards(GOOGLENET, (1, 3, 224, 224), reps=20)
    print(
        f"| GoogLeNet deploy b1: Net.forward vs jitted apply | {view:.2f} ms | "
        f"{core:.2f} ms | {view / core:.3f} |"
    )


if __name__ == "__main__":
    main()
