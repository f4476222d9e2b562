"""HDF5 files with one structural defect each, built with h5py (byte mutations cannot reach
most of these: links, huge declared shapes, compression bombs, odd dtypes)."""

from __future__ import annotations

import random
from pathlib import Path

import h5py
import numpy as np

Layers = list[tuple[str, list[np.ndarray]]]
HUGE = [(10**11,), (10**5, 10**5), (2**31, 4), (1, 1, 10**10), (2**40,)]


def read_layers(path: Path) -> Layers:
    """The ``data/<layer>/<i>`` datasets of a well-formed Caffe HDF5 weights file."""
    with h5py.File(path, "r") as f:
        return [
            (name, [f["data"][name][str(i)][()] for i in range(len(f["data"][name]))])
            for name in sorted(f["data"])
        ]


def _write(path: Path, layers: Layers) -> h5py.File:
    f = h5py.File(path, "w")
    data = f.create_group("data")
    for name, blobs in layers:
        group = data.create_group(name)
        for i, blob in enumerate(blobs):
            group.create_dataset(str(i), data=blob)
    return f


def _victim(rng: random.Random, f: h5py.File) -> tuple[h5py.Group, str]:
    """A (group, blob name) of some layer that has blobs."""
    groups = [f["data"][n] for n in f["data"] if len(f["data"][n])]
    group = rng.choice(groups)
    return group, rng.choice(sorted(group))


def _replace(rng, f, make) -> None:
    group, name = _victim(rng, f)
    del group[name]
    make(group, name)


DEFECTS = {}


def defect(fn):
    DEFECTS[fn.__name__] = fn
    return fn


@defect
def huge_chunked(rng, f, work):
    shape = rng.choice(HUGE)
    _replace(rng, f, lambda g, n: g.create_dataset(n, shape=shape, dtype="f4", chunks=True))


@defect
def huge_contiguous(rng, f, work):
    shape = rng.choice(HUGE)
    _replace(rng, f, lambda g, n: g.create_dataset(n, shape=shape, dtype="f8"))


@defect
def gzip_bomb(rng, f, work):
    rows = rng.choice([256, 2048])

    def make(g, n):
        ds = g.create_dataset(n, shape=(rows, 4096), dtype="f4", chunks=(64, 4096),
                              compression="gzip", compression_opts=9)  # fmt: skip
        ds[...] = 0.0

    _replace(rng, f, make)


@defect
def soft_link(rng, f, work):
    target = rng.choice(["/data", "/data/" + rng.choice(list(f["data"])), "/nowhere", "."])
    _replace(rng, f, lambda g, n: g.__setitem__(n, h5py.SoftLink(target)))


@defect
def soft_link_layer(rng, f, work):
    name = rng.choice(list(f["data"]))
    del f["data"][name]
    f["data"][name] = h5py.SoftLink(rng.choice(["/data", f"/data/{name}", "/"]))


@defect
def external_link(rng, f, work):
    other = work / "other.h5"
    with h5py.File(other, "w") as o:
        o["x"] = np.ones((2, 2), "f4")
    target = rng.choice([("/etc/passwd", "/"), (str(other), "/x"), (str(other), "/")])
    _replace(rng, f, lambda g, n: g.__setitem__(n, h5py.ExternalLink(*target)))


@defect
def external_storage(rng, f, work):
    def make(g, n):
        g.create_dataset(n, shape=(4,), dtype="f4", external=[("/etc/passwd", 0, 16)])

    _replace(rng, f, make)


@defect
def odd_dtype(rng, f, work):
    choices = [
        lambda g, n: g.create_dataset(n, data=np.bytes_(b"\xff\xfenot numbers")),
        lambda g, n: g.create_dataset(n, data=np.zeros(3, [("a", "f4"), ("b", "i4")])),
        lambda g, n: g.create_dataset(n, data=np.ones(4, bool)),
        lambda g, n: g.create_dataset(n, data=np.ones(4, ">f4")),
        lambda g, n: g.create_dataset(n, data=np.ones(4, "f2")),
        lambda g, n: g.create_dataset(n, data=np.ones(4, "i8")),
        lambda g, n: g.create_dataset(n, data=np.ones(4, "c8")),
        lambda g, n: g.create_dataset(n, data=[b"a", b"bb"], dtype=h5py.string_dtype()),
        lambda g, n: g.create_dataset(n, shape=(2,), dtype=h5py.ref_dtype),
        lambda g, n: g.create_dataset(n, data=np.ones((2, 3), "f4").view("V4")),
    ]
    _replace(rng, f, rng.choice(choices))


@defect
def odd_rank(rng, f, work):
    shape = rng.choice([(), (1,) * 32, (0,), (0, 5), (2, 0, 3)])
    _replace(rng, f, lambda g, n: g.create_dataset(n, shape=shape, dtype="f4"))


@defect
def odd_names(rng, f, work):
    group, name = _victim(rng, f)
    new = rng.choice(["01", "-1", "99999999999", "x", "1e3", "٣", " 1", str(len(group) + 5)])
    if new not in group:
        group.move(name, new)


@defect
def wrong_kind(rng, f, work):
    choice = rng.randrange(3)
    if choice == 0:
        del f["data"]
        f["data"] = np.ones(3, "f4")
    elif choice == 1:
        name = rng.choice(list(f["data"]))
        del f["data"][name]
        f["data"][name] = np.ones(3, "f4")
    else:
        group, name = _victim(rng, f)
        del group[name]
        group.create_group(name)


@defect
def hard_link_cycle(rng, f, work):
    group, _ = _victim(rng, f)
    group[str(len(group))] = f["data"]


@defect
def many_layers(rng, f, work):
    for i in range(rng.choice([50, 500])):
        f["data"].create_group(f"extra{i}")


@defect
def unknown_filter(rng, f, work):
    def make(g, n):
        # a registered-nowhere filter id, marked optional so h5py can write it
        g.create_dataset(n, data=np.ones((4, 4), "f4"), chunks=(2, 2),
                         compression=32999, allow_unknown_filter=True)  # fmt: skip

    _replace(rng, f, make)


def structural(rng: random.Random, layers: Layers, path: Path, work: Path) -> str:
    """Write ``layers`` to ``path`` with one random defect; returns the defect's name."""
    name = rng.choice(sorted(DEFECTS))
    f = _write(path, layers)
    try:
        DEFECTS[name](rng, f, work)
    finally:
        f.close()
    return name
