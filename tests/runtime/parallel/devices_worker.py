"""Runs data-parallel training cases in a process whose JAX sees several CPU devices.

Started by tests/runtime/parallel/test_data_parallel.py with
XLA_FLAGS=--xla_force_host_platform_device_count
set before JAX initialises; prints one JSON object: each case's largest difference.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[3]
LMDB = ROOT / "examples" / "digits" / "digits_train_lmdb"
TEST_LMDB = ROOT / "examples" / "digits" / "digits_test_lmdb"


def net_text(batch: int, bn: bool, source: str | None = None) -> str:
    norm = (
        'layer { name: "bn" type: "BatchNorm" bottom: "h" top: "h" }\n'
        'layer { name: "sc" type: "Scale" bottom: "h" top: "h" scale_param { bias_term: true } }\n'
        if bn
        else ""
    )
    if source is None:
        data = (
            f'layer {{ name: "data" type: "Data" top: "data" top: "label"'
            f" include {{ phase: TRAIN }}"
            f" transform_param {{ scale: 0.0625 }}"
            f' data_param {{ source: "{LMDB}" batch_size: {batch} backend: LMDB }} }}\n'
            f'layer {{ name: "data" type: "Data" top: "data" top: "label"'
            f" include {{ phase: TEST }}"
            f" transform_param {{ scale: 0.0625 }}"
            f' data_param {{ source: "{TEST_LMDB}" batch_size: 24 backend: LMDB }} }}'
        )
    else:
        data = (
            f'layer {{ name: "data" type: "HDF5Data" top: "data" top: "label"'
            f' hdf5_data_param {{ source: "{source}" batch_size: {batch} }} }}'
        )
    return f"""
