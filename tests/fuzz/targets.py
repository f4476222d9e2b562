"""What each fuzz case reads, and how: one function per kind of Caffe file.

``Seeds`` builds the well-formed originals once per worker (from ../shared/caffe/golden and
the digits example); ``KINDS[kind](seeds, rng, work)`` writes one mutated file under ``work``
and runs the reader a user's command would run on it. A case passes when it returns or raises
a :class:`caffe2jax.frontend.errors.CaffeError`.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import h5py
import numpy as np

from tests.fuzz import hdf5_cases
from tests.fuzz.api_cases import api_case
from tests.fuzz.cli_cases import cli_case
from tests.fuzz.data_cases import hdf5data_case, imagedata_case, leveldb_case, lmdb_images_case
from tests.fuzz.fork_cases import fork_param_case, new_verb_case
from tests.fuzz.mutate import mutate_bytes, mutate_text
from tests.fuzz.seeds import Seeds, make_seeds  # noqa: F401 - the worker's entry

LIMIT = 1 << 30  # the size check's limit in the net cases (besides the worker's own)


def net_case(seeds: Seeds, rng: random.Random, work: Path) -> None:
    """summary/time's path: parse, upgrade, filter, build, infer shapes, size check."""
    from caffe2jax.cli.summary import summary_lines
    from caffe2jax.frontend.pipeline import load_net
    from caffe2jax.lowering.model import Model
    from caffe2jax.runtime.host.memory import check_net_fits

    text = mutate_text(rng, rng.choice(seeds.nets), seeds.nets)
    path = work / "net.prototxt"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    net = load_net(path, rng.choice(["TRAIN", "TEST"]))
    model = Model(net)
    summary_lines(model.net)
    check_net_fits(model.net, itemsize=8, available=LIMIT, params=model.graph.decls)
    check_net_fits(model.net, itemsize=8, params=model.graph.decls)  # the process's own limits
    if rng.random() < 0.2:  # Caffe's fillers, as `init` runs them
        model.init(rng.randrange(2**31))


def solver_case(seeds: Seeds, rng: random.Random, work: Path) -> None:
    """train's pre-flight: read and check the solver, then its train net's size."""
    from caffe2jax.cli.train import check_train_net_fits
    from caffe2jax.runtime.train.setup import check_solver, read_solver_param

    text, net = rng.choice(seeds.solvers)
    shutil.copy(net, work / "net.prototxt")
    path = work / "solver.prototxt"
    path.write_bytes(mutate_text(rng, text, [t for t, _ in seeds.solvers]).encode())
    param, folder = read_solver_param(path)
    check_solver(param, str(path))
    check_train_net_fits(param, folder)


def _weights_target(rng: random.Random, seeds: Seeds, path: Path, work: Path) -> None:
    from caffe2jax.runtime.formats.convert import convert_weights
    from caffe2jax.runtime.formats.weights import load_weights

    choice = rng.randrange(3)
    if choice == 0:
        load_weights(path, seeds.model)
    else:
        out = work / ("out.caffemodel.h5" if choice == 1 else "out.caffemodel")
        out.unlink(missing_ok=True)
        convert_weights(path, out)


def weights_case(seeds: Seeds, rng: random.Random, work: Path) -> None:
    """A mutated binary .caffemodel: load into the net, or convert without one."""
    path = work / "w.caffemodel"
    path.write_bytes(mutate_bytes(rng, seeds.caffemodel))
    _weights_target(rng, seeds, path, work)


def weights_h5_case(seeds: Seeds, rng: random.Random, work: Path) -> None:
    """A mutated or structurally broken .caffemodel.h5: load into the net, or convert."""
    path = work / "w.caffemodel.h5"
    if rng.random() < 0.5:
        path.write_bytes(mutate_bytes(rng, seeds.caffemodel_h5))
    else:
        hdf5_cases.structural(rng, seeds.layers, path, work)
    _weights_target(rng, seeds, path, work)


def _solverstate_h5_defect(rng: random.Random, path: Path) -> None:
    with h5py.File(path, "r+") as f:
        choice = rng.randrange(8)
        if choice == 0:
            del f["learned_net"]
            f["learned_net"] = np.bytes_(b"\xff\xfe\x80bad")
        elif choice == 1:
            del f["iter"]
            f["iter"] = rng.choice([np.ones((3,), "i4"), np.bytes_(b"5"), np.ones(1, "f4")])
        elif choice == 2:
            del f["history/0"]
            f.create_dataset("history/0", shape=rng.choice(hdf5_cases.HUGE), dtype="f4")
        elif choice == 3:
            f["history/0x"] = h5py.SoftLink("/history")
            del f["history/0"]
            f["history/0"] = h5py.SoftLink("/history")
        elif choice == 4:
            del f["history/1"]
            f["history/1"] = h5py.ExternalLink("/etc/passwd", "/")
        elif choice == 5:
            del f["history"]
            f["history"] = np.ones(3, "f4")
        elif choice == 6:
            del f["learned_net"]
            f["learned_net"] = np.ones((2, 2), "f4")
        else:
            del f["iter"]


