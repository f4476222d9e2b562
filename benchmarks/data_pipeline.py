"""The data pipeline's img/s, cores used and per-stage times, side by side with PyTorch's
DataLoader and with the decode+transform limit of the machine, in one run.

Data: 5,000 JPEG Datums at 256×256 (smooth random images with noise, ~29 kB each, quality
90), written by ``caffe2jax convert_imageset --encoded``; read with Caffe's ImageNet
transform (crop 227, mirror, mean_value 104/117/123) into float32 N×C×H×W batches of 256.
Every row decodes with libjpeg-turbo and does the same per-image work:

* caffe2jax training path: the Feeder's prefetcher (Data layer, ``workers`` threads, batches
  put on the device), ``workers`` 0 is the one prefetch thread caffe2jax had before;
* caffe2jax pycaffe ``Net.forward`` on a Data-only net, and the ImageData layer over the
  same JPEG files;
* PyTorch's DataLoader (worker processes, forkserver) over the same LMDB, decoding with
  Pillow or with torchvision's ``decode_jpeg``, crop/mirror/mean in torch per image;
* the limit: one thread (one process per core for N) decoding with cv2 and transforming in
  numpy, nothing else.

Rows alternate over ``--rounds`` rounds; the table shows the medians. "cores used" is the
CPU time of the process and its children over the wall time. Run:
``python benchmarks/data_pipeline.py`` (``--data DIR`` keeps the data set between runs).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import lmdb
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from caffe2jax.frontend import caffe_pb2  # noqa: E402

BATCH, CROP, SIZE = 256, 227, 256
MEAN = (104.0, 117.0, 123.0)
TRANSFORM = "mirror: true crop_size: 227 mean_value: 104 mean_value: 117 mean_value: 123"


def make_dataset(folder: Path, count: int) -> tuple[Path, Path]:
    """JPEG files, their list, and the LMDB convert_imageset makes of them (reused)."""
    from PIL import Image

    images, listfile, db = folder / "jpg", folder / "list.txt", folder / "lmdb"
    if db.exists():
        return listfile, db
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    lines = []
    for i in range(count):
        small = Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
        big = np.asarray(small.resize((SIZE, SIZE), Image.BICUBIC), dtype=np.int16)
        big = np.clip(big + rng.integers(-20, 21, big.shape), 0, 255).astype(np.uint8)
        Image.fromarray(big).save(images / f"{i:05d}.jpg", quality=90)
        lines.append(f"{i:05d}.jpg {i % 1000}")
    listfile.write_text("\n".join(lines) + "\n")
    from caffe2jax.cli.main import main

    main(["convert_imageset", "--encoded", f"{images}/", str(listfile), str(db)])
    return listfile, db


def cpu_seconds() -> float:
    """User + system CPU time of this process and its live children."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def measure(take: Callable[[], object], batches: int, warmup: int = 2) -> dict:
    """img/s and cores used over ``batches`` batches after ``warmup``."""
    for _ in range(warmup):
        take()
    cpu, start = cpu_seconds(), time.perf_counter()
    for _ in range(batches):
        take()
    wall, used = time.perf_counter() - start, cpu_seconds() - cpu
    return {"img/s": batches * BATCH / wall, "cores": used / wall}


def _layer_text(kind: str, source: Path, folder: Path) -> str:
    if kind == "Data":
        param = f'data_param {{ source: "{source}" batch_size: {BATCH} backend: LMDB }}'
    else:
        param = (f'image_data_param {{ source: "{source}" root_folder: "{folder}/jpg/" '
                 f"batch_size: {BATCH} }}")  # fmt: skip
    return (f'name: "data" type: "{kind}" top: "data" top: "label" '
            f"transform_param {{ {TRANSFORM} }} {param}")  # fmt: skip


def caffe2jax_feeder(kind: str, source: Path, folder: Path, workers: int, batches: int) -> dict:
    """The training path: a Feeder over a Data-only net, batches put on the device."""
    import jax

    from caffe2jax.frontend.pipeline import load_net
    from caffe2jax.runtime.data.feeding import Feeder

    net_file = folder / f"{kind}.prototxt"
    net_file.write_text(f"name: 'bench'\nlayer {{ {_layer_text(kind, source, folder)} }}\n")
    feeder = Feeder(load_net(net_file, "TRAIN"), folder, seed=0, workers=workers)
    try:
        result = measure(lambda: jax.block_until_ready(feeder.next_batches()), batches)
        stats = feeder.stats()
    finally:
        feeder.close()
    per = 1e3 / max(stats["batches"], 1)
    result["stages"] = {k[:-2]: v * per for k, v in stats.items() if k.endswith("_s")}
    return result


