"""CRNN's train net (../shared/forks/models/crnn_train.prototxt, yalecyu/crnn.caffe: 7
convolutions with BatchNorm + Scale, two LSTMs, fc1, CtcLoss): caffe2jax's compiled train step
vs a hand-written PyTorch eager twin (benchmarks/crnn_torch.py), in one run.

The net is read in place; its HDF5Data layers become an Input of ``--batch`` 32×128 gray text
lines and their (N, 6) labels (examples/crnn/make_textlines.py's synthetic digit lines, blank
10 as padding); the Reshape and ContinuationIndicator take that batch (they hard-code 523);
``--width`` < 1 scales the convolution and LSTM widths as make_textlines does. Both sides
start from the same weights (caffe2jax's ``init``, copied into torch) and run the fork's
solver (SGD lr 1e-3, momentum 0.9, weight decay 5e-4, clip_gradients 520) on the same batch
every step. Before timing, the first two steps' losses of both sides are compared (the first
is the forward at the shared weights, the second checks the gradient and the update: CtcLoss's
N-times-the-gradient diff, the LSTM gate order, the multipliers). Then alternating blocks of
``--steps`` steps, ``--repeats`` times; the medians and their ratio are printed, last the
``RESULT`` line. Timings on a shared machine are noisy.

    python benchmarks/crnn_train.py [--batch 32] [--width 1] [--steps 3] [--repeats 3] [--ab]

``--ab`` adds a third runner to the alternating blocks: caffe2jax with the engine policy's
``dw_patches_max_pixels=0`` (every weight diff by oneDNN's backward-weights primitive), the
A/B of the ``onednn-dwpatches`` form (lowering/engines/conv_forms.py).
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

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT.parent / "shared/forks/models/crnn_train.prototxt"
sys.path.insert(0, str(ROOT))


def net_param(batch: int, width: float):
    """The fork's train net, its HDF5Data layers replaced by one Input (data, label)."""
    from caffe2jax.frontend import caffe_pb2
    from caffe2jax.frontend.parse import read_net

    if not MODEL.exists():
        raise SystemExit(f"CRNN's train net is missing: {MODEL} (the fork model set)")
    net = read_net(MODEL)
    kept = [la for la in net.layer if la.type != "HDF5Data"]
    first = caffe_pb2.LayerParameter(name="data", type="Input", top=["data", "label"])
    first.input_param.shape.add().dim.extend([batch, 1, 32, 128])
    first.input_param.shape.add().dim.extend([batch, 6])
    del net.layer[:]
    net.layer.extend([first, *kept])
    for layer in net.layer:
        if layer.type == "ContinuationIndicator":
            layer.continuation_indicator_param.batch_size = batch
        elif layer.type == "Reshape":
            dims = layer.reshape_param.shape.dim
            dims[0], dims[1] = batch, max(4, round(dims[1] * width))
        elif layer.type in ("Convolution", "LSTM"):
            p = layer.convolution_param if layer.type == "Convolution" else layer.recurrent_param
            p.num_output = max(4, round(p.num_output * width))
    return net


def solver_param():
    from caffe2jax.frontend import caffe_pb2

    return caffe_pb2.SolverParameter(base_lr=1e-3, momentum=0.9, weight_decay=5e-4,
                                     clip_gradients=520, lr_policy="fixed")  # fmt: skip


def caffe2jax_runner(net, x, label, solver, policy=None):
    """One compiled train step per call (forward, backward, clip, SGD update); returns the
    runner and the initial params (to copy into the twin)."""
    from caffe2jax.lowering.model import compile as compile_net
    from caffe2jax.runtime.train.step import Trainer

    model = compile_net(net, "TRAIN", policy=policy)
    params, state = model.init(jax.random.key(0))
    initial = jax.tree.map(np.asarray, params)
    trainer = Trainer(model, solver, params, state)
    carry = [params, state, trainer.init(params, state)]
    key = jax.random.key(1)
    feed = {"data": jax.numpy.asarray(x), "label": jax.numpy.asarray(label)}

    def run(i: int) -> float:
        p, s, o, loss, _, _ = trainer.step(*carry, [feed], key, i)
        carry[:] = [p, s, o]
        return float(loss)

    return run, initial


def agreement(runners: dict) -> list[tuple[float, ...]]:
    """Each side's first two losses (forward at the shared weights; after one update)."""
    return [tuple(run(i) for i in range(2)) for run in runners.values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ab", action="store_true", help="also dw_patches_max_pixels=0")
    args = parser.parse_args()
    import torch

    from benchmarks.crnn_torch import torch_runner
    from benchmarks.harness import result_line
    from examples.crnn.make_textlines import make_set

    net, solver = net_param(args.batch, args.width), solver_param()
    x, label = make_set(args.batch, seed=0)
    ours, params = caffe2jax_runner(net, x, label, solver)
    peer = torch_runner(net, params, x, label, solver)
    runners = {"caffe2jax": ours, "PyTorch eager (hand-written)": peer}
    if args.ab:
        from caffe2jax.lowering.engines.policy import EnginePolicy

        off = EnginePolicy.from_env(dw_patches_max_pixels=0)
        runners["caffe2jax, dw_patches off"] = caffe2jax_runner(net, x, label, solver, off)[0]
    (a0, a1), (b0, b1), *more = agreement(runners)
    for c0, c1 in more:
        print(f"losses caffe2jax, dw_patches off: {c0:.6f}, {c1:.6f}")
    print(f"losses caffe2jax {a0:.6f}, {a1:.6f}; PyTorch {b0:.6f}, {b1:.6f}; relative "
          f"difference {abs(a0 - b0) / abs(b0):.1e} (forward), {abs(a1 - b1) / abs(b1):.1e} "
          "(after one update)")  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in runners}
    for r in range(args.repeats):  # alternating blocks
        for name, run in runners.items():
            start = time.perf_counter()
            for i in range(args.steps):
                run(2 + r * args.steps + i)
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    for name, values in times.items():
        print(f"blocks {name}: " + ", ".join(f"{v:.0f}" for v in values) + " ms")
    ours_ms, peer_ms = (statistics.median(v) for v in list(times.values())[:2])
    print(f"CRNN train step, batch {args.batch}, 32x128, width {args.width}, "
          f"{platform.machine()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"jax {jax.__version__}; noisy: shared machine")  # fmt: skip
    print("\n| implementation | ms/iter (median) | this / PyTorch |\n|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.1f} | "
              f"{statistics.median(values) / peer_ms:.2f} |")  # fmt: skip
    case = f"crnn-train-b{args.batch}" + (f"-w{args.width:g}" if args.width != 1 else "")
    print(result_line(case, ours_ms, peer_ms))


if __name__ == "__main__":
    main()
