"""MobileNet-SSD's train net (../shared/forks/models/ssd_mobilenet_train.prototxt): caffe2jax's
compiled train step vs the same model in PyTorch eager, in one run.

The AnnotatedData layer is replaced by an Input of ``--batch`` images of ``--size``² and a
label blob of 2 boxes per image (classes 1–20, fixed G = 2·batch, padding rows −1). Both sides
run SGD (lr 1e-4, momentum 0.9, weight decay 5e-5) on the same batch every step.

The PyTorch peer is written here: the net's layers (Convolution with ``group``, BatchNorm in
training mode, Scale, ReLU, Permute, Flatten, Concat) as torch ops in the prototxt's order,
the same prior boxes (computed once: PriorBox does not depend on the data), and a MultiBoxLoss
in torch with the same rules (bipartite then per-prediction matching at 0.5, MAX_NEGATIVE
mining 3:1 under 0.5 overlap, CENTER_SIZE encoding with the priors' variances, SmoothL1 +
softmax cross-entropy over the number of matches), looping over images as torchvision's SSD
does. Timings on a shared machine are noisy: the median of ``--repeats`` blocks is printed.

    python benchmarks/ssd_train.py [--batch 4] [--size 300] [--steps 3] [--repeats 3]
                                   [--engines auto,auto:unfused,onednn-all:nchw]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np
from google.protobuf import text_format

from caffe2jax.frontend import caffe_pb2

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT.parent / "shared/forks/models/ssd_mobilenet_train.prototxt"
LR, MOMENTUM, DECAY = 1e-4, 0.9, 5e-5


def net_param(batch: int, size: int) -> caffe_pb2.NetParameter:
    """The train net with its AnnotatedData swapped for an Input (data, label)."""
    net = text_format.Parse(MODEL.read_text(), caffe_pb2.NetParameter())
    data = net.layer[0]
    assert data.type == "AnnotatedData", data.type
    data.Clear()
    data.name, data.type = "data", "Input"
    data.top.extend(["data", "label"])
    data.input_param.shape.add().dim.extend([batch, 3, size, size])
    data.input_param.shape.add().dim.extend([1, 1, 2 * batch, 8])
    return net


def batch_data(batch: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (batch, 3, size, size)).astype(np.float32)
    rows = []
    for i in range(batch):
        for k in range(2):
            x0, y0 = rng.uniform(0, 0.6, 2)
            w, h = rng.uniform(0.1, 0.4, 2)
            rows.append([i, int(rng.integers(1, 21)), k, x0, y0, x0 + w, y0 + h, 0])
    return x, np.asarray(rows, np.float32).reshape(1, 1, -1, 8)


def caffe2jax_runner(net, x, label, engines: str = "auto"):
    """One compiled train step per call (forward, backward, SGD update); ``engines``:
    ``<conv setting>[:nchw][:xla-grads][:unfused]`` (lowering/engines/policy.py; ``:nchw``
    turns the NHWC pass off, ``:xla-grads`` the oneDNN gradients of 1×1 matrix products,
    ``:unfused`` runs BatchNorm → Scale → ReLU chains as three layers)."""
    from caffe2jax.lowering.engines.policy import EnginePolicy
    from caffe2jax.lowering.model import compile as compile_net
    from caffe2jax.runtime.train.step import Trainer

    conv, *options = engines.split(":")
    policy = EnginePolicy(conv=conv, channels_last="nchw" not in options,
                          pointwise_onednn_grads="xla-grads" not in options,
                          fuse_batch_norm_chains="unfused" not in options)  # fmt: skip
    model = compile_net(net, "TRAIN", policy=policy)
    solver = caffe_pb2.SolverParameter(base_lr=LR, momentum=MOMENTUM, weight_decay=DECAY,
                                       lr_policy="fixed")  # fmt: skip
    params, state = model.init(jax.random.key(0))
    trainer = Trainer(model, solver, params, state)
    carry = [params, state, trainer.init(params, state)]
    key, feed = jax.random.key(1), {"data": jax.numpy.asarray(x), "label": label}
    priors = np.asarray(model.apply(params, state, feed, key)[0]["mbox_priorbox"])

    def run(i: int) -> float:
        p, s, o, loss, _, _ = trainer.step(*carry, [feed], key, i)
        carry[:] = [p, s, o]
        return float(loss)

    return run, priors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default="auto,auto:unfused",
                        help="caffe2jax engine policies to time, comma-separated")  # fmt: skip
    args = parser.parse_args()
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from harness import result_line
    from ssd_torch import torch_runner

    net = net_param(args.batch, args.size)
    x, label = batch_data(args.batch, args.size)
    runners = {}
    for engines in args.engines.split(","):
        runners[f"caffe2jax, engines {engines}"], priors = caffe2jax_runner(net, x, label, engines)
    runners["PyTorch eager (hand-written)"] = torch_runner(net, x, label, priors, LR, MOMENTUM,
                                                          DECAY)  # fmt: skip
    first = {name: run(0) for name, run in runners.items()}  # compile / warm up
    times: dict[str, list[float]] = {name: [] for name in runners}
    for r in range(args.repeats):  # interleaved blocks
        for name, run in runners.items():
            start = time.perf_counter()
            for i in range(args.steps):
                run(1 + r * args.steps + i)
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    peer_ms = statistics.median(times["PyTorch eager (hand-written)"])
    print(f"MobileNet-SSD train step, batch {args.batch} at {args.size}x{args.size}, "
          f"{platform.machine()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"jax {jax.__version__}; noisy: shared machine; first losses "
          + ", ".join(f"{v:.3f}" for v in first.values()))  # fmt: skip
    print("\n| implementation | ms/iter (median) | this / PyTorch |\n|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.0f} | {median / peer_ms:.2f} |")
    ours_ms = statistics.median(next(iter(times.values())))  # the first engine setting
    print(result_line(f"mobilenet-ssd-train-b{args.batch}-{args.size}", ours_ms, peer_ms))


if __name__ == "__main__":
    main()
