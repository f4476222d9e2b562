"""`caffe2jax test --model M --weights W --iterations N`, like `caffe test`."""

from __future__ import annotations

import argparse

import numpy as np

from caffe2jax import logs
from caffe2jax.cli.args import Subparsers, add_dialect, int32


def add(sub: Subparsers) -> None:
    p = sub.add_parser("test", help="score a trained net over N batches")
    p.add_argument("--model", required=True, help="net prototxt")
    p.add_argument("--weights", required=True, help=".caffemodel or .caffemodel.h5")
    p.add_argument("--iterations", type=int32, default=50, help="number of batches (default 50)")
    p.add_argument("--phase", default="TEST", choices=["TRAIN", "TEST"])
    p.add_argument("--stage", action="append", default=[], help="a NetState stage (repeatable)")
    p.add_argument("--level", type=int32, default=0)
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"],
                   help="how layers compute (weights stay fp32)")  # fmt: skip
    add_dialect(p, "the fork numbering --weights was written with (default: from the prototxt)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from caffe2jax.pycaffe.net import Net

    log = logs.setup(None)
    net = Net(args.model, args.phase, level=args.level, stages=args.stage,
              weights=args.weights, dialect=args.dialect, precision=args.precision)  # fmt: skip
    try:
        score(net, args.iterations, log)
    finally:
        net.close()
    return 0


def score(net, iterations: int, log) -> dict[str, np.ndarray]:
    """Caffe's test(): per-batch output lines, the mean loss, then each output's mean."""
    log.info(f"Running for {iterations} iterations.")
    graph, names = net.model.graph, net.model.net.blob_names
    weights = {u: w for layer in net.model.net.layers
               for u, w in zip(layer.top_names, layer.loss_weights)}  # fmt: skip
    sums: dict[str, np.ndarray] = {}
    loss = 0.0
    for i in range(iterations):
        out = net.forward()
        loss += float(graph.objective({names[k]: v for k, v in out.items()}))
        for name, value in out.items():
            value = np.atleast_1d(np.asarray(value, np.float64)).ravel()
            sums[name] = sums.get(name, 0) + value
            for item in value:
                log.info(f"Batch {i}, {name} = {item:.6g}")
    log.info(f"Loss: {loss / max(iterations, 1):.6g}")
    means = {name: total / max(iterations, 1) for name, total in sums.items()}
    for name, mean in means.items():
        weight = weights.get(name, 0.0)
        for item in mean:
            extra = f" (* {weight:g} = {weight * item:.6g} loss)" if weight else ""
            log.info(f"{name} = {item:.6g}{extra}")
    return means
