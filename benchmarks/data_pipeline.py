"""Images/s of the Data layer pipeline vs the train step's consumption rate.

1. The shipped digits example: its TRAIN Data layer (LMDB of raw 8×8 Datums, scale), through
   the prefetching source, vs the digits LeNet's compiled train step.
2. A synthetic 224×224 JPEG LMDB (random images, written with our own Writer), read with
   Caffe's ImageNet transform (crop 227 of 256, mirror, mean values), vs CaffeNet's compiled
   train step at batch 32.
"pipeline/step" above 1 means the step never waits for data.
"""

from __future__ import annotations

import io
import platform
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from google.protobuf import text_format
from PIL import Image

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.runtime.data import Prefetcher, Writer, encoded_datum, make_source

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples/digits/lenet_train_test.prototxt"
CAFFENET = ROOT.parent / "shared/caffe/models/models/bvlc_reference_caffenet/train_val.prototxt"


def pipeline_rate(layer: caffe_pb2.LayerParameter, base_dir: Path, batches: int) -> float:
    """Images/s delivered by the prefetching source (device transfer included)."""
    source = Prefetcher(make_source(layer, "TRAIN", base_dir=base_dir, seed=0), 4, to_device=True)
    batch = source.top_shapes()[0][0]
    jax.block_until_ready(source.next_batch())  # the thread is up and the queue fills
    start = time.perf_counter()
    for _ in range(batches):
        out = source.next_batch()
    jax.block_until_ready(out)
    rate = batches * batch / (time.perf_counter() - start)
    source.close()
    return rate


def step_rate(prototxt, shapes: dict, steps: int) -> float:
    """Images/s the compiled train step consumes (synthetic batches, no data pipeline)."""
    from caffe2jax.lowering.model import Model
    from caffe2jax.runtime.train.step import Trainer

    model = Model(load_net(prototxt, "TRAIN"), shapes)
    params, state = model.init(jax.random.key(0))
    solver = caffe_pb2.SolverParameter(base_lr=0.001, momentum=0.9, lr_policy="fixed")
    trainer = Trainer(model, solver, params, state)
    opt = trainer.init(params, state)
    rng = np.random.default_rng(0)
    batch = {n: rng.random(s).astype(np.float32) for n, s in shapes.items()}
    batch["label"] = np.zeros(shapes["label"], np.float32)
    key = jax.random.key(0)
    params, state, opt, loss, _, _ = trainer.step(params, state, opt, [batch], key, 0)
    jax.block_until_ready(loss)
    start = time.perf_counter()
    for i in range(steps):
        params, state, opt, loss, _, _ = trainer.step(params, state, opt, [batch], key, i)
    jax.block_until_ready(loss)
    return steps * shapes["label"][0] / (time.perf_counter() - start)


def data_layer(prototxt: Path) -> caffe_pb2.LayerParameter:
    net = load_net(prototxt, "TRAIN")
    return next(layer.param for layer in net.layers if layer.type == "Data")


def make_jpeg_lmdb(path: Path, count: int) -> None:
    rng = np.random.default_rng(0)
    with Writer(path, "lmdb") as writer:
        for i in range(count):
            pixels = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
            datum = encoded_datum(buffer.getvalue(), label=i % 1000)
            writer.put(f"{i:08d}", datum.SerializeToString())


def main() -> None:
    print(f"Data pipeline vs train step, {platform.machine()}, {jax.devices()[0].device_kind}")
    digits = data_layer(DIGITS)
    fed = pipeline_rate(digits, DIGITS.parent, 200)
    used = step_rate(DIGITS, {"data": (64, 1, 8, 8), "label": (64,)}, 100)
    print(f"  digits (8x8 raw, batch 64)    pipeline {fed:9.0f} img/s   train step "
          f"{used:8.0f} img/s   pipeline/step {fed / used:6.1f}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "jpeg_lmdb"
        make_jpeg_lmdb(db, 256)
        layer = caffe_pb2.LayerParameter()
        text_format.Parse(
            f"""name: "data" type: "Data" top: "data" top: "label"
            transform_param {{ mirror: true crop_size: 227
                               mean_value: 104 mean_value: 117 mean_value: 123 }}
            data_param {{ source: "{db}" batch_size: 32 backend: LMDB }}""",
            layer,
        )
        fed = pipeline_rate(layer, Path(tmp), 24)
    used = step_rate(CAFFENET, {"data": (32, 3, 227, 227), "label": (32,)}, 3)
    print(f"  224x224 JPEG (CaffeNet, b 32) pipeline {fed:9.0f} img/s   train step "
          f"{used:8.0f} img/s   pipeline/step {fed / used:6.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
