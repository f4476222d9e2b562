"""The well-formed originals the fuzz cases mutate, built once per run (shared by the workers
of a run: whatever exists in the seeds folder is reused)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from tests.fuzz import hdf5_cases
from tests.golden import GOLDEN, ROOT, require

FORMATS = GOLDEN / "formats"
SOLVERS = GOLDEN / "solvers"
DIGITS = ROOT / "examples" / "digits"
NET_SEEDS = [
    FORMATS / "format_net.prototxt",
    SOLVERS / "sgd_fixed" / "net.prototxt",
    GOLDEN / "nets" / "lenet_train.prototxt",
    GOLDEN / "nets" / "cifar10_quick_train.prototxt",
    ROOT / "tests" / "frontend" / "data" / "upgrade_v1_all_types.prototxt",
    ROOT / "tests" / "frontend" / "data" / "upgrade_v0_net.prototxt",
]
SOLVER_SEEDS = ["sgd_fixed", "adam", "sgd_multistep", "nesterov", "sgd_step"]
POOL_SEED = """name: "pools"
layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 9 dim: 9 } } }
layer { name: "ave" type: "Pooling" bottom: "data" top: "ave"
        pooling_param { pool: AVE kernel_size: 3 pad: 1 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "ave" top: "ip" param { name: "w" }
        inner_product_param { num_output: 4 } }
layer { name: "ip2" type: "InnerProduct" bottom: "ave" top: "ip2" param { name: "w" }
        inner_product_param { num_output: 4 } }
"""


def _input(dims: str, extra: str = "") -> str:
    return (f'name: "edge"\nlayer {{ name: "in" type: "Input" top: "data" '
            f'input_param {{ shape {{ {dims} }} }} }}\n{extra}')  # fmt: skip


def _chain(kind: str, n: int, extra: str = "") -> str:
    return "".join(f'layer {{ name: "c{i}" type: "{kind}" bottom: "p" top: "p" {extra} }}\n'
                   for i in range(n))  # fmt: skip


# Shapes at Caffe's limits, sizes promised by parameters, the slow in-place chain of issue 25.
EDGE_NETS = [
    _input(" ".join(["dim: 1"] * 40)),
    _input("dim: 2 dim: -1", 'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n'),
    _input("dim: 2 dim: 9223372036854775807"),
    _input("dim: 65536 dim: 32768", 'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n'),
    _input(
        "dim: 2 dim: 3",
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
        "inner_product_param { num_output: 2000000000 } }\n",
    ),
    _input(
        "dim: 2 dim: 3 dim: 4",
        'layer { name: "t" type: "Tile" bottom: "data" top: "t" '
        "tile_param { axis: 1 tiles: 1000000000 } }\n",
    ),
    _input(
        "dim: 1 dim: 1 dim: 4 dim: 4",
        'layer { name: "d" type: "Deconvolution" bottom: "data" '
        'top: "d" convolution_param { num_output: 1 kernel_size: 3 stride: 100000 } }\n',
    ),
    _input(
        "dim: 2 dim: 3 dim: 9 dim: 9",
        'layer { name: "pool" type: "Pooling" bottom: "data" '
        'top: "p" pooling_param { pool: MAX kernel_size: 3 pad: 1 stride: 2 } }\n'
        + _chain("ReLU", 50),
    ),
    _input(
        "dim: 2 dim: 3 dim: 9 dim: 9",
        'layer { name: "pool" type: "Pooling" bottom: "data" '
        'top: "p" pooling_param { pool: MAX kernel_size: 3 pad: 1 stride: 2 } }\n'
        + _chain("Dropout", 50),
    ),
    _input(
        "dim: 2 dim: 3 dim: 5",
        'layer { name: "f" type: "Flatten" bottom: "data" top: "f" }\n'
        'layer { name: "e" type: "Embed" bottom: "f" top: "e" '
        "embed_param { num_output: 100000 input_dim: 100000 } }\n",
    ),
]
TINY_SOLVER = """net: "lenet_train_test.prototxt"
test_iter: 1
test_interval: 2
base_lr: 0.01
momentum: 0.9
lr_policy: "fixed"
display: 1
max_iter: 2
snapshot: 0
snapshot_prefix: "tiny"
random_seed: 1
"""
DIGITS_SHAPES = {"data": (64, 1, 8, 8), "label": (64,)}


@dataclass
class Seeds:
    work: Path
    nets: list[str]
    solvers: list[tuple[str, Path]]
    model: object
    format_net: Path
    caffemodel: bytes
    caffemodel_h5: bytes
    layers: hdf5_cases.Layers
    solverstate: bytes
    solverstate_h5: bytes
    binaryproto: bytes
    lmdb: Path
    digits: Path
    digits_weights: bytes
    digits_state: bytes
    edge_states: list[Path]


def _lmdb(db: Path) -> None:
    from caffe2jax.runtime.data.records.datum import array_to_datum
    from caffe2jax.runtime.data.records.db import Writer

    if db.exists():
        return
    rng = np.random.default_rng(0)
    with Writer(db) as writer:
        for i in range(40):
            image = rng.integers(0, 255, (1, 8, 8)).astype(np.uint8)
            writer.put(f"{i:08d}", array_to_datum(image, i % 10).SerializeToString())


def _digits(folder: Path) -> None:
    """The digits example with a 2-iteration solver, its weights and an iteration-1 state."""
    from caffe2jax.frontend.pipeline import load_net
    from caffe2jax.lowering.model import Model
    from caffe2jax.runtime.formats.solverstate import SolverStateFile, write_solverstate
    from caffe2jax.runtime.formats.weights import save_weights
    from caffe2jax.runtime.train.step import learnable_order

    if (folder / "tiny_iter_1.solverstate").exists():
        return
    shutil.copytree(DIGITS, folder, dirs_exist_ok=True)
    (folder / "tiny_solver.prototxt").write_text(TINY_SOLVER)
    model = Model(load_net(folder / "lenet_train_test.prototxt", "TRAIN"), DIGITS_SHAPES)
    params, state = model.init(0)
    save_weights(folder / "tiny_iter_1.caffemodel", model, params, state)
    history = [np.zeros(model.graph.decls[name][j].shape, np.float32)
               for name, j in learnable_order(model)]  # fmt: skip
    write_solverstate(
        folder / "tiny_iter_1.solverstate",
        SolverStateFile(1, "tiny_iter_1.caffemodel", 0, history),
        hdf5=False,
    )


def _edge_states(work: Path, digits: Path) -> list[Path]:
    """Solver states whose counters and weights name sit at the edges Caffe's ints allow."""
    from caffe2jax.runtime.formats.solverstate import read_solverstate, write_solverstate

    base = read_solverstate(digits / "tiny_iter_1.solverstate")
    out = []
    edges = [("iter", -(2**31)), ("iter", -1), ("iter", 2**31 - 1), ("current_step", -5),
             ("learned_net", "x" * 300), ("learned_net", "/proc/self/mem"),
             ("learned_net", "/proc/self/fd/0"), ("learned_net", "")]  # fmt: skip
    for i, (name, value) in enumerate(edges):
        path = work / f"edge{i}.solverstate"
        write_solverstate(path, dataclasses.replace(base, **{name: value}), hdf5=False)
        out.append(path)
    for i, value in enumerate([2**62, -(2**40), 2**31]):
        path = work / f"edge_h5_{i}.solverstate.h5"
        own = work / f"edge_h5_{i}.{os.getpid()}.h5"  # workers share the folder: each edits its
        write_solverstate(own, base, hdf5=True)  # own file, renamed in place (HDF5's file lock
        with h5py.File(own, "r+") as f:  # refused a second worker's r+ open of a shared one)
            del f["iter"]
            f["iter"] = np.array([value], np.int64)
        os.replace(own, path)
        out.append(path)
    return out


def make_seeds(work: Path) -> Seeds:
    from caffe2jax.frontend.pipeline import load_net
    from caffe2jax.lowering.model import Model
    from caffe2jax.runtime.formats.solverstate import read_solverstate, write_solverstate

    work.mkdir(parents=True, exist_ok=True)
    nets = [require(p).read_text() for p in NET_SEEDS] + [POOL_SEED] + EDGE_NETS
    solvers = []
    for name in SOLVER_SEEDS:
        folder = require(SOLVERS / name)
        solvers.append(((folder / "solver.prototxt").read_text(), folder / "net.prototxt"))
    model = Model(load_net(FORMATS / "format_net.prototxt", "TEST"))
    state = read_solverstate(SOLVERS / "sgd_fixed" / "sgd_fixed_iter_5.solverstate")
    if not (work / "seed.solverstate.h5").exists():  # workers share it: each writes its own
        own = work / f"seed.{os.getpid()}.solverstate.h5"  # file, renamed in place atomically
        write_solverstate(own, state, hdf5=True)
        os.replace(own, work / "seed.solverstate.h5")
    _lmdb(work / "seed_lmdb")
    _digits(work / "digits")
    return Seeds(
        work=work,
        nets=nets,
        solvers=solvers,
        model=model,
        format_net=FORMATS / "format_net.prototxt",
        caffemodel=(FORMATS / "format_net.caffemodel").read_bytes(),
        caffemodel_h5=(FORMATS / "format_net.caffemodel.h5").read_bytes(),
        layers=hdf5_cases.read_layers(FORMATS / "format_net.caffemodel.h5"),
        solverstate=(SOLVERS / "sgd_fixed" / "sgd_fixed_iter_5.solverstate").read_bytes(),
        solverstate_h5=(work / "seed.solverstate.h5").read_bytes(),
        binaryproto=(DIGITS / "digits_mean.binaryproto").read_bytes(),
        lmdb=work / "seed_lmdb",
        digits=work / "digits",
        digits_weights=(work / "digits" / "tiny_iter_1.caffemodel").read_bytes(),
        digits_state=(work / "digits" / "tiny_iter_1.solverstate").read_bytes(),
        edge_states=_edge_states(work, work / "digits"),
    )
