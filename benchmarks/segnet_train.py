"""SegNet-basic (SegNet-Tutorial's segnet_basic_train.prototxt) training step: caffe2jax vs a
hand-written PyTorch equivalent, in one run.

    python benchmarks/segnet_train.py [--batch 4 --height 72 --width 96] [--without FIELD]

caffe2jax compiles the tutorial's train prototxt unchanged (11 classes, CamVid's class
weights; the DenseImageData tops fed as inputs) with its solver values (SGD, lr 0.1, momentum
0.9, weight decay 5e-4). The PyTorch peer is the same net written by hand, run eagerly on the
CPU: LRN (size 5, α 1e-4, β 0.75), four encoder blocks conv 7×7 (64) + BatchNorm (batch
statistics, eps 1e-9) + ReLU + 2×2 max pooling with indices (ceil mode), four decoder blocks
MaxUnpool2d + conv 7×7 + BatchNorm, the 1×1 classifier, class-weighted cross entropy with
ignore index 11 divided by the counted pixels (SegNet's normalisation), SGD with momentum and
weight decay. The default size 72×96 is CamVid's 360×480 / 5 (the net's ``pad_out_h`` needs
H/8 odd). Both draw the same random batch; the median of interleaved timed blocks is reported.
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SEGNET = ROOT.parent / "shared" / "forks" / "models" / "segnet_basic_train.prototxt"


def caffe2jax_step(batch: int, h: int, w: int, **policy_fields):
    """The jitted train step; ``policy_fields`` override the engine policy's defaults."""
    from caffe2jax.frontend import caffe_pb2
    from caffe2jax.lowering.engines.policy import EnginePolicy
    from caffe2jax.lowering.model import compile as compile_net
    from caffe2jax.runtime.train.step import Trainer

    shapes = {"data": (batch, 3, h, w), "label": (batch, 1, h, w)}
    policy = EnginePolicy.from_env(**policy_fields)
    model = compile_net(SEGNET, "TRAIN", input_shapes=shapes, policy=policy)
    solver = caffe_pb2.SolverParameter(
        base_lr=0.1, momentum=0.9, weight_decay=5e-4, lr_policy="fixed"
    )
    params, state = model.init(jax.random.key(0))
    trainer = Trainer(model, solver, params, state)
    carry = [params, state, trainer.init(params, state)]
    key = jax.random.key(1)

    def run(x, y, i):
        p, s, o, loss, _, _ = trainer.step(*carry, [{"data": x, "label": y}], key, i)
        carry[:] = [p, s, o]
        return loss

    return run


def class_weights() -> list[float]:
    return [float(v) for v in re.findall(r"class_weighting: ([\d.]+)", SEGNET.read_text())]


def torch_step(torch, weights: list[float]):
    nn = torch.nn

    def block(cin: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, 64, 7, padding=3), nn.BatchNorm2d(64, eps=1e-9))

    class SegNetBasic(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0)
            self.enc = nn.ModuleList([block(3)] + [block(64) for _ in range(3)])
            self.dec = nn.ModuleList([block(64) for _ in range(4)])
            self.pool = nn.MaxPool2d(2, 2, ceil_mode=True, return_indices=True)
            self.unpool = nn.MaxUnpool2d(2, 2)
            self.classifier = nn.Conv2d(64, len(weights), 1)

        def forward(self, x):
            x, saved = self.norm(x), []
            for enc in self.enc:
                x = torch.relu(enc(x))
                saved.append((x.shape[-2:], None))
                x, index = self.pool(x)
                saved[-1] = (saved[-1][0], index)
            for dec, (size, index) in zip(self.dec, reversed(saved)):
                x = dec(self.unpool(x, index, output_size=size))
            return self.classifier(x)

    net = SegNetBasic()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    w = torch.tensor(weights)

    def run(x, y, i):
        opt.zero_grad()
        scores = net(x)
        total = torch.nn.functional.cross_entropy(
            scores, y, weight=w, ignore_index=11, reduction="sum"
        )
        loss = total / (y != 11).sum()
        loss.backward()
        opt.step()
        return loss

    return run


def time_block(run, x, y, steps: int) -> float:
    start = time.perf_counter()
    loss = None
    for i in range(steps):
        loss = run(x, y, i)
    if hasattr(loss, "block_until_ready"):
        loss.block_until_ready()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--height", type=int, default=72)
    p.add_argument("--width", type=int, default=96)
    p.add_argument("--steps", type=int, default=5, help="steps per timed block")
    p.add_argument("--repeats", type=int, default=5, help="timed blocks per runner")
    p.add_argument("--without", action="append", default=[], metavar="FIELD",
                   help="also time caffe2jax with this EnginePolicy field off (A/B), e.g. "
                        "onednn_blocked_weight_grads")  # fmt: skip
    a = p.parse_args()
    import sys

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from harness import result_line

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (a.batch, 3, a.height, a.width)).astype(np.float32)
    y = rng.integers(0, 12, (a.batch, 1, a.height, a.width)).astype(np.float32)
    runners = {
        "caffe2jax (jit, XLA:CPU)": (caffe2jax_step(a.batch, a.height, a.width),
                                     (jnp.asarray(x), jnp.asarray(y))),
        "PyTorch eager (hand-written)": (torch_step(torch, class_weights()),
                                         (torch.from_numpy(x), torch.from_numpy(y[:, 0]).long())),
    }  # fmt: skip
    for field in a.without:
        step = caffe2jax_step(a.batch, a.height, a.width, **{field: False})
        runners[f"caffe2jax, {field} off"] = (step, (jnp.asarray(x), jnp.asarray(y)))
    times: dict[str, list[float]] = {name: [] for name in runners}
    for run, inputs in runners.values():  # compile and warm up
        time_block(run, *inputs, 2)
    for _ in range(a.repeats):  # interleaved, so load changes hit both alike
        for name, (run, inputs) in runners.items():
            times[name].append(time_block(run, *inputs, a.steps))
    ours = statistics.median(times["caffe2jax (jit, XLA:CPU)"])
    print(
        f"SegNet-basic train step, batch {a.batch} at {a.height}×{a.width}, "
        f"{platform.processor() or platform.machine()}, {jax.devices()[0].device_kind}, "
        f"jax {jax.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads\n"
    )
    print("| runner | ms/iter (median) | caffe2jax / runner |\n|---|---:|---:|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.1f} | {ours / median:.2f} |")
    peer_ms = statistics.median(times["PyTorch eager (hand-written)"])
    print(result_line(f"segnet-basic-train-b{a.batch}-{a.height}x{a.width}", ours, peer_ms))


if __name__ == "__main__":
    main()
