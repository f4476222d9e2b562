"""`caffe2jax time --model M [--iterations N]`: forward and backward timings, like `caffe time`.

Caffe times each layer separately; here the whole net is one XLA program, so the timings are
for the compiled forward, the compiled backward (forward + gradients) and one train-style
iteration, after a warm-up that compiles them.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from caffe2jax import logs


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("time", help="time a net's forward and backward passes")
    p.add_argument("--model", required=True, help="net prototxt")
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--phase", default="TRAIN", choices=["TRAIN", "TEST"])
    p.add_argument(
        "--input-shape", action="append", default=[], metavar="BLOB=D0,D1,...",
        help="shape of an input blob whose data source is not at hand (repeatable)",
    )  # fmt: skip
    p.set_defaults(func=run)


def _timed(fn, iterations: int) -> float:
    jax.block_until_ready(fn())  # compile and warm up
    start = time.perf_counter()
    for _ in range(iterations):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / iterations * 1e3


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from caffe2jax.api import Model
    from caffe2jax.commands.summary import parse_shapes, source_shapes
    from caffe2jax.frontend.pipeline import load_net

    log = logs.setup(None)
    net = load_net(args.model, args.phase)
    shapes, _ = source_shapes(net, Path(args.model).parent)
    shapes.update(parse_shapes(args.input_shape))
    model = Model(net, shapes)
    params, state = model.init(0)
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(s).astype(np.float32) for n, s in model.inputs.items()}
    for name in inputs:  # labels must be valid class indices for loss layers
        if name.startswith("label"):
            inputs[name] = np.zeros_like(inputs[name])
    key = jax.random.key(0)
    forward = jax.jit(lambda p, s, x: model.apply(p, s, x, key)[0])
    backward = jax.jit(jax.grad(lambda p, s, x: model.loss(p, s, x, key)[0]))
    log.info(f"Performing Forward on {jax.devices()[0]}")
    fwd = _timed(lambda: forward(params, state, inputs), args.iterations)
    log.info("Performing Backward")
    bwd = _timed(lambda: backward(params, state, inputs), args.iterations)
    log.info(f"Average Forward pass: {fwd:.4g} ms.")
    log.info(f"Average Forward-Backward: {bwd:.4g} ms.")
    log.info(f"Total Time: {(fwd + bwd) * args.iterations:.4g} ms.")
    return 0
