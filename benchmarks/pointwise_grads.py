"""Which gradients a 1×1 matrix-product convolution should take on the CPU: XLA's own products
(``pointwise``) or oneDNN's backward primitives (``pointwise-dnn``), per layer shape.

    python benchmarks/pointwise_grads.py [--cases 4x19x19x512x512,...] [--blocks 7] [--calls 3]

Each case is ``NxHxWxCxO`` (a channels-last bottom, O outputs); both forms run as the train
step runs them, ``jax.jit(jax.value_and_grad)`` of a loss of the top with respect to bottom
and weights, in alternating blocks in one process; medians and the ratio are printed with the
load average. The defaults are MobileNet-SSD's 1×1 layers at batch 4, 300×300, that oneDNN's
size rule takes. Per layer XLA's products won at ≤ 1,444 rows, but a row threshold made the
MobileNet-SSD step slower (docs/performance.md, round 5), so the policy has none.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.lowering.engines import conv_forms

CASES = (
    "4x150x150x32x64,4x75x75x128x128,4x38x38x256x512,4x19x19x512x512,4x19x19x512x63,"
    "4x10x10x1024x1024,4x10x10x1024x256,4x10x10x1024x126,1x19x19x512x512,2x19x19x512x512"
)


def step(form: str):
    def loss(x, w):
        y = conv_forms.convolve(form, x, w, (1, 1), (0, 0), (1, 1), 1, True)
        return jnp.sum(y * y)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def measure(case: str, blocks: int, calls: int) -> dict[str, float]:
    n, h, w, c, o = map(int, case.split("x"))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((n, h, w, c), np.float32))
    wt = jnp.asarray(rng.standard_normal((o, c, 1, 1), np.float32))
    fns = {form: step(form) for form in ("pointwise", "pointwise-dnn")}
    for fn in fns.values():
        jax.block_until_ready(fn(x, wt))
    times: dict[str, list[float]] = {form: [] for form in fns}
    for _ in range(blocks):
        for form, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(fn(x, wt))
            times[form].append((time.perf_counter() - start) / calls * 1e3)
    return {form: statistics.median(v) for form, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=CASES)
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    print("| N×H×W×C→O | rows | pointwise ms | pointwise-dnn ms | dnn / pointwise | load |")
    print("|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        m = measure(case, args.blocks, args.calls)
        n, h, w, _, _ = map(int, case.split("x"))
        ratio = m["pointwise-dnn"] / m["pointwise"]
        print(f"| {case} | {n * h * w} | {m['pointwise']:.2f} | {m['pointwise-dnn']:.2f} "
              f"| {ratio:.2f} | {os.getloadavg()[0]:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
