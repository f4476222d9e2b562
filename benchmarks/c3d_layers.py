#!/usr/bin/env python
"""C3D's 3-D layers: caffe2jax's Convolution3D and Pooling3D (forward + backward, one jitted
program per layer, lowering/forks/c3d.py) vs PyTorch eager ``conv3d`` / ``max_pool3d``
(``ceil_mode``: C3D's rounding) on C3D's own layer shapes, side by side in one run.

    python benchmarks/c3d_layers.py [--batch 1] [--repeats 5]

Prints a markdown table of median milliseconds and the ratio caffe2jax / PyTorch. PyTorch's
MAX pooling backward routes a tie to one cell, C3D's (and caffe2jax's) to every tied cell: the
same work on these random inputs (no ties), different arithmetic on ties.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.lowering.model import compile as compile_net

# (name, bottom C, L, H, W, layer text) of C3D's conv1a/pool1/conv2a/pool2/conv3a/pool5
CASES = [
    ("conv1a", 3, 16, 112, 112, "conv", 64, (1, 1, 1)),
    ("pool1", 64, 16, 112, 112, "pool", (1, 2, 2), (1, 2, 2)),
    ("conv2a", 64, 16, 56, 56, "conv", 128, (1, 1, 1)),
    ("pool2", 128, 16, 56, 56, "pool", (2, 2, 2), (2, 2, 2)),
    ("conv3a", 128, 8, 28, 28, "conv", 256, (1, 1, 1)),
    ("pool5", 512, 2, 7, 7, "pool", (2, 2, 2), (2, 2, 2)),
]


def _text(kind, shape, a, b) -> str:
    dims = "".join(f"dim: {d} " for d in shape)
    if kind == "conv":
        param = (f'type: "Convolution3D" convolution3d_param {{ num_output: {a} kernel_size: 3 '
                 "kernel_depth: 3 pad: 1 temporal_pad: 1 weight_filler { type: 'gaussian' "
                 "std: 0.01 } }")  # fmt: skip
    else:
        param = (f'type: "Pooling3D" pooling3d_param {{ pool: MAX kernel_size: {a[1]} '
                 f"kernel_depth: {a[0]} stride: {b[1]} temporal_stride: {b[0]} }}")  # fmt: skip
    return ("force_backward: true\n"
            f'layer {{ name: "x" type: "Input" top: "x" input_param {{ shape {{ {dims}}} }} }}\n'
            f'layer {{ name: "layer" {param} bottom: "x" top: "y" }}\n')  # fmt: skip


def _ours(kind, shape, a, b):
    model = compile_net(_text(kind, shape, a, b))
    params, state = model.init(0)

    top = model.net.shapes[model.net.layers[1].tops[0]]
    rng = np.random.default_rng(0)
    r = jnp.asarray(rng.standard_normal(top), jnp.float32)  # a dense top diff (not all ones,
    # which XLA could simplify away)

    def loss(params, x, r):
        return jnp.sum(model.apply(params, state, {"x": x})[0]["y"] * r)

    step = jax.jit(jax.grad(loss, argnums=(0, 1)))
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    return lambda: jax.block_until_ready(step(params, x, r)), params, np.asarray(r)


def _torch(kind, shape, a, b, params, r):
    import torch
    import torch.nn.functional as F

    x = torch.randn(*shape, requires_grad=True)
    r = torch.tensor(r)
    if kind == "conv":
        w = torch.tensor(np.asarray(params["layer"][0]), requires_grad=True)
        bias = torch.tensor(np.asarray(params["layer"][1]).ravel(), requires_grad=True)

        def run():
            F.conv3d(x, w, bias, 1, 1).backward(r)
    else:

        def run():
            F.max_pool3d(x, a, b, ceil_mode=True).backward(r)

    return run


def _median_ms(fn, repeats: int) -> float:
    fn()  # compile / warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
    print(f"{platform.node()} · {platform.processor() or platform.machine()} · jax "
          f"{jax.__version__} · torch {torch.__version__ if torch else 'absent'}\n")  # fmt: skip
    print("| layer (C3D) | bottom | caffe2jax fwd+bwd ms | PyTorch eager ms | ratio |")
    print("|---|---|---|---|---|")
    for name, c, length, h, w, kind, a, b in CASES:
        shape = (args.batch, c, length, h, w)
        ours, params, r = _ours(kind, shape, a, b)
        mine = _median_ms(ours, args.repeats)
        peer = _median_ms(_torch(kind, shape, a, b, params, r), args.repeats) if torch else None
        ratio = f"{mine / peer:.2f}" if peer else "—"
        peer_text = f"{peer:.1f}" if peer else "—"
        print(f"| {name} | {'×'.join(map(str, shape))} | {mine:.1f} | {peer_text} | {ratio} |")


if __name__ == "__main__":
    main()
