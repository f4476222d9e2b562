"""Sharded reading on several devices, run in a process whose JAX sees 4 CPU devices.

Started by tests/runtime/parallel/test_shards.py with
XLA_FLAGS=--xla_force_host_platform_device_count=4; prints one JSON object. A process of a
multi-host run is simulated by giving the read round the local slots of one process (1 and
3 of 4: not contiguous, so a shift between slots would show).
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import h5py
import jax
import numpy as np
from google.protobuf import text_format
from PIL import Image

from caffe2jax.frontend import caffe_pb2
from caffe2jax.runtime.data import Prefetcher, make_source
from caffe2jax.runtime.data.readers.memory_data import MemoryData
from caffe2jax.runtime.data.shards import period_plan
from caffe2jax.runtime.data.sources import plain
from caffe2jax.runtime.parallel import data_parallel
from caffe2jax.runtime.parallel.devices import make_mesh
from tests.runtime.parallel.devices_worker import LMDB, solver_file

ROUNDS, LOCAL, SEED = 3, [1, 3], 5
TOPS = ("data", "label")


def layer(text: str) -> caffe_pb2.LayerParameter:
    return text_format.Parse(text, caffe_pb2.LayerParameter())


def layers(folder: Path) -> dict[str, caffe_pb2.LayerParameter]:
    """One layer of each kind, with random transforms and shuffles, so that a skip that
    left a random state behind would change the batches after it."""
    lines = []
    for i in range(7):
        pixels = np.zeros((5, 6, 3), np.uint8) + np.array([i, 40 + i, 90 + 7 * i], np.uint8)
        pixels[0, 0] = 255 - i  # a corner, so mirroring and cropping show
        Image.fromarray(pixels).save(folder / f"im{i}.png")
        lines.append(f"im{i}.png {i}")
    (folder / "list.txt").write_text("\n".join(lines) + "\n")
    rng = np.random.default_rng(0)
    for name, rows in (("a.h5", 5), ("b.h5", 8)):
        with h5py.File(folder / name, "w") as f:
            f["data"] = rng.random((rows, 2, 3), dtype=np.float32)
            f["label"] = rng.integers(0, 10, rows).astype(np.float32)
    (folder / "h5.txt").write_text(f"{folder / 'a.h5'}\n{folder / 'b.h5'}\n")
    return {
        "Data": layer(
            f'name: "d" type: "Data" top: "data" top: "label" transform_param {{ mirror: true '
            f'crop_size: 6 scale: 0.0625 }} data_param {{ source: "{LMDB}" batch_size: 5 '
            "backend: LMDB }"
        ),
        "ImageData": layer(
            f'name: "i" type: "ImageData" top: "data" top: "label" transform_param {{ '
            f'mirror: true crop_size: 4 }} image_data_param {{ source: "{folder}/list.txt" '
            f'root_folder: "{folder}/" batch_size: 3 shuffle: true }}'
        ),
        "HDF5Data": layer(
            f'name: "h" type: "HDF5Data" top: "data" top: "label" hdf5_data_param {{ '
            f'source: "{folder}/h5.txt" batch_size: 3 shuffle: true }}'
        ),
    }


class Transforms:
    """A DataTransformer that counts the batches it transforms."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0

    def __call__(self, *args):
        self.calls += 1
        return self.inner(*args)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def counted(source) -> dict:
    """The source's reads and skips in order, and the items it decoded (Datum parses,
    image files) and the batches it transformed."""
    counts: dict = {"log": [], "items": 0}

    def wrap(name: str, action) -> None:
        inner = getattr(source, name)

        def call(*args, **kwargs):
            action()
            return inner(*args, **kwargs)

        setattr(source, name, call)

    wrap("next_batch", lambda: counts["log"].append(1))
    wrap("skip", lambda: counts["log"].append(0))
    for name in ("_decode", "_read"):
        if hasattr(source, name):
            wrap(name, lambda: counts.__setitem__("items", counts["items"] + 1))
    if hasattr(source, "transformer"):
        source.transformer = counts["transformer"] = Transforms(source.transformer)
    return counts


def reference(make, count: int, rounds: int) -> tuple[list, list]:
    """What one process reading everything hands out: every batch and the reader state
    after each round of ``count`` batches."""
    source = make()
    out, states = [], []
    for k in range(count * rounds):
        out.append([np.asarray(x) for x in source.next_batch()])
        if k % count == count - 1:
            states.append(plain(source.get_state()))
    return out, states


def feeder_of(source) -> SimpleNamespace:
    return SimpleNamespace(sources={"d": source}, layers={"d": SimpleNamespace(top_names=TOPS)})


