"""Fuzz cases for pycaffe's entry points (``caffe2jax`` imported as ``caffe``) on hostile
files: ``Net`` (net text and weights), ``Net.forward``, ``get_solver`` with ``step``,
``restore`` and ``snapshot``, and ``caffe.io``'s readers. A file that cannot be used must end
in a CaffeError (one line), as the same file does through the command line."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError

from tests.fuzz.cli_cases import bad_path
from tests.fuzz.images import hostile_image
from tests.fuzz.mutate import mutate_bytes, mutate_text

PREFIXES = ["snap/tiny", "x" * 230, "/proc/self/snap", "/proc/self/x/y", "/dev/null/x", "/"]


def _net(seeds, rng: random.Random, work: Path) -> None:
    import caffe2jax as caffe

    path = work / "net.prototxt"
    text = rng.choice(seeds.nets)
    path.write_bytes(mutate_text(rng, text).encode("utf-8", "surrogatepass"))
    weights = None
    if rng.random() < 0.4:
        weights = work / "w.caffemodel"
        weights.write_bytes(mutate_bytes(rng, seeds.caffemodel))
    net = caffe.Net(str(path), rng.choice([caffe.TEST, caffe.TRAIN]),
                    weights=str(weights) if weights else None)  # fmt: skip
    if rng.random() < 0.5:
        net.forward()


def _solver(seeds, rng: random.Random, work: Path) -> None:
    import caffe2jax as caffe

    folder = work / "solver"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(seeds.digits, folder, ignore=shutil.ignore_patterns("*_iter_*"))
    text = (folder / "tiny_solver.prototxt").read_text()
    if rng.random() < 0.4:
        prefix = rng.choice(PREFIXES)
        text = text.replace('snapshot_prefix: "tiny"', f'snapshot_prefix: "{prefix}"')
    elif rng.random() < 0.5:
        text = mutate_text(rng, text)
    (folder / "s.prototxt").write_text(text)
    solver = caffe.get_solver(str(folder / "s.prototxt"))
    try:
        choice = rng.randrange(3)
        if choice == 0:
            state = folder / "r.solverstate"
            state.write_bytes(mutate_bytes(rng, seeds.digits_state))
            shutil.copy(seeds.digits / "tiny_iter_1.caffemodel", folder)
            solver.restore(str(state))
        elif choice == 1:
            solver.restore(str(rng.choice(seeds.edge_states)))
        solver.step(1)
        if rng.random() < 0.3:
            solver.snapshot()
    finally:
        solver.close() if hasattr(solver, "close") else None


def _io(seeds, rng: random.Random, work: Path) -> None:
    import caffe2jax as caffe
    from caffe2jax.frontend import caffe_pb2

    choice = rng.randrange(3)
    if choice == 0:
        path = work / f"im.{rng.choice(['png', 'jpg', 'bmp'])}"
        path.write_bytes(hostile_image(rng))
        target = str(path) if rng.random() < 0.8 else bad_path(rng, work)
        caffe.io.load_image(target, color=rng.random() < 0.7)
    elif choice == 1:
        blob = caffe_pb2.BlobProto()
        try:  # the script's own parse (protobuf's error, not caffe.io's)
            blob.ParseFromString(mutate_bytes(rng, seeds.binaryproto))
        except DecodeError:
            return
        caffe.io.blobproto_to_array(blob)
    else:
        datum = caffe_pb2.Datum(encoded=True, data=hostile_image(rng), label=1)
        if rng.random() < 0.3:
            datum = caffe_pb2.Datum(channels=3, height=rng.choice([8, 2**31 - 1]), width=8,
                                    data=np.zeros(192, np.uint8).tobytes())  # fmt: skip
        caffe.io.datum_to_array(datum)


def api_case(seeds, rng: random.Random, work: Path) -> None:
    """pycaffe's Net, Solver or io on hostile input."""
    rng.choice([_net, _net, _solver, _io])(seeds, rng, work)
