"""The prefetch thread with worker threads (runtime/data/pipeline.py): the same batches, byte
for byte, and the same reader states, whatever the number of workers; a resumed reader (in
process, and a training run killed with SIGKILL and resumed from its snapshot) reads the
batches the uninterrupted one reads; read plans; errors after the batches before them."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.prefetch import Prefetcher
from caffe2jax.runtime.data.records.datum import encoded_datum
from caffe2jax.runtime.data.records.db import Writer
from caffe2jax.runtime.data.shards import period_plan
from caffe2jax.runtime.data.sources import make_source, plain
from caffe2jax.runtime.data.transform.image import encode_image
from tests.cli_runner import run_cli

from .helpers import layer

RNG = np.random.default_rng(7)
TRANSFORM = "crop_size: 7 mirror: true mean_value: 100 mean_value: 110 mean_value: 120 scale: 0.5"


def jpeg_lmdb(path: Path, count: int = 13, size: int = 10) -> Path:
    """Encoded JPEG Datums (color, size × size), labels 0..count-1."""
    with Writer(path, "lmdb") as writer:
        for i in range(count):
            chw = RNG.integers(0, 256, (3, size, size), dtype=np.uint8)
            datum = encoded_datum(encode_image(chw, "jpg"), label=i)
            writer.put(f"{i:08d}_im{i}.jpg", datum.SerializeToString())
    return path


def image_list(folder: Path, count: int = 11) -> Path:
    """PNG files of several sizes (ImageData resizes them) and their list."""
    (folder / "imgs").mkdir()
    lines = []
    for i in range(count):
        h, w = 8 + i % 3, 9 + i % 4
        Image.fromarray(RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
            folder / "imgs" / f"im{i}.png"
        )
        lines.append(f"im{i}.png {i}")
    (folder / "list.txt").write_text("\n".join(lines) + "\n")
    return folder / "list.txt"


def window_file(folder: Path) -> Path:
    """Two images and a dozen foreground and background windows of them."""
    lines = []
    for index in range(2):
        Image.fromarray(RNG.integers(0, 256, (12, 14, 3), dtype=np.uint8)).save(
            folder / f"w{index}.png"
        )
        boxes = [(1 + k % 3, 0.6 + 0.1 * (k % 3), k, k, 6 + k, 5 + k) for k in range(4)]
        boxes += [(0, 0.1, k, 1, 9, 8 + k) for k in range(3)]
        lines += [f"# {index}", f"w{index}.png", "3", "12", "14", str(len(boxes))]
        lines += [" ".join(str(v) for v in box) for box in boxes]
    (folder / "windows.txt").write_text("\n".join(lines) + "\n")
    return folder / "windows.txt"


def layers(tmp_path: Path) -> dict[str, str]:
    db = jpeg_lmdb(tmp_path / "db")
    listed = image_list(tmp_path)
    windows = window_file(tmp_path)
    return {
        "WindowData": (f'name: "w" type: "WindowData" top: "data" top: "label" transform_param '
                       f'{{ {TRANSFORM} }} window_data_param {{ source: "{windows}" root_folder: '
                       f'"{tmp_path}/" batch_size: 5 context_pad: 1 scale: 0.5 }}'),
        "Data": (f'name: "d" type: "Data" top: "data" top: "label" transform_param {{ '
                 f'{TRANSFORM} }} data_param {{ source: "{db}" batch_size: 4 backend: LMDB }}'),
        "ImageData": (f'name: "i" type: "ImageData" top: "data" top: "label" transform_param '
                      f'{{ {TRANSFORM} }} image_data_param {{ source: "{listed}" root_folder: '
                      f'"{tmp_path}/imgs/" batch_size: 3 shuffle: true new_height: 9 '
                      "new_width: 8 }"),
    }  # fmt: skip


def serial(text: str, batches: int, seed: int = 3) -> tuple[list, list]:
    """Every batch (and the state after it) of the reader alone, in this thread."""
    source = make_source(layer(text), "TRAIN", seed=seed)
    out, states = [], []
    for _ in range(batches):
        out.append(source.next_batch())
        states.append(plain(source.get_state()))
    source.close()
    return out, states


def same(got: list, want: list) -> bool:
    return all(np.asarray(g).tobytes() == w.tobytes() for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("kind", ["Data", "ImageData", "WindowData"])
@pytest.mark.parametrize("workers, to_device", [(0, True), (1, True), (3, True), (2, False)])
def test_batches_are_the_same_bytes_for_any_number_of_workers(tmp_path, kind, workers, to_device):
    """12 batches (past two wrap-arounds and a reshuffle) with random crops and mirrors:
    the same bytes and reader states as the reader alone, from the same seed."""
    text = layers(tmp_path)[kind]
    want, states = serial(text, 12)
    source = make_source(layer(text), "TRAIN", seed=3)
    with Prefetcher(source, 2, to_device=to_device, workers=workers) as reader:
        for batch, state in zip(want, states, strict=True):
            assert same(reader.next_batch(), batch)
            assert plain(reader.get_state()) == state
        assert reader.stats.batches >= (12 if workers else 0)


@pytest.mark.parametrize("kind", ["Data", "ImageData", "WindowData"])
def test_a_resumed_reader_reads_the_same_bytes(tmp_path, kind):
    text = layers(tmp_path)[kind]
    want, states = serial(text, 10)
    fresh = Prefetcher(make_source(layer(text), "TRAIN", seed=99), 3, workers=2)
    fresh.set_state(states[5])  # another seed: the state carries the draws' key
    try:
        for batch in want[6:]:
            assert same(fresh.next_batch(), batch)
    finally:
        fresh.close()


def test_read_plan_with_workers_skips_other_processes_batches(tmp_path):
    """A process owning slots 1 and 3 of 4 reads batches 1 and 3 of each round (the others
    skipped undecoded) with workers: the one-process batches of those slots, and the state
    after a round is the one-process state."""
    import jax

    text = layers(tmp_path)["Data"]
    want, states = serial(text, 12)
    device = jax.devices()[0]
    plan = period_plan(4, 4, [1, 3], (device,) * 4)
    source = make_source(layer(text), "TRAIN", seed=3)
    decoded = []
    original = source._decode
    source._decode = lambda *a: decoded.append(1) or original(*a)
    with Prefetcher(source, 2, plan=plan, workers=2) as reader:
        for round_ in range(3):
            for slot in (1, 3):
                tag, batch = reader.next_slot()
                assert tag == (slot, slot)
                assert same(batch, want[4 * round_ + slot])
            assert plain(reader.get_state()) == states[4 * round_ + 3]
    assert len(decoded) <= 4 * 2 * (3 + 2)  # only this process's batches (and read-ahead)


def test_a_bad_record_fails_after_the_batches_before_it(tmp_path):
    db = tmp_path / "db"
    with Writer(db, "lmdb") as writer:
        for i in range(8):
            chw = RNG.integers(0, 256, (3, 10, 10), dtype=np.uint8)
            value = encoded_datum(encode_image(chw, "png"), i).SerializeToString()
            writer.put(f"{i:08d}", b"\xff\xff" if i == 5 else value)
    text = (f'name: "d" type: "Data" top: "data" top: "label" data_param {{ source: "{db}" '
            "batch_size: 4 backend: LMDB }")  # fmt: skip
    with Prefetcher(make_source(layer(text), "TRAIN", seed=0), 2, workers=2) as reader:
        assert reader.next_batch()[1].tolist() == [0, 1, 2, 3]
        with pytest.raises(DataError, match=r"db: record '00000005': corrupt Datum"):
            reader.next_batch()


NET = """name: "tiny"
layer {{ name: "data" type: "Data" top: "data" top: "label"
  transform_param {{ {transform} }}
  data_param {{ source: "{db}" batch_size: 4 backend: LMDB }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: 13 weight_filler {{ type: "gaussian" std: 0.01 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""
SOLVER = """net: "net.prototxt"
base_lr: 0.05
lr_policy: "fixed"
momentum: 0.9
max_iter: 40
display: 2
snapshot: 10
snapshot_prefix: "tiny"
random_seed: 11
"""


def _workdir(folder: Path, db: Path) -> Path:
    folder.mkdir()
    (folder / "net.prototxt").write_text(NET.format(transform=TRANSFORM, db=db))
    (folder / "solver.prototxt").write_text(SOLVER)
    return folder


def test_kill_9_and_resume_trains_on_the_same_bytes(tmp_path):
    """A run with 2 data workers killed with SIGKILL after its second snapshot and resumed
    from it (``--snapshot``) ends with the weights of an uninterrupted run, byte for byte:
    every batch after the resume (random crops and mirrors of JPEG records, past several
    wrap-arounds) is the one the uninterrupted run read."""
    db = jpeg_lmdb(tmp_path / "db")
    args = ("train", "--solver", "solver.prototxt", "--progress", "log", "--data_workers", "2")
    reference = _workdir(tmp_path / "reference", db)
    done = run_cli(*args, cwd=reference)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "input wait = " in done.stderr  # the input-bound time, after each display line
    work = _workdir(tmp_path / "killed", db)
    proc = subprocess.Popen([sys.executable, "-m", "caffe2jax", *args], cwd=work, text=True,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)  # fmt: skip
    killed = False
    for line in proc.stderr:
        match = re.search(r"Iteration (\d+) \(", line)
        if match and int(match.group(1)) >= 26:
            proc.send_signal(signal.SIGKILL)
            killed = True
            break
    proc.wait()
    assert killed and not (work / "tiny_iter_40.caffemodel").exists()
    resumed = run_cli(*args, "--snapshot", "tiny_iter_20.solverstate", cwd=work)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    for name in ("tiny_iter_30.caffemodel", "tiny_iter_40.caffemodel", "tiny_iter_40.solverstate"):
        assert (work / name).read_bytes() == (reference / name).read_bytes(), name