COUNTERS = [0, 1, 2**31 - 1, 2**31, -1, -(2**31), 2**62, -(2**63), 2**63 - 1, 10**15]
NAMES = ["", "w.caffemodel", "x" * 300, "a/" * 2100, "/proc/self/mem", "/proc/self/fd/0",
         "/dev/zero", "\u00e9\u00e8.caffemodel", "a\x00b"]  # fmt: skip


def _solverstate_edges(rng: random.Random, seeds: Seeds, path: Path) -> None:
    """A well-formed state whose counters or weights name sit at or past the edges."""
    from caffe2jax.frontend import caffe_pb2

    if rng.random() < 0.5:
        msg = caffe_pb2.SolverState()
        msg.ParseFromString(seeds.solverstate)
        msg.iter = max(-(2**31), min(2**31 - 1, rng.choice(COUNTERS)))
        msg.current_step = max(-(2**31), min(2**31 - 1, rng.choice(COUNTERS)))
        msg.learned_net = rng.choice(NAMES)
        path.write_bytes(msg.SerializeToString())
        return
    path.write_bytes(seeds.solverstate_h5)
    with h5py.File(path, "r+") as f:
        name = rng.choice(["iter", "current_step"])
        del f[name]
        value = rng.choice(COUNTERS)
        f[name] = np.array([value], "u8" if value >= 0 and rng.random() < 0.3 else "i8")


def solverstate_case(seeds: Seeds, rng: random.Random, work: Path) -> None:
    """Solver::Restore's reading of a binary or HDF5 .solverstate."""
    from caffe2jax.runtime.formats.solverstate import read_solverstate

    path = work / "s.solverstate"
    choice = rng.randrange(4)
    if choice == 0:
        path.write_bytes(mutate_bytes(rng, seeds.solverstate))
    elif choice == 1:
        path.write_bytes(mutate_bytes(rng, seeds.solverstate_h5))
    elif choice == 2:
        path.write_bytes(seeds.solverstate_h5)
        _solverstate_h5_defect(rng, path)
    else:
        _solverstate_edges(rng, seeds, path)
    read_solverstate(path)


def binaryproto_case(seeds: Seeds, rng: random.Random, work: Path) -> None:
    """A mean file (transform_param.mean_file) as Caffe reads it."""
    from caffe2jax.runtime.data.records.datum import read_blobproto

    path = work / "mean.binaryproto"
    path.write_bytes(mutate_bytes(rng, seeds.binaryproto))
    read_blobproto(path)


def lmdb_case(seeds: Seeds, rng: random.Random, work: Path) -> None:
    """A damaged LMDB copy read record by record as a Data layer reads it: truncated, or with
    bytes changed in its meta pages or in its records (page structure left alone: LMDB trusts
    its own page pointers, as Caffe does)."""
    from caffe2jax.runtime.data.records.datum import datum_to_array, parse_datum
    from caffe2jax.runtime.data.records.db import Cursor, open_db

    db = work / "db"
    shutil.rmtree(db, ignore_errors=True)
    shutil.copytree(seeds.lmdb, db)
    data = bytearray((db / "data.mdb").read_bytes())
    choice = rng.randrange(3)
    if choice == 0:
        cut = rng.choice([0, 7, 100, 4096, 8192, len(data) // 2, len(data) - 4096, len(data) - 1])
        del data[max(cut, 0) :]
    elif choice == 1:
        page = rng.choice([0, 4096])
        data[page + 16 : page + 160] = mutate_bytes(rng, bytes(data[page + 16 : page + 160]), 1)
        data[page + 16 : page + 160] = data[page + 16 : page + 160].ljust(144, b"\0")[:144]
    else:
        _mutate_records(rng, data)
    (db / "data.mdb").write_bytes(bytes(data))
    database = open_db(db, "lmdb")
    try:
        cursor = Cursor(database)
        for _ in range(45):
            datum = parse_datum(cursor.value, where=f"{db} record {cursor.key!r}")
            datum_to_array(datum)
            cursor.next()
    finally:
        database.close()


def _mutate_records(rng: random.Random, data: bytearray) -> None:
    """Change bytes inside a stored Datum (found by its encoded 8×8 data field)."""
    marker = b"\x08\x01\x10\x08\x18\x08"  # channels 1, height 8, width 8
    starts = [i for i in range(len(data)) if data.startswith(marker, i)]
    if not starts:
        return
    start = rng.choice(starts)
    span = bytes(data[start : start + 80])
    mutated = mutate_bytes(rng, span)[: len(span)].ljust(len(span), b"\0")
    data[start : start + len(span)] = mutated


KINDS = {
    "net": net_case,
    "solver": solver_case,
    "weights": weights_case,
    "weights_h5": weights_h5_case,
    "solverstate": solverstate_case,
    "binaryproto": binaryproto_case,
    "lmdb": lmdb_case,
    "lmdb_images": lmdb_images_case,
    "leveldb": leveldb_case,
    "imagedata": imagedata_case,
    "hdf5data": hdf5data_case,
    "cli": cli_case,
    "pycaffe": api_case,
    "fork_params": fork_param_case,
    "new_verbs": new_verb_case,
}
# kinds whose cases compile programs: the worker clears JAX's caches after each
HEAVY = {"net", "cli", "pycaffe", "fork_params", "new_verbs"}