def sharded(make, mesh, local: list[int], rounds: int, count: int = 4, resume=None,
            late: bool = False) -> dict:  # fmt: skip
    """Rounds read as the process owning ``local`` reads them, against the reference;
    ``resume``: from the state after that many rounds; ``late``: the plan given to a
    prefetcher that has already read ahead without one."""
    ref, states = reference(make, count, rounds)
    source = make()
    counts = counted(source)
    plan = period_plan(count, 4, local, tuple(mesh.devices.flat))
    memory = isinstance(source, MemoryData)
    reader = source if memory else Prefetcher(source, 2, plan=None if late else plan)
    if late:
        while not reader._queue.full():
            time.sleep(0.01)
        reader.shard(plan)
    start = 0 if resume is None else resume
    if resume is not None:
        reader.set_state(states[resume - 1])
        counts.update(log=[], items=0)
    equal, placed = True, True
    for r in range(start, rounds):
        fed = data_parallel.read_round(feeder_of(reader), plan, 0, count, mesh)
        for slot, batch in zip(local, fed, strict=True):
            want = ref[count * r + min(slot, count - 1)]
            equal &= all(np.array_equal(np.asarray(batch[t]), w) for t, w in zip(TOPS, want))
            if not memory:
                placed &= batch["data"].devices() == {mesh.devices.flat[slot]}
    state = plain(reader.get_state()) == states[-1]
    if not memory:
        reader.close()
    log = counts["log"]
    transformer = counts.get("transformer")
    return {
        "equal": bool(equal), "placed": bool(placed), "state": state,
        # every read and skip where the plan has it, round after round
        "follows_plan": log == [int(bool(plan.targets[i % count])) for i in range(len(log))],
        "reads": sum(log), "skips": len(log) - sum(log),
        "items_per_read": counts["items"] / max(1, sum(log)),
        "transforms": None if transformer is None else transformer.calls,
    }  # fmt: skip


def sources_case(folder: Path, mesh) -> dict:
    """Each reader on simulated process 1 of 2 (slots 1, 3): only its batches decoded,
    each equal to the one-process batch of its slot, the state that of a full round."""
    out = {}
    for kind, param in layers(folder).items():

        def make(param=param):
            return make_source(param, "TRAIN", base_dir=folder, seed=SEED)

        out[kind] = sharded(make, mesh, LOCAL, ROUNDS)
        out[f"{kind}_resume"] = sharded(make, mesh, LOCAL, ROUNDS, resume=1)
        out[f"{kind}_late"] = sharded(make, mesh, LOCAL, ROUNDS, late=True)
    data = np.arange(12 * 3 * 2 * 2, dtype=np.float32).reshape(12, 3, 2, 2)

    def memory() -> MemoryData:
        param = layer('name: "m" type: "MemoryData" top: "data" top: "label" memory_data_param '
                      "{ batch_size: 2 channels: 3 height: 2 width: 2 }")  # fmt: skip
        source = MemoryData(SimpleNamespace(param=param, name="m"))
        source.reset(data, np.arange(12, dtype=np.float32))
        return source

    out["MemoryData"] = sharded(memory, mesh, LOCAL, ROUNDS)
    return out


def padding_case(folder: Path, mesh, local: list[int]) -> dict:
    """A test pass's short round (3 batches on 4 devices): the owner of slots 2 and 3 reads
    only batch 2 (its own, and the repeat slot 3 holds); the owner of 0 and 1 skips it."""
    param = layers(folder)["Data"]

    def make():
        return make_source(param, "TEST", base_dir=folder, seed=SEED)

    return sharded(make, mesh, local, 2, count=3)


def placement_case(folder: Path) -> dict:
    """SolverLoop on 4 devices: each device's slice of the assembled input was put on that
    device by the prefetch thread; the main thread copies nothing."""
    from caffe2jax.runtime.train.loop import SolverLoop

    real, calls = jax.device_put, []

    def recording(x, *args, **kwargs):
        out = real(x, *args, **kwargs)
        pointers = [a.unsafe_buffer_pointer() for a in jax.tree.leaves(out)
                    if isinstance(a, jax.Array) and len(a.devices()) == 1]  # fmt: skip
        calls.append((threading.current_thread().name, pointers))
        return out

    jax.device_put = recording
    loop = SolverLoop(solver_file(folder, 16, "SGD"), devices="all")
    try:
        mark = len(calls)
        inputs = loop._passes(None)[0]
        main = [name for name, _ in calls[mark:] if name == "MainThread"]
        threaded = {p for name, ps in calls if name.startswith("prefetch") for p in ps}
        devices = list(loop.mesh.devices.flat)
        on_own, from_thread = True, True
        for array in inputs.values():
            for shard in array.addressable_shards:
                slot = shard.index[0].start // (array.shape[0] // 4)
                on_own &= shard.device == devices[slot]
                from_thread &= shard.data.unsafe_buffer_pointer() in threaded
        source = make_source(loop.train.feeder.layers["data"].param, "TRAIN", seed=loop.seed)
        want = np.concatenate([source.next_batch()[0] for _ in range(4)])
        source.close()
        equal = bool(np.array_equal(np.asarray(inputs["data"]), want))
    finally:
        jax.device_put = real
        loop.close()
    return {"main_thread_puts": len(main), "on_own_device": bool(on_own),
            "from_prefetch_thread": bool(from_thread), "equal": equal}  # fmt: skip


def main() -> None:
    mesh = make_mesh("all")
    out = {"devices": jax.device_count()}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        out["placement"] = placement_case(folder)
        data_parallel.local_slots = lambda mesh: LOCAL  # simulated process 1 of 2
        out["sources"] = sources_case(folder, mesh)
        out["padding"] = {}
        for local in ([2, 3], [0, 1]):
            data_parallel.local_slots = lambda mesh, local=local: local
            out["padding"][str(local)] = padding_case(folder, mesh, local)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