def caffe2jax_pycaffe(source: Path, folder: Path, workers: int, batches: int) -> dict:
    """pycaffe's ``Net.forward`` on a Data-only net."""
    import caffe2jax
    from caffe2jax.runtime.data.workers import set_default_workers

    net_file = folder / "pycaffe.prototxt"
    net_file.write_text(f"name: 'bench'\nlayer {{ {_layer_text('Data', source, folder)} }}\n")
    set_default_workers(workers)
    try:
        net = caffe2jax.Net(str(net_file), caffe2jax.TRAIN)
        result = measure(lambda: np.asarray(net.forward()["data"]), batches)
        net.close()
    finally:
        set_default_workers(None)
    return result


class LmdbDataset:
    """The LMDB of encoded Datums as a PyTorch map-style dataset, transformed per image as
    the Data layer does (random crop, mirror, mean per channel; BGR, float32 C×H×W)."""

    def __init__(self, path: Path, decoder: str) -> None:
        self.path, self.decoder, self.txn = str(path), decoder, None
        with lmdb.open(self.path, readonly=True, lock=False) as env, env.begin() as txn:
            self.keys = [key for key, _ in txn.cursor()]

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int):
        import torch

        if self.txn is None:
            self.txn = lmdb.open(self.path, readonly=True, lock=False).begin()
        datum = caffe_pb2.Datum.FromString(self.txn.get(self.keys[index]))
        if self.decoder == "pil":
            from PIL import Image

            rgb = np.asarray(Image.open(io.BytesIO(datum.data)).convert("RGB"))
            chw = torch.from_numpy(rgb).permute(2, 0, 1)
        else:
            from torchvision.io import decode_jpeg

            chw = decode_jpeg(torch.frombuffer(bytearray(datum.data), dtype=torch.uint8))
        h, w = (int(v) for v in torch.randint(0, SIZE - CROP + 1, (2,)))
        crop = chw[:, h : h + CROP, w : w + CROP].flip(0)  # RGB -> BGR
        if torch.randint(0, 2, ()).item():
            crop = crop.flip(2)
        mean = torch.tensor(MEAN, dtype=torch.float32)[:, None, None]
        return crop.float() - mean, datum.label


def pytorch_loader(db: Path, decoder: str, workers: int, batches: int) -> dict:
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    loader = DataLoader(LmdbDataset(db, decoder), batch_size=BATCH, num_workers=workers,
                        drop_last=True, persistent_workers=True, prefetch_factor=2,
                        multiprocessing_context="forkserver")  # fmt: skip
    batches_of = iter(loader)
    result = measure(lambda: next(batches_of), batches)

    return result


def _limit_part(db: str, start: int, count: int) -> int:
    """Decode (cv2) and transform (numpy) ``count`` records from ``start``: one thread."""
    import cv2

    cv2.setNumThreads(1)
    mean = np.array(MEAN, np.float32)[:, None, None]
    out = np.empty((BATCH, 3, CROP, CROP), np.float32)
    rng = np.random.default_rng(start)
    with lmdb.open(db, readonly=True, lock=False) as env, env.begin() as txn:
        total = txn.stat()["entries"]
        keys = [k for k, _ in zip(txn.cursor().iternext(values=False), range(total))]
        values = [txn.get(keys[(start + i) % total]) for i in range(count)]
    for i, value in enumerate(values):  # LMDB reads counted, as the pipeline's plan stage
        datum = caffe_pb2.Datum.FromString(value)
        hwc = cv2.imdecode(np.frombuffer(datum.data, np.uint8), cv2.IMREAD_COLOR)
        h, w = rng.integers(0, SIZE - CROP + 1, 2)
        view = hwc[h : h + CROP, w : w + CROP].transpose(2, 0, 1)
        np.subtract(view[:, :, ::-1] if rng.integers(2) else view, mean, out=out[i % BATCH])
    return count


def decode_limit(db: Path, cores: int, images: int) -> dict:
    """The N-core limit: N processes each decoding and transforming its share."""
    share = images // cores
    with ProcessPoolExecutor(cores) as pool:
        list(pool.map(_limit_part, [str(db)] * cores, range(cores), [8] * cores))  # warm up
        cpu, start = cpu_seconds(), time.perf_counter()
        starts = [k * share for k in range(cores)]
        done = sum(pool.map(_limit_part, [str(db)] * cores, starts, [share] * cores))
        wall = time.perf_counter() - start
        used = cpu_seconds() - cpu
    return {"img/s": done / wall, "cores": used / wall}


