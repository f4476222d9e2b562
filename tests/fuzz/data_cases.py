"""Fuzz cases for the data layers a user points at files: Data over LMDB and LevelDB
(raw and encoded Datums, hostile image headers), ImageData lists and HDF5Data lists, read
the way ``train`` reads them (a net's Feeder, prefetching included) or source by source."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import h5py
import numpy as np

from tests.fuzz.images import hostile_image, valid
from tests.fuzz.mutate import INTERESTING_NUMBERS, mutate_bytes, mutate_text

BATCHES = [1, 1, 2, 3, 8, 64, 1000, 100000, 2**31 - 1, 0, -1]
# The CI share skips batches that a reader can fill (<= 2**31 - 1 values) but that take seconds
# of CPU each (100000 items, read ahead by the prefetcher): on a shared machine they pass the
# 60 s limit by waiting for a core. The long run (scripts/fuzz.py) keeps them.
HEAVY_BATCH = 100000


def _batch(rng: random.Random, choices: list[int]) -> int:
    batch = rng.choice(choices)
    if batch == HEAVY_BATCH and os.environ.get("CAFFE2JAX_FUZZ_LIGHT"):
        return 1000
    return batch


SIDES = [0, 0, 0, 1, 8, 32, 1000, 30000, 100000, 2**31 - 1]


def _transform(rng: random.Random) -> str:
    fields = []
    if rng.random() < 0.3:
        fields.append(f"crop_size: {rng.choice([1, 4, 8, 9, 100000, 2**31 - 1])}")
    if rng.random() < 0.3:
        fields.append(f"scale: {rng.choice(['0.5', '1e38', '-1', 'nan'])}")
    if rng.random() < 0.2:
        fields.append("mirror: true")
    if rng.random() < 0.2:
        fields.append(f"mean_value: {rng.choice(['1', '1e39', '-5'])}")
    if rng.random() < 0.15:
        fields.append(rng.choice(["force_color: true", "force_gray: true"]))
    return f"transform_param {{ {' '.join(fields)} }}" if fields else ""


def _read(rng: random.Random, prototxt: str, work: Path, layer_param=None) -> None:
    """Read two batches: through the net's Feeder (prefetch, memory check) or the source."""
    from caffe2jax.frontend.pipeline import load_net
    from caffe2jax.runtime.data.feeding import Feeder
    from caffe2jax.runtime.data.sources import make_source

    path = work / "net.prototxt"
    path.write_text(prototxt)
    net = load_net(path, rng.choice(["TRAIN", "TEST"]))
    if rng.random() < 0.5:
        feeder = Feeder(net, work, seed=rng.randrange(100))
        try:
            feeder.input_shapes()
            for _ in range(2):
                feeder.next_batches()
        finally:
            feeder.close()
        return
    source = make_source(net.layers[0].param, net.phase, base_dir=work, seed=1)
    try:
        source.top_shapes()
        for _ in range(2):
            source.next_batch()
    finally:
        source.close()


def _datums(rng: random.Random) -> list[bytes]:
    from caffe2jax.runtime.data.records.datum import array_to_datum, encoded_datum

    out = []
    for i in range(rng.choice([1, 2, 5])):
        if rng.random() < 0.6:
            datum = encoded_datum(hostile_image(rng) if rng.random() < 0.7 else valid(rng), i)
        else:
            side = rng.choice([1, 4, 8])
            datum = array_to_datum(np.full((3, side, side), i, np.uint8), i)
            if rng.random() < 0.3:
                datum.height = rng.choice([0, 8, 100000, 2**31 - 1])
        data = datum.SerializeToString()
        out.append(mutate_bytes(rng, data, 1) if rng.random() < 0.15 else data)
    return out


def _db_case(rng: random.Random, work: Path, backend: str) -> None:
    from caffe2jax.runtime.data.records.db import Writer

    db = work / f"db_{backend}"
    shutil.rmtree(db, ignore_errors=True)
    with Writer(db, backend) as writer:
        for i, value in enumerate(_datums(rng)):
            writer.put(f"{i:08d}", value)
    if backend == "leveldb" and rng.random() < 0.3:
        tables = sorted(db.glob("*.ldb")) + sorted(db.glob("*.log"))
        if tables:
            victim = rng.choice(tables)
            victim.write_bytes(mutate_bytes(rng, victim.read_bytes()))
    batch = _batch(rng, BATCHES)
    kind = "LMDB" if backend == "lmdb" else "LEVELDB"
    _read(rng, f'layer {{ name: "d" type: "Data" top: "data" top: "label" {_transform(rng)} '
          f'data_param {{ source: "{db.name}" backend: {kind} batch_size: {batch} }} }}\n',
          work)  # fmt: skip


