"""The package on a platform without POSIX's ``fcntl`` and ``resource`` (Windows) and where
psutil reads no rlimits (macOS, Windows): it imports, the data pipeline reads and decodes an
LMDB, a net compiles and its loss and gradients run under jit; database leases and the rlimit
check are off, each said once in the log (runtime/data/records/watch.py,
runtime/host/memory.py). Run in a subprocess whose ``import fcntl``/``import resource`` fail
from the moment before caffe2jax is imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import logging, sys
    # what the libraries below import on every OS is imported first; from here on an
    # `import fcntl` / `import resource` fails as it does on Windows
    import cv2, h5py, jax, lmdb, numpy as np, psutil, PIL.Image  # noqa: F401
    for name in ("fcntl", "resource"):
        sys.modules[name] = None
    del psutil.Process.rlimit  # psutil on macOS and Windows has none
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    import caffe2jax
    from caffe2jax.runtime.data.records.datum import encoded_datum
    from caffe2jax.runtime.data.records.db import Writer
    from caffe2jax.runtime.data.sources import make_source
    from caffe2jax.runtime.data.transform.image import encode_image
    from caffe2jax.runtime.host.memory import memory_budget
    from google.protobuf import text_format
    from caffe2jax.frontend import caffe_pb2

    folder = sys.argv[1]
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (3, 8, 8), dtype=np.uint8) for _ in range(4)]
    with Writer(folder + "/db", "lmdb") as writer:
        for i, chw in enumerate(images):
            writer.put(f"{i:08d}", encoded_datum(encode_image(chw, "png"), i).SerializeToString())
    layer = text_format.Parse(
        f'name: "d" type: "Data" top: "data" top: "label" data_param {{ source: '
        f'"{folder}/db" batch_size: 4 backend: LMDB }}', caffe_pb2.LayerParameter())
    for _ in range(2):  # a wrap-around: the database is checked again, no lease held
        data, label = make_source(layer, "TRAIN").next_batch()
    assert np.array_equal(data, np.stack(images).astype(np.float32)), "pixels"
    assert label.tolist() == [0, 1, 2, 3]
    assert memory_budget().bytes > 0

    net = folder + "/net.prototxt"
    open(net, "w").write(
        'input: "data" input_shape { dim: 4 dim: 3 dim: 8 dim: 8 } '
        'input: "label" input_shape { dim: 4 } '
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
        '  inner_product_param { num_output: 4 weight_filler { type: "xavier" } } } '
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }')
    model = caffe2jax.compile(net, phase="TRAIN")
    params, state = model.init(jax.random.key(0))
    inputs = {"data": data / 255, "label": label}
    loss, grads = jax.jit(jax.value_and_grad(lambda p: model.loss(p, state, inputs)[0]))(params)
    assert np.isfinite(float(loss)) and grads["ip"][0].shape == (4, 192)
    print("portable ok", float(loss))
    """
)


def test_imports_reads_data_and_compiles_without_fcntl_and_resource(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "portable ok" in run.stdout
    said = run.stderr.splitlines()
    leases = [line for line in said if "database leases: not on this platform" in line]
    rlimits = [line for line in said if "reports no RLIMIT_AS/RLIMIT_DATA" in line]
    assert len(leases) == 1 and len(rlimits) == 1, run.stderr[-3000:]
