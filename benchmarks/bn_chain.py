"""What a BatchNorm → Scale → ReLU chain (channels-last, batch statistics) costs in a train
step as three layers under JAX's autodiff, against the fused step train steps run
(lowering/engines/chains.py: one ``jax.custom_vjp`` whose backward recomputes the normalised
top from the bottom instead of storing it).

    python benchmarks/bn_chain.py [--shapes 4x150x150x64,4x75x75x128,4x19x19x512] [--blocks 7]

Both run as the train step does, ``jax.jit(jax.value_and_grad)`` of a loss of the ReLU's top
with respect to the bottom, Scale's γ and β, in alternating blocks in one process; medians,
ratio, load, and the largest difference of loss and gradients relative to each array's
largest value are printed. The autodiff side is lowering/layers/normalization.py's
``_batch_norm`` formula on the (N·H·W, C) view, Caffe's ``(x − μ) / √(σ² + ε)``; the fused
side stores x, μ, σ² and the ReLU's top (the next layer's bottom, alive anyway) and takes
Caffe's BatchNorm backward, ``(dy − mean(dy) − ŷ·mean(dy·ŷ)) / √(σ² + ε)``.
The profile this answers: XLA:CPU writes x − μ, BatchNorm's top and the ReLU's top as three
full arrays in the forward (docs/performance.md, "round 5").
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.lowering.engines import chains

EPS = 1e-5


def layers(x, gamma, beta):
    """The three layers as lowered today (BatchNorm's batch statistics, Scale, ReLU)."""
    c = x.shape[-1]
    x2 = x.reshape(-1, c)
    mean = jnp.mean(x2, axis=0)
    var = jnp.mean(jnp.square(x2 - mean), axis=0)
    y = (x2 - mean) / jnp.sqrt(var + EPS)
    z = y * gamma + beta
    return jnp.where(z > 0, z, 0.0).reshape(x.shape)


def fused(x, gamma, beta):
    """The chain as the fused step runs it (lowering/engines/chains.py)."""
    c = x.shape[-1]
    x2 = x.reshape(-1, c)
    mean = jnp.mean(x2, axis=0)
    var = jnp.mean(jnp.square(x2 - mean), axis=0)
    return chains.normalize_scale_relu(x2, mean, var, EPS, gamma, beta).reshape(x.shape)


def loss(chain, x, gamma, beta, r):
    return jnp.sum(chain(x, gamma, beta) * r)


def measure(shape: tuple[int, ...], blocks: int, calls: int) -> tuple[dict, float]:
    rng = np.random.default_rng(0)
    c = shape[-1]
    x = jnp.asarray(rng.standard_normal(shape, np.float32) * 2 + 1)
    r = jnp.asarray(rng.standard_normal(shape, np.float32))
    gamma = jnp.asarray(rng.uniform(0.5, 1.5, c).astype(np.float32))
    beta = jnp.asarray(rng.standard_normal(c).astype(np.float32) * 0.1)
    args = (x, gamma, beta, r)
    fns = {name: jax.jit(jax.value_and_grad(functools.partial(loss, f), argnums=(0, 1, 2)))
           for name, f in (("three layers", layers), ("fused", fused))}  # fmt: skip
    outs = [jax.tree.leaves(fn(*args)) for fn in fns.values()]
    err = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a))) for a, b in zip(*outs))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(blocks):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(fn(*args))
            times[name].append((time.perf_counter() - start) / calls * 1e3)
    return {name: statistics.median(v) for name, v in times.items()}, err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4x150x150x64,4x75x75x128,4x19x19x512")
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    print("| N×H×W×C | three layers ms | fused ms | fused / three | max rel. diff | load |")
    print("|---|---|---|---|---|---|")
    for case in args.shapes.split(","):
        m, err = measure(tuple(map(int, case.split("x"))), args.blocks, args.calls)
        ratio = m["fused"] / m["three layers"]
        print(f"| {case} | {m['three layers']:.1f} | {m['fused']:.1f} | {ratio:.2f} | {err:.1e} "
              f"| {os.getloadavg()[0]:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
