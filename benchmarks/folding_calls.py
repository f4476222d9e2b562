"""Folded against unfolded forward, alternating call by call (docs/performance.md, "Folded
chains (round 5)"): wall time and the process's CPU time, whose medians move less than wall
time's on a loaded machine.

    python benchmarks/folding_calls.py googlenet|resnet50|yolov3 BATCH PAIRS

The nets and weights of benchmarks/onnx_runtime.py; "folded" is ``model.packed(params, state)``
(the policy's default), "unfolded" ``model.packed(params)`` (packed weights only).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import onnx_runtime as nets  # noqa: E402

from caffe2jax.cli.main import configure_jax  # noqa: E402


def main() -> None:
    import jax

    import caffe2jax

    configure_jax(compile_cache=False)
    net, batch, pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    folder = Path(tempfile.mkdtemp(prefix="caffe2jax-folding-"))
    paths = {"googlenet": lambda: nets.GOOGLENET, "yolov3": lambda: nets.YOLOV3,
             "resnet50": lambda: nets.resnet50(folder / "resnet50.prototxt", batch)}  # fmt: skip
    side, out = (416, "detection_out") if net == "yolov3" else (224, "prob")
    model = caffe2jax.compile(paths[net](), input_shapes={"data": (batch, 3, side, side)})
    params, state = jax.device_put(nets.weights(model))
    x = np.random.default_rng(0).uniform(0, 1, (batch, 3, side, side)).astype(np.float32)
    x = jax.device_put(x)
    forward = jax.jit(lambda p, s, v: model.apply(p, s, {"data": v})[0][out])
    trees = {"folded": model.packed(params, state), "unfolded": model.packed(params)}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for i in range(pairs + 1):
        for name in sorted(trees, reverse=bool(i % 2)):
            wall, cpu = time.perf_counter(), time.process_time()
            forward(trees[name], state, x).block_until_ready()
            if i:  # the first pair compiles and warms up
                times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    for k, what in enumerate(("wall", "cpu")):
        a, b = ([t[k] for t in times[name]] for name in ("folded", "unfolded"))
        paired = statistics.median(x / y for x, y in zip(a, b))
        mine, other = statistics.median(a), statistics.median(b)
        print(f"{net} b{batch} {what}: folded {mine * 1e3:.1f} ms, unfolded {other * 1e3:.1f} "
              f"ms, ratio {mine / other:.3f}, paired {paired:.3f}")  # fmt: skip
    print("load average", os.getloadavg())


if __name__ == "__main__":
    main()
