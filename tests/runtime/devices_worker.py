"""Runs data-parallel training cases in a process whose JAX sees several CPU devices.

Started by tests/runtime/test_devices.py with XLA_FLAGS=--xla_force_host_platform_device_count
set before JAX initialises; prints one JSON object: each case's largest difference.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
LMDB = ROOT / "examples" / "digits" / "digits_train_lmdb"


def net_text(batch: int, bn: bool) -> str:
    norm = (
        'layer { name: "bn" type: "BatchNorm" bottom: "h" top: "h" }\n'
        'layer { name: "sc" type: "Scale" bottom: "h" top: "h" scale_param { bias_term: true } }\n'
        if bn
        else ""
    )
    return f"""
name: "small"
layer {{ name: "data" type: "Data" top: "data" top: "label"
  transform_param {{ scale: 0.0625 }}
  data_param {{ source: "{LMDB}" batch_size: {batch} backend: LMDB }} }}
layer {{ name: "ip1" type: "InnerProduct" bottom: "data" top: "h"
  inner_product_param {{ num_output: 16 weight_filler {{ type: "xavier" }} }} }}
{norm}layer {{ name: "relu" type: "ReLU" bottom: "h" top: "h" }}
layer {{ name: "ip2" type: "InnerProduct" bottom: "h" top: "out"
  inner_product_param {{ num_output: 10 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "out" bottom: "label" top: "loss" }}
"""


def solver_file(folder: Path, batch: int, kind: str, iter_size: int = 1, bn: bool = False,
                snapshot: int = 0) -> Path:  # fmt: skip
    net = folder / f"net_{batch}_{bn}.prototxt"
    net.write_text(net_text(batch, bn))
    extra = "momentum: 0.9 momentum2: 0.999 delta: 1e-8" if kind == "Adam" else "momentum: 0.9"
    path = folder / f"solver_{batch}_{kind}_{iter_size}_{bn}.prototxt"
    path.write_text(
        f'net: "{net}"\ntype: "{kind}"\nbase_lr: 0.01\n{extra}\nweight_decay: 0.0005\n'
        f'lr_policy: "fixed"\nmax_iter: 100\nrandom_seed: 7\niter_size: {iter_size}\n'
        f'snapshot: {snapshot}\nsnapshot_prefix: "{folder}/snap"\n'
    )
    return path


def train(path: Path, iters: int, devices=None, restore=None):
    from caffe2jax.runtime.solver_loop import SolverLoop

    loop = SolverLoop(path, devices=devices)
    try:
        if restore is not None:
            loop.restore(restore)
            loop.train.feeder  # noqa: B018
        loop.step(iters)
        return jax.tree.map(np.asarray, (loop.ts.params, loop.ts.state)), loop
    finally:
        loop.close()


def diff(a, b) -> float:
    leaves = jax.tree.leaves(jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))), a, b))
    return max(leaves)


def main() -> None:
    out = {"devices": jax.device_count()}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for kind in ("SGD", "Adam"):
            one, _ = train(solver_file(folder, 64, kind), 10)
            four, _ = train(solver_file(folder, 16, kind), 10, devices="all")
            out[f"{kind.lower()}"] = diff(one[0], four[0])
        one, _ = train(solver_file(folder, 32, "SGD", iter_size=2), 10)
        four, _ = train(solver_file(folder, 8, "SGD", iter_size=2), 10, devices="all")
        out["iter_size"] = diff(one[0], four[0])
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
