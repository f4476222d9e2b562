"""Issue 41: the functional API called as the README shows it (``model.apply(...)`` directly)
against the caller's own ``jax.jit(model.apply)``, both warm, in alternating blocks.

    python benchmarks/compiled_api.py [--cases googlenet,pspnet] [--blocks 3] [--eager]

``--eager`` adds the op-by-op path (``jax.disable_jit()``, what a direct call cost before
``apply`` was compiled) on GoogLeNet only — PSPNet op by op takes minutes a call. PSPNet is the
fork development set's PSPNet-101 (Cityscapes) prototxt at its own 713×713 (its pyramid pooling
windows are sized for it), batch 1, random weights.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Row, machine, measure, write  # noqa: E402

from caffe2jax.cli.main import configure_jax  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"
CASES = {
    "googlenet": (SHARED / "caffe/models/models/bvlc_googlenet/deploy.prototxt", 224, 3),
    "pspnet": (SHARED / "forks/models/pspnet101_cityscapes_713.prototxt", 713, 1),
}


def row(name: str, blocks: int, eager: bool) -> list[Row]:
    import jax

    import caffe2jax

    prototxt, size, calls = CASES[name]
    model = caffe2jax.compile(str(prototxt), input_shapes={"data": (1, 3, size, size)})
    params, state = model.init(jax.random.key(0))
    x = {"data": np.random.default_rng(0).uniform(-1, 1, (1, 3, size, size)).astype(np.float32)}
    jitted = jax.jit(model.apply)
    out = [
        measure(
            Row(f"{name} b1 {size}x{size}: model.apply", "jax.jit(model.apply)"),
            lambda: model.apply(params, state, x)[0],
            lambda: lambda: jitted(params, state, x)[0],
            calls,
            blocks,
        )  # fmt: skip
    ]
    if eager:

        def op_by_op():
            with jax.disable_jit():
                return model.apply(params, state, x)[0]

        direct = lambda: model.apply(params, state, x)[0]  # noqa: E731
        out.append(measure(Row(f"{name}: op by op (jax.disable_jit)", "model.apply"), op_by_op,
                           lambda: direct, 1, blocks))  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="googlenet,pspnet")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--eager", action="store_true")
    args = parser.parse_args()
    configure_jax()
    rows = []
    for name in args.cases.split(","):
        rows += row(name, args.blocks, args.eager and name == "googlenet")
    write("compiled-api", "model.apply called directly vs jax.jit(model.apply)", rows, machine(),
          "python benchmarks/compiled_api.py " + " ".join(sys.argv[1:]))  # fmt: skip


if __name__ == "__main__":
    main()
