"""`caffe2jax time --model M [--iterations N]`: forward and backward timings, like `caffe time`.

Caffe times each layer separately; here the whole net is one XLA program, so the timings are
for the compiled forward, the compiled backward (forward + gradients) and one train-style
iteration, after a warm-up that compiles them.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from caffe2jax import logs
from caffe2jax.frontend.errors import CaffeError


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


def device_inputs(model, key: jax.Array) -> dict[str, jax.Array]:
    """Random inputs made on the device (no host copy); ``label*`` blobs are zeros, valid
    class indices for loss layers."""
    names = list(model.inputs)
    keys = jax.random.split(key, max(len(names), 1))

    def make(name: str, k: jax.Array) -> jax.Array:
        shape = model.inputs[name]
        if name.startswith("label"):
            return jnp.zeros(shape, model.dtype)
        return jax.random.normal(k, shape, model.dtype)

    return {n: jax.jit(make, static_argnums=0)(n, k) for n, k in zip(names, keys)}


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from caffe2jax.api import Model
    from caffe2jax.commands.summary import parse_shapes, source_shapes
    from caffe2jax.frontend.pipeline import load_net
    from caffe2jax.runtime.memory import check_net_fits

    if args.iterations <= 0:
        raise CaffeError(f"--iterations must be > 0, got {args.iterations}")
    log = logs.setup(None)
    net = load_net(args.model, args.phase)
    shapes, _ = source_shapes(net, Path(args.model).parent)
    shapes.update(parse_shapes(args.input_shape))
    model = Model(net, shapes)
    # forward activations, their gradients and the params' values and gradients
    check_net_fits(model.net, itemsize=8, params=model.graph.decls)
    params, state = model.init(0)
    inputs = device_inputs(model, jax.random.key(1))
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
