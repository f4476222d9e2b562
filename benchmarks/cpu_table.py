"""The CPU table of issue 13: caffe2jax vs PyTorch eager (train steps) and OpenCV dnn (forwards).

    python benchmarks/cpu_table.py [--cases a,b] [--blocks 5] [--precision fp32]

Every row is timed in one run: caffe2jax and its peer in alternating blocks (median of the
blocks after a warm-up; compile time apart). Inputs are random; weights are the nets' own
fillers (written to a temporary .caffemodel for OpenCV). The CLI's JAX setup (XLA:CPU flags)
is applied first, so the figures are what `caffe2jax` users get; the compile cache is left
off so the compile column shows real compiles. Prints the markdown table and
writes ``benchmarks/results/cpu-<time>.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import peers  # noqa: E402
from harness import Row, machine, measure, write  # noqa: E402

from caffe2jax.cli.main import configure_jax  # noqa: E402

MODELS = Path(__file__).resolve().parents[2] / "shared/caffe/models"
LENET = MODELS / "examples/mnist/lenet_train_test.prototxt"
QUICK = MODELS / "examples/cifar10/cifar10_quick_train_test.prototxt"
FULL = MODELS / "examples/cifar10/cifar10_full.prototxt"
GOOGLENET = MODELS / "models/bvlc_googlenet/deploy.prototxt"
ALEXNET = MODELS / "models/bvlc_alexnet/deploy.prototxt"
TMP = Path(tempfile.mkdtemp(prefix="caffe2jax-bench-"))


def _rng_batch(shape, classes=10):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, shape).astype(np.float32)
    return x, rng.integers(0, classes, shape[0]).astype(np.float32)


def train_step(prototxt: Path, shape, lr, momentum, decay, precision, policy=None):
    """caffe2jax's compiled train step (runtime Trainer: forward, backward, Caffe SGD), with
    the engine ``policy`` (default: the environment's, lowering/engines/policy.py)."""
    import jax

    from caffe2jax.frontend import caffe_pb2
    from caffe2jax.lowering.model import compile as compile_net
    from caffe2jax.runtime.train.step import Trainer

    model = compile_net(prototxt, "TRAIN", input_shapes={"data": shape, "label": shape[:1]},
                        precision=precision, policy=policy)  # fmt: skip
    solver = caffe_pb2.SolverParameter(base_lr=lr, momentum=momentum, weight_decay=decay,
                                       lr_policy="fixed")  # fmt: skip
    params, state = model.init(jax.random.key(0))
    trainer = Trainer(model, solver, params, state)
    carry = [params, state, trainer.init(params, state)]
    x, y = (jax.device_put(a) for a in _rng_batch(shape))
    key = jax.random.key(1)

    def run():
        p, s, o, loss, _, _ = trainer.step(*carry, [{"data": x, "label": y}], key, 0)
        carry[:] = [p, s, o]
        return loss

    return run


def deploy(prototxt: Path, shape, precision, edit=None, policy=None):
    """A deploy net at batch ``shape[0]``: its jitted apply, and the prototxt/caffemodel pair
    OpenCV reads (same random weights); ``policy`` as in :func:`train_step`."""
    import jax

    from caffe2jax.lowering.model import compile as compile_net
    from caffe2jax.runtime.formats.weights import save_weights

    text = prototxt.read_text()
    if edit:
        text = edit(text)
    path = TMP / f"{prototxt.parent.name}-{shape[0]}.prototxt"
    path.write_text(text)
    model = compile_net(path, "TEST", input_shapes={"data": shape}, precision=precision,
                        policy=policy)  # fmt: skip
    params, state = model.init(0)
    weights = save_weights(path.with_suffix(".caffemodel"), model, params, state)
    x = _rng_batch(shape)[0]
    xd = jax.device_put(x)
    apply = jax.jit(lambda p, s, v: model.apply(p, s, {"data": v})[0][model.outputs[0]])
    return (lambda: apply(params, state, xd)), path, weights, x


def forward_row(name, prototxt, shape, precision, calls, blocks, edit=None, note=""):
    ours, path, weights, x = deploy(prototxt, shape, precision, edit)
    row = Row(name, "OpenCV dnn", note=note)
    return measure(row, ours, lambda: peers.opencv_forward(path, weights, x), calls, blocks)


def train_row(name, prototxt, build, shape, solver, precision, calls, blocks):
    ours = train_step(prototxt, shape, *solver, precision)
    x, y = _rng_batch(shape)
    row = Row(name, "PyTorch eager")
    return measure(row, ours, lambda: peers.torch_train_step(build, x, y, *solver), calls, blocks)


def pycaffe_row(precision, calls, blocks):
    """CIFAR-10 full b1 through pycaffe's ``Net.forward`` (host in, host out)."""
    from caffe2jax.pycaffe.net import Net

    _, path, weights, x = deploy(FULL, (1, 3, 32, 32), precision)
    net = Net(str(path), "TEST", weights=str(weights))

    def ours():
        return net.forward(data=x)

    row = Row("CIFAR-10 full forward b1, `Net.forward`", "OpenCV dnn")
    return measure(row, ours, lambda: peers.opencv_forward(path, weights, x), calls, blocks)


def _alexnet_fc64(text: str) -> str:
    return text.replace("num_output: 4096", "num_output: 64")


CASES = {
    "lenet": lambda p, b: train_row("LeNet b64 train step (SGD)", LENET, peers.torch_lenet,
                                    (64, 1, 28, 28), (0.01, 0.9, 5e-4), p, 20, b),
    "quick": lambda p, b: train_row("CIFAR-10 quick b100 train step", QUICK,
                                    peers.torch_cifar10_quick, (100, 3, 32, 32),
                                    (0.001, 0.9, 4e-3), p, 4, b),
    "googlenet1": lambda p, b: forward_row("GoogLeNet forward b1", GOOGLENET, (1, 3, 224, 224),
                                           p, 5, b),
    "googlenet8": lambda p, b: forward_row("GoogLeNet forward b8", GOOGLENET, (8, 3, 224, 224),
                                           p, 1, b),
    "alexnet": lambda p, b: forward_row("AlexNet (fc 64) forward b1", ALEXNET, (1, 3, 227, 227),
                                        p, 5, b, _alexnet_fc64, "fc6/fc7 num_output 64"),
    "cifar_full": lambda p, b: forward_row("CIFAR-10 full forward b1, jitted apply", FULL,
                                           (1, 3, 32, 32), p, 200, b),
    "cifar_full_net": lambda p, b: pycaffe_row(p, 100, b),
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset")
    parser.add_argument("--blocks", type=int, default=5, help="timed blocks per side (≥ 5)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    parser.add_argument("--ours-only", action="store_true", help="time caffe2jax alone")
    parser.add_argument("--out", type=Path, help="write OUT.json/OUT.md instead of results/")
    args = parser.parse_args(argv)
    harness.OURS_ONLY = args.ours_only
    configure_jax(compile_cache=False)  # the compile column shows real compiles
    rows = []
    for name in args.cases.split(","):
        row = CASES[name](args.precision, args.blocks)
        rows.append(row)
        print(f"  {row.case}: {row.ours_ms:.2f} ms vs {row.peer} {row.peer_ms:.2f} ms "
              f"({row.ratio:.2f}×)", flush=True)  # fmt: skip
    given = argv if argv is not None else sys.argv[1:]
    command = "python benchmarks/cpu_table.py " + " ".join(given)
    write("cpu", f"CPU table ({args.precision})", rows, machine(), command.strip(), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