def _torchvision_available() -> str | None:
    try:
        import torchvision.io  # noqa: F401
    except Exception as err:  # an ImportError, or a torchvision built for another torch
        return f"{type(err).__name__}: {str(err)[:80]}"
    return None


def rows_of(args: argparse.Namespace, listfile: Path, db: Path, folder: Path) -> list:
    """(label, workers, thunk) for every row of the table."""
    rows, n = [], args.batches
    for w in args.workers:
        rows += [
            ("caffe2jax training path (Feeder, Data)", w,
             lambda w=w: caffe2jax_feeder("Data", db, folder, w, n)),
            ("caffe2jax pycaffe Net.forward, Data-only net", w,
             lambda w=w: caffe2jax_pycaffe(db, folder, w, n)),
            ("caffe2jax ImageData", w,
             lambda w=w: caffe2jax_feeder("ImageData", listfile, folder, w, n)),
            ("PyTorch DataLoader, PIL decode", w, lambda w=w: pytorch_loader(db, "pil", w, n)),
        ]  # fmt: skip
        if args.torchvision is None:
            rows.append(("PyTorch DataLoader, torchvision decode", w,
                         lambda w=w: pytorch_loader(db, "torchvision", w, n)))  # fmt: skip
        rows.append(("limit: cv2 decode + numpy transform, one process per core", w,
                     lambda w=w: decode_limit(db, w, n * BATCH)))  # fmt: skip
    rows.insert(0, ("caffe2jax training path, one prefetch thread (before)", 0,
                    lambda: caffe2jax_feeder("Data", db, folder, 0, args.batches)))  # fmt: skip
    return rows


def report(rows: list, results: dict, args: argparse.Namespace) -> None:
    print(f"\nData pipeline, {len(os.sched_getaffinity(0))} cores, batch {BATCH}, "
          f"medians of {args.rounds} rounds, {args.batches} batches each "
          "(noisy: the machine is shared unless said otherwise)\n")  # fmt: skip
    print("| path | workers | img/s | cores used | img per CPU-second |")
    print("|---|---|---|---|---|")
    med = {}
    for label, w, _ in rows:
        runs = results[(label, w)]
        rate = statistics.median(r["img/s"] for r in runs)
        cores = statistics.median(r["cores"] for r in runs)
        med[(label, w)] = rate
        print(f"| {label} | {w} | {rate:,.0f} | {cores:.2f} | {rate / max(cores, 1e-9):,.0f} |")
    if args.torchvision is not None:
        print(f"\ntorchvision's decoder could not be used here ({args.torchvision}).")
    print("\n| workers | caffe2jax ÷ best PyTorch loader | caffe2jax ÷ N-core limit |")
    print("|---|---|---|")
    for w in args.workers:
        ours = med[("caffe2jax training path (Feeder, Data)", w)]
        torch = max(v for (label, k), v in med.items() if k == w and "PyTorch" in label)
        limit = med[("limit: cv2 decode + numpy transform, one process per core", w)]
        print(f"| {w} | {ours / torch:.2f}× | {100 * ours / limit:.0f} % |")
    print("\nPer-stage milliseconds per batch, caffe2jax training path (decode and transform"
          " summed over the workers; waited: the consumer's wait for the batch)\n")  # fmt: skip
    print("| workers | plan | decode | transform | put on device | waited |")
    print("|---|---|---|---|---|---|")
    for w in args.workers:
        s = results[("caffe2jax training path (Feeder, Data)", w)][-1]["stages"]
        print(f"| {w} | " + " | ".join(f"{s[k]:.1f}" for k in
              ("plan", "decode", "transform", "put", "waited")) + " |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="folder for the data set (kept)")
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--workers", default="1,2", help="worker counts, e.g. 1,2,8")
    parser.add_argument("--batches", type=int, default=12, help="timed batches per row")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    args.workers = [int(w) for w in args.workers.split(",")]
    args.torchvision = _torchvision_available()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.data or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        listfile, db = make_dataset(folder, args.images)
        rows = rows_of(args, listfile, db, folder)
        results: dict = {}
        for r in range(args.rounds):
            for label, w, run in rows:
                results.setdefault((label, w), []).append(run())
                rate = results[(label, w)][-1]["img/s"]
                print(f"round {r + 1}: {label}, {w} workers: {rate:,.0f} img/s", file=sys.stderr)
        report(rows, results, args)


if __name__ == "__main__":
    main()
