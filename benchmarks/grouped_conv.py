"""Grouped convolutions (ResNeXt's and DPN's 3×3s, group 32–64, a few channels a group):
XLA:CPU's own grouped convolution against oneDNN's (lowering/engines/onednn.py), the figures
behind the engine policy's grouped rule (lowering/engines/policy.py).

    python benchmarks/grouped_conv.py [--blocks 5] [--ms-per-block 300] [--cases a,b]

Each case is a 3×3, pad 1, stride 1 convolution with as many outputs as inputs (a ResNeXt /
DPN bottleneck's middle layer), channels-last activations and Caffe (OIHW) weights as
``lowering/layout.py`` runs them; ``fwd`` is the top, ``fwd+bwd`` the top plus the bottom and
weight diffs (a train step's; at batch 1 only unless ``--backward``). Both are jitted in one
process; each row gives the compile time of each (first call, trace included), then the
per-call times in alternating blocks (median of the blocks), and the largest difference between
the two relative to the largest magnitude. The load average is printed at the start and the
end: a shared machine's timings are noisy, the ratios of one run are what to compare.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from caffe2jax.lowering.engines import onednn

# batch, group, channels a group, H (= W): DPN-92's stages (96 → 768 channels, group 32:
# 3–24 channels a group), ResNeXt-50 32×4d's first two (4, 8 a group), group 64, tiny ones
CASES = {
    "dpn c2": (1, 32, 3, 56), "dpn c3": (1, 32, 6, 28), "rx 32x4 56": (1, 32, 4, 56),
    "rx 32x8 28": (1, 32, 8, 28), "g64 x4 28": (1, 64, 4, 28), "g64 x8 56": (1, 64, 8, 56),
    "dpn c2 b8": (8, 32, 3, 56), "dpn c3 b8": (8, 32, 6, 28), "rx 32x4 56 b8": (8, 32, 4, 56),
    "rx 32x8 28 b8": (8, 32, 8, 28), "g64 x4 28 b8": (8, 64, 4, 28),
    # small ones, where oneDNN's ~0.2 ms pass through Python weighs most
    "dpn c5": (1, 32, 24, 7), "g2 x8 8": (1, 2, 8, 8), "g4 x4 4": (1, 4, 4, 4),
}  # fmt: skip


def engines(group: int) -> dict:
    """name → (fwd, fwd+bwd) jitted functions of (x NHWC, w OIHW[, top diff])."""

    def xla(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), [(1, 1)] * 2, feature_group_count=group,
                                        dimension_numbers=("NHWC", "OIHW", "NHWC"),
                                        precision=lax.Precision.HIGHEST)  # fmt: skip

    def dnnl(x, w):
        return onednn.convolution(x, w, (1, 1), (1, 1), (1, 1), group, channels_last=True)

    out = {}
    for name, conv in (("xla", xla), ("onednn", dnnl)):

        def loss(x, w, r, conv=conv):
            return jnp.vdot(conv(x, w), r)

        out[name] = (jax.jit(conv), jax.jit(jax.value_and_grad(loss, argnums=(0, 1))))
    return out


def rel_diff(a, b) -> float:
    a, b = jax.tree.leaves(a), jax.tree.leaves(b)
    return max(float(np.max(np.abs(u - v)) / np.max(np.abs(u))) for u, v in zip(a, b))


def block(fn, args, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(fn(*args))
    return (time.perf_counter() - t) / calls * 1e3


def case(name: str, blocks: int, ms_per_block: float, backward: bool) -> None:
    n, g, cpg, h = CASES[name]
    c = g * cpg
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((n, h, h, c), np.float32))
    w = jnp.asarray(rng.standard_normal((c, cpg, 3, 3), np.float32) * 0.1)
    r = jnp.asarray(rng.standard_normal((n, h, h, c), np.float32))
    fns = engines(g)
    macs = n * h * h * c * cpg * 9
    for k, pas in enumerate(("fwd", "fwd+bwd")[: 2 if backward or n == 1 else 1]):
        args = (x, w) if k == 0 else (x, w, r)
        compile_s, results = {}, {}
        for v in ("xla", "onednn"):
            t = time.perf_counter()
            results[v] = jax.block_until_ready(fns[v][k](*args))
            compile_s[v] = time.perf_counter() - t
        per = block(fns["xla"][k], args, 1)
        calls = max(1, int(ms_per_block / max(per, 0.01)))
        times = {"xla": [], "onednn": []}
        for _ in range(blocks):  # alternating: load hits both alike
            for v in times:
                times[v].append(block(fns[v][k], args, calls))
        tx, to = statistics.median(times["xla"]), statistics.median(times["onednn"])
        print(f"| {name}: b{n} g{g}×{cpg} {h}² | {macs / 1e6:.1f}M | {pas} | "
              f"{compile_s['xla']:.2f} / {compile_s['onednn']:.2f} | {tx:.2f} | {to:.2f} | "
              f"{tx / to:.2f}× | {rel_diff(results['xla'], results['onednn']):.0e} |",
              flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--ms-per-block", type=float, default=300.0)
    ap.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    ap.add_argument("--backward", action="store_true", help="fwd+bwd at batch 8 too (XLA's "
                    "grouped backward takes seconds a call at batch 1 already)")  # fmt: skip
    args = ap.parse_args()
    if onednn.available() is not None:
        raise SystemExit(onednn.available())
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    print("| conv | fwd MACs | pass | compile s XLA / oneDNN | XLA ms | oneDNN ms | XLA/oneDNN "
          "| max rel diff |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name in args.cases.split(","):
        case(name, args.blocks, args.ms_per_block, args.backward)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