name: "small"
{data}
layer {{ name: "ip1" type: "InnerProduct" bottom: "data" top: "h"
  inner_product_param {{ num_output: 16 weight_filler {{ type: "xavier" }} }} }}
{norm}layer {{ name: "relu" type: "ReLU" bottom: "h" top: "h" }}
layer {{ name: "ip2" type: "InnerProduct" bottom: "h" top: "out"
  inner_product_param {{ num_output: 10 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "out" bottom: "label" top: "loss" }}
layer {{ name: "acc" type: "Accuracy" bottom: "out" bottom: "label" top: "acc"
  include {{ phase: TEST }} }}
"""


def solver_file(folder: Path, batch: int, kind: str, iter_size: int = 1, bn: bool = False,
                snapshot: int = 0, source: str | None = None, tests: bool = False,
                ) -> Path:  # fmt: skip
    net = folder / f"net_{batch}_{bn}_{source is None}.prototxt"
    net.write_text(net_text(batch, bn, source))
    extra = "momentum: 0.9 momentum2: 0.999 delta: 1e-8" if kind == "Adam" else "momentum: 0.9"
    path = folder / f"solver_{batch}_{kind}_{iter_size}_{bn}.prototxt"
    path.write_text(
        f'net: "{net}"\ntype: "{kind}"\nbase_lr: 0.01\n{extra}\nweight_decay: 0.0005\n'
        f'lr_policy: "fixed"\nmax_iter: 100\nrandom_seed: 7\niter_size: {iter_size}\n'
        f'snapshot: {snapshot}\nsnapshot_prefix: "{folder}/snap"\n'
        + ("test_iter: 3\ntest_interval: 1000\n" if tests else "")
    )
    return path


def train(path: Path, iters: int, devices=None, restore=None, then: int = 0):
    """(params, state) as numpy after ``iters`` iterations, and the loop (or, with ``then``,
    the (params, state) after that many more)."""
    from caffe2jax.runtime.train.loop import SolverLoop

    loop = SolverLoop(path, devices=devices)
    try:
        if restore is not None:
            loop.restore(restore)
        loop.step(iters)
        done = jax.tree.map(np.asarray, (loop.ts.params, loop.ts.state))
        if then:
            loop.step(then)
            return done, jax.tree.map(np.asarray, (loop.ts.params, loop.ts.state))
        return done, loop
    finally:
        loop.close()


def hdf5_source(folder: Path) -> str:
    """64 rows of the digits: one iteration of 4 devices × 16 reads them all, so every
    iteration starts at row 0 whatever the reader position a restore leaves."""
    import h5py

    rng = np.random.default_rng(0)
    with h5py.File(folder / "rows.h5", "w") as f:
        f["data"] = rng.random((64, 1, 8, 8), dtype=np.float32)
        f["label"] = rng.integers(0, 10, 64).astype(np.float32)
    (folder / "rows.txt").write_text(str(folder / "rows.h5") + "\n")
    return str(folder / "rows.txt")


def diff(a, b) -> float:
    leaves = jax.tree.leaves(jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))), a, b))
    return max(leaves)


def test_nets(folder: Path) -> dict:
    """Solver::Test on the mesh (3 batches over 4 devices: one round, one padded slot)
    against one device, from the same weights."""
    from caffe2jax.runtime.train.loop import SolverLoop

    scores = []
    for devices in (None, "all"):
        loop = SolverLoop(solver_file(folder, 16, "SGD", tests=True), devices=devices)
        scores.append(loop.test(0))
        loop.close()
    return {"test_net": max(abs(scores[0][k] - scores[1][k]) for k in scores[0]),
            "test_acc": scores[1]["acc"]}  # fmt: skip


def snapshots(folder: Path) -> dict:
    """A snapshot written on 4 devices restores on 1 device (batch 64) and continues as the
    4-device run does."""
    source = hdf5_source(folder)
    four, _ = train(solver_file(folder, 16, "Adam", snapshot=5, source=source), 10, "all")
    state = folder / "snap_iter_5.solverstate"
    one, loop = train(solver_file(folder, 64, "Adam", source=source), 5, restore=state)
    return {"snapshot_restore": diff(four[0], one[0]), "restored_iter": loop.iter}


def pycaffe_names(folder: Path) -> dict:
    """get_solver(devices=...): the train net view shows device 0's batch; the pycaffe
    multi-GPU counts describe the mesh."""
    import caffe2jax as caffe
    from caffe2jax.runtime.data.feeding import Feeder

    solver = caffe.get_solver(str(solver_file(folder, 16, "SGD")), devices=[0, 1, 2, 3])
    solver.step(2)
    data = np.array(solver.net.blobs["data"].data)
    loss = float(solver.net.blobs["loss"].data)
    # device 0's batch of iteration 1 is the reader's 5th batch of 16 (rows 64..79)
    feeder = Feeder(solver._loop.train.model.net, folder, seed=7)
    fifth = [feeder.next_batches() for _ in range(5)][-1]
    feeder.close()
    solver._loop.close()
    return {"view_rows": list(data.shape), "view_loss": loss,
            "view_device0": float(np.max(np.abs(data - np.asarray(fifth["data"])))),
            "solver_count": caffe.solver_count(), "solver_rank": caffe.solver_rank()}  # fmt: skip


def refusals(folder: Path) -> dict:
    """What multi-device training refuses, each with its one-line message."""
    from caffe2jax.frontend.errors import CaffeError
    from caffe2jax.runtime.train.loop import SolverLoop

    net = folder / "input.prototxt"
    net.write_text(
        'name: "fed"\nlayer { name: "in" type: "Input" top: "x" top: "y"\n'
        "  input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } } }\n"
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "z"\n'
        "  inner_product_param { num_output: 2 } }\n"
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "z" bottom: "y" top: "l" }\n'
    )
    solver = folder / "input_solver.prototxt"
    solver.write_text(f'net: "{net}"\nbase_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 1\n')
    out = {}
    for name, devices in (("input_error", "all"), ("ids_error", [0, 9])):
        try:
            SolverLoop(solver, devices=devices)
            out[name] = ""
        except CaffeError as err:
            out[name] = str(err)
    return out


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
        # BatchNorm: statistics per device, as Caffe's solvers compute them on their own GPU
        first_four, bn_four = train(solver_file(folder, 16, "SGD", bn=True), 1, "all", then=9)
        bn_iter4, _ = train(solver_file(folder, 16, "SGD", iter_size=4, bn=True), 10)
        bn_64, _ = train(solver_file(folder, 64, "SGD", bn=True), 10)
        first_one, _ = train(solver_file(folder, 16, "SGD", bn=True), 1)
        out["bn_vs_iter_size4"] = diff(bn_four[0], bn_iter4[0])
        out["bn_vs_batch64"] = diff(bn_four[0], bn_64[0])
        out["bn_state_device0"] = diff(first_four[1], first_one[1])
        out.update(test_nets(folder))
        out.update(snapshots(folder))
        out.update(pycaffe_names(folder))
        out.update(refusals(folder))
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