def lmdb_images_case(seeds, rng: random.Random, work: Path) -> None:
    """An LMDB of Datums, most holding encoded images with hostile headers."""
    _db_case(rng, work, "lmdb")


def leveldb_case(seeds, rng: random.Random, work: Path) -> None:
    """A LevelDB of Datums (encoded or raw), sometimes with a table or log file damaged."""
    _db_case(rng, work, "leveldb")


def _list_lines(rng: random.Random, work: Path) -> str:
    images = work / "img"
    shutil.rmtree(images, ignore_errors=True)
    images.mkdir()
    lines = []
    for i in range(rng.choice([1, 2, 4])):
        name = f"im{i}.{rng.choice(['png', 'jpg', 'bmp', 'x'])}"
        (images / name).write_bytes(hostile_image(rng) if rng.random() < 0.6 else valid(rng))
        lines.append(f"img/{name} {i}")
    extra = [
        "img",
        "missing.png 1",
        "/proc/self/mem 0",
        "img/im0.png notanumber",
        "",
        " 3",
        "img/im0.png 99999999999999999999",
        "/etc/passwd 1",
        "x" * 300 + " 1",
    ]
    if rng.random() < 0.3:
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(extra))
    text = "\n".join(lines) + "\n"
    return mutate_text(rng, text) if rng.random() < 0.2 else text


def imagedata_case(seeds, rng: random.Random, work: Path) -> None:
    """An ImageData list of hostile images, with hostile new_height/new_width/batch_size."""
    (work / "list.txt").write_text(_list_lines(rng, work), errors="surrogateescape")
    side = rng.choice(SIDES)
    other = side if rng.random() < 0.8 else rng.choice(SIDES)
    param = (f'source: "list.txt" batch_size: {_batch(rng, BATCHES)} new_height: {side} '
             f'new_width: {other} is_color: {rng.choice(["true", "false"])} '
             f'shuffle: {rng.choice(["true", "false"])} '
             f'rand_skip: {rng.choice([0, 0, 1, 3, 2**31 - 1])}')  # fmt: skip
    _read(rng, f'layer {{ name: "d" type: "ImageData" top: "data" top: "label" '
          f'{_transform(rng)} image_data_param {{ {param} }} }}\n', work)  # fmt: skip


def _hdf5_file(rng: random.Random, path: Path) -> None:
    rows = rng.choice([1, 6, 6, 100])
    with h5py.File(path, "w") as f:
        choice = rng.randrange(10)
        data_shape = (rows, 3, 4, 4)
        if choice == 0:
            f.create_dataset("data", shape=rng.choice([(10**10, 3), (2**31, 4), (10**5, 10**5)]),
                             dtype="f4", chunks=True)  # fmt: skip
        elif choice == 1:
            f["data"] = np.ones((rows,), "f4")
        elif choice == 2:
            f["data"] = np.ones((rows + 1, 2), "f4")
        elif choice == 3:
            f["data"] = np.array([b"text"] * rows)
        elif choice == 4:
            f["data"] = np.ones((0, 3), "f4")
        else:
            f["data"] = np.ones(data_shape, rng.choice(["f4", "f8", "u1", "i8"]))
        if choice != 5:
            f["label"] = np.arange(rows, dtype="f4")


def hdf5data_case(seeds, rng: random.Random, work: Path) -> None:
    """An HDF5Data list of small or hostile files with extreme batch sizes."""
    names = []
    for i in range(rng.choice([1, 2, 3, 6])):
        _hdf5_file(rng, work / f"part{i}.h5")
        names.append(f"part{i}.h5")
    if rng.random() < 0.2:
        names.append(rng.choice(["missing.h5", "/proc/self/mem", "list.txt", "part0.h5 x"]))
    text = "\n".join(names) + "\n"
    (work / "list.txt").write_text(mutate_text(rng, text) if rng.random() < 0.15 else text)
    batch = _batch(rng, BATCHES + [100000, 2**31 - 1])
    shuffle = rng.choice(["true", "false"])
    prefetch = rng.choice(["", "", f"data_param {{ prefetch: {rng.choice(INTERESTING_NUMBERS)} }}"])
    _read(rng, f'layer {{ name: "d" type: "HDF5Data" top: "data" top: "label" {prefetch} '
          f'hdf5_data_param {{ source: "list.txt" batch_size: {batch} shuffle: {shuffle} }} }}\n',
          work)  # fmt: skip
