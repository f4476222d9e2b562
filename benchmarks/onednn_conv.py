"""Does oneDNN's convolution, called from inside the jitted program, beat XLA:CPU's?

    pip install onednn-cpu-gomp && python benchmarks/onednn_conv.py [--blocks 7] [--steps|--sizes]

CIFAR-10 quick's three convolutions at batch 100 and LeNet's two at batch 64, channels-last
activations and Caffe (OIHW) weights as ``lowering/layout.py`` runs them: ``fwd`` (the top) and
``fwd+bwd`` (top plus weight diff, plus bottom diff except on the first layer, whose bottom is
data, as in a train step). XLA is ``lax.conv_general_dilated``; oneDNN is
``lowering/engines/onednn.py`` (legacy custom calls into libdnnl through ctypes). Both variants are
jitted in one process and timed in alternating blocks (median of the blocks after a warm-up), so
other load on the machine hits both alike. Results are checked equal first (≤ 1e-5 of each
array's largest magnitude). ``--steps``: benchmarks/cpu_table.py's LeNet and CIFAR-10 quick
train steps with the engine policy's ``conv="onednn-all"`` and ``conv="xla"``, alternating
likewise.

Measured on the 2-core AMD EPYC development machine (AVX-512; jax 0.10.2, onednn-cpu-gomp
2023.2.0 = oneDNN 3.2), quiet (load average ≈ 1.4), ms per call, median of 5 blocks:

| conv | fwd XLA / oneDNN | fwd+bwd XLA / oneDNN |
|---|---|---|
| quick conv1 3→32 k5 32×32 b100 | 23.35 / 4.83 (4.83×) | 24.00 / 7.93 (3.03×) |
| quick conv2 32→32 k5 16×16 b100 | 13.60 / 7.39 (1.84×) | 40.66 / 20.07 (2.03×) |
| quick conv3 32→64 k5 8×8 b100 | 6.93 / 3.13 (2.21×) | 20.83 / 9.09 (2.29×) |
| LeNet conv1 1→20 k5 28×28 b64 | 0.82 / 0.51 (1.60×) | 2.73 / 1.37 (2.00×) |
| LeNet conv2 20→50 k5 12×12 b64 | 3.40 / 1.95 (1.74×) | 13.21 / 5.92 (2.23×) |
| quick, three convs | 43.88 / 15.36 (2.86×) | 85.49 / 37.09 (2.30×) |

Largest difference from XLA: 8e-6 of the largest magnitude (quick conv1's weight diff, a sum
over 102,400 products). Whole train steps (``--steps``, median of 7): LeNet b64 19.65 → 11.77
ms (1.67×), CIFAR-10 quick b100 147.29 → 110.85 ms (1.33×). Under load from another job
(load average 2–3) the convolutions measured 1.5–1.6× and the steps 1.2–1.6×.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.lowering.engines import onednn

# name, batch, C, H(=W), num_output, kernel, pad, needs bottom diff
CONVS = [
    ("quick conv1 3→32 k5 32×32", 100, 3, 32, 32, 5, 2, False),
    ("quick conv2 32→32 k5 16×16", 100, 32, 16, 32, 5, 2, True),
    ("quick conv3 32→64 k5 8×8", 100, 32, 8, 64, 5, 2, True),
    ("lenet conv1 1→20 k5 28×28", 64, 1, 28, 20, 5, 0, False),
    ("lenet conv2 20→50 k5 12×12", 64, 20, 12, 50, 5, 0, True),
]


def variants(c, h, o, k, p, dgrad):
    def xla(x, w):
        return lax.conv_general_dilated(
            x,
            w,
            (1, 1),
            [(p, p)] * 2,
            dimension_numbers=("NHWC", "OIHW", "NHWC"),
            precision=lax.Precision.HIGHEST,
        )

    def dnnl(x, w):
        return onednn.convolution(x, w, (1, 1), (p, p), (1, 1), 1, channels_last=True)

    out = {}
    for name, conv in (("xla", xla), ("onednn", dnnl)):

        def loss(x, w, r, conv=conv):
            return jnp.vdot(conv(x, w), r)

        out[name, "fwd"] = jax.jit(conv)
        argnums = (0, 1) if dgrad else (1,)
        out[name, "fwd+bwd"] = jax.jit(jax.value_and_grad(loss, argnums=argnums))
    return out


def close(a, b) -> float:
    a, b = jax.tree.leaves(a), jax.tree.leaves(b)
    return max(float(np.max(np.abs(u - v)) / np.max(np.abs(u))) for u, v in zip(a, b))


def time_block(fn, args, calls) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(fn(*args))
    return (time.perf_counter() - t) / calls * 1e3


def steps(blocks: int) -> None:
    """Whole train steps (benchmarks/cpu_table.py's), oneDNN on vs off, alternating blocks."""
    import sys
    from pathlib import Path

    from caffe2jax.lowering.engines.policy import EnginePolicy

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import cpu_table

    cases = [
        ("LeNet b64 train step", cpu_table.LENET, (64, 1, 28, 28), 10),
        ("CIFAR-10 quick b100 train step", cpu_table.QUICK, (100, 3, 32, 32), 2),
    ]
    print("| case | XLA convs ms | oneDNN convs ms | off/on |")
    print("|---|---|---|---|")
    for title, prototxt, shape, calls in cases:
        runs = {}
        for v in ("onednn-all", "xla"):
            engines = EnginePolicy.from_env(conv=v)
            runs[v] = cpu_table.train_step(prototxt, shape, 0.001, 0.9, 4e-3, "fp32", engines)
            for _ in range(3):
                jax.block_until_ready(runs[v]())
        times = {"xla": [], "onednn-all": []}
        for _ in range(blocks):
            for v in times:
                times[v].append(time_block(runs[v], (), calls))
        tx, to = statistics.median(times["xla"]), statistics.median(times["onednn-all"])
        print(f"| {title} | {tx:.2f} | {to:.2f} | {tx / to:.2f}× |", flush=True)


# batch, C, H(=W), num_output, kernel, pad, needs bottom diff: the sizes behind the policy's
# onednn_min_macs (lowering/engines/policy.py)
SIZES = [
    (1, 3, 32, 32, 5, 2, False), (1, 32, 16, 32, 5, 2, True), (1, 32, 8, 64, 5, 2, True),
    (64, 1, 8, 20, 5, 2, False), (64, 20, 4, 50, 5, 2, True), (8, 3, 32, 32, 5, 2, False),
    (8, 32, 16, 32, 5, 2, True), (8, 32, 8, 64, 5, 2, True), (32, 32, 16, 32, 5, 2, True),
    (16, 1, 28, 20, 5, 0, False), (16, 20, 12, 50, 5, 0, True), (1, 192, 28, 64, 1, 0, True),
    (1, 96, 28, 128, 3, 1, True), (1, 16, 28, 32, 5, 2, True),
]  # fmt: skip


def sizes(blocks: int) -> None:
    """fwd+bwd of convolutions from 2M to 210M multiply-adds, XLA vs oneDNN (every conv)."""
    rng = np.random.default_rng(0)
    print("| N C H→O k | forward MACs | XLA fwd+bwd ms | oneDNN ms | XLA/oneDNN |")
    print("|---|---|---|---|---|")
    for n, c, h, o, k, p, dgrad in SIZES:
        x = jnp.asarray(rng.standard_normal((n, h, h, c), np.float32))
        w = jnp.asarray(rng.standard_normal((o, c, k, k), np.float32) * 0.1)
        fns = variants(c, h, o, k, p, dgrad)
        y = fns["xla", "fwd"](x, w)
        call = (x, w, jnp.asarray(rng.standard_normal(y.shape, np.float32)))
        calls = max(3, int(150 / max(time_block(fns["xla", "fwd+bwd"], call, 3), 0.01)))
        times = {"xla": [], "onednn": []}
        for _ in range(blocks):
            for v in times:
                times[v].append(time_block(fns[v, "fwd+bwd"], call, calls))
        tx, to = statistics.median(times["xla"]), statistics.median(times["onednn"])
        macs = n * o * y.shape[1] * y.shape[2] * c * k * k
        print(f"| {n} {c} {h}→{o} k{k} | {macs / 1e6:.1f}M | {tx:.3f} | {to:.3f} | "
              f"{tx / to:.2f}× |", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--ms-per-block", type=float, default=300.0)
    ap.add_argument("--steps", action="store_true", help="whole train steps instead")
    ap.add_argument("--sizes", action="store_true", help="the size sweep behind the size rule")
    args = ap.parse_args()
    if args.sizes:
        sizes(args.blocks)
        return
    if args.steps:
        print(f"load average at start: {open('/proc/loadavg').read().split()[:3]}")
        steps(args.blocks)
        print(f"load average at end: {open('/proc/loadavg').read().split()[:3]}")
        return
    rng = np.random.default_rng(0)
    print(f"load average at start: {open('/proc/loadavg').read().split()[:3]}")
    print("| conv | pass | XLA ms | oneDNN ms | XLA/oneDNN | max rel diff |")
    print("|---|---|---|---|---|---|")
    totals = {}
    for name, n, c, h, o, k, p, dgrad in CONVS:
        x = jnp.asarray(rng.standard_normal((n, h, h, c), np.float32))
        w = jnp.asarray(rng.standard_normal((o, c, k, k), np.float32) * 0.1)
        fns = variants(c, h, o, k, p, dgrad)
        y = fns["xla", "fwd"](x, w)
        r = jnp.asarray(rng.standard_normal(y.shape, np.float32))
        for pas in ("fwd", "fwd+bwd"):
            call = (x, w) if pas == "fwd" else (x, w, r)
            a, b = fns["xla", pas](*call), fns["onednn", pas](*call)
            diff = close(a, b)
            per = time_block(fns["xla", pas], call, 3)
            calls = max(2, int(args.ms_per_block / max(per, 0.01)))
            times = {"xla": [], "onednn": []}
            for _ in range(args.blocks):  # alternate: load hits both alike
                for v in ("xla", "onednn"):
                    times[v].append(time_block(fns[v, pas], call, calls))
            tx, to = statistics.median(times["xla"]), statistics.median(times["onednn"])
            totals.setdefault((name.split()[0], pas), [0.0, 0.0])
            totals[name.split()[0], pas][0] += tx
            totals[name.split()[0], pas][1] += to
            print(
                f"| {name} | {pas} | {tx:.3f} | {to:.3f} | {tx / to:.2f}× | {diff:.1e} |",
                flush=True,
            )
    for (net, pas), (tx, to) in totals.items():
        print(f"| {net} (sum) | {pas} | {tx:.3f} | {to:.3f} | {tx / to:.2f}× | |")
    print(f"load average at end: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
