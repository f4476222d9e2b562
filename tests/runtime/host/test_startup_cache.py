"""The start-up cache (runtime/host/startup_cache.py): a second build of the same net reads
its top shapes instead of tracing each layer, and a second forward program loads its
executable instead of tracing, lowering and compiling the net; anything that could change
either (the prototxt, the input shapes, caffe2jax's version, a file a layer names) makes a
new key, a damaged entry is logged and compiled past, and the loaded program's results are
bit-identical to the plain ``jax.jit`` path."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import caffe2jax
from caffe2jax.pycaffe import programs
from caffe2jax.runtime.host import startup_cache

ROOT = Path(__file__).resolve().parents[3]

NET = """
name: "small"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 2 dim: 3 dim: 12 dim: 12 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: NUM kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
  inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "prob" type: "Softmax" bottom: "ip1" top: "prob" }
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache folder, on; ``traces()`` counts the layers shape inference traced."""
    monkeypatch.setenv("CAFFE2JAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CAFFE2JAX_NO_COMPILE_CACHE", raising=False)
    calls = []
    real = jax.eval_shape
    monkeypatch.setattr(jax, "eval_shape", lambda *a, **k: calls.append(1) or real(*a, **k))
    return tmp_path / "cache" / "startup", calls


def _net(tmp_path, num=4, name="net.prototxt", shape=None):
    path = tmp_path / name
    text = NET.replace("NUM", str(num))
    if shape is not None:
        text = text.replace("dim: 2 dim: 3 dim: 12 dim: 12", " ".join(f"dim: {d}" for d in shape))
    path.write_text(text)
    return caffe2jax.Net(str(path), caffe2jax.TEST, seed=0)


def _shapes(net):
    return {name: blob.shape for name, blob in net.blobs.items()}


def test_second_build_reads_shapes_instead_of_tracing(tmp_path, cache):
    folder, traces = cache
    first = _net(tmp_path)
    assert len(traces) == 5  # every layer but Input traced once
    assert len(list((folder / "shapes").iterdir())) == 1
    traces.clear()
    second = _net(tmp_path)
    assert traces == []
    assert _shapes(second) == _shapes(first) and second.blobs["ip1"].shape == (2, 5)


def test_changed_prototxt_input_shape_or_version_infers_again(tmp_path, cache, monkeypatch):
    folder, traces = cache
    _net(tmp_path)
    traces.clear()
    wider = _net(tmp_path, num=6)  # a changed prototxt
    assert len(traces) == 5 and wider.blobs["conv1"].shape == (2, 6, 10, 10)
    traces.clear()
    bigger = _net(tmp_path, shape=(2, 3, 14, 14))  # a changed input shape
    assert len(traces) == 5 and bigger.blobs["pool1"].shape == (2, 4, 6, 6)
    traces.clear()
    monkeypatch.setattr(startup_cache, "version", lambda: "99.0")  # another caffe2jax
    _net(tmp_path)
    assert len(traces) == 5
    assert len(list((folder / "shapes").iterdir())) == 4
    traces.clear()
    _net(tmp_path)  # the same again: read
    assert traces == []


def test_named_file_and_python_layer_in_the_key(tmp_path, cache):
    from caffe2jax.frontend.pipeline import load_net

    listed = tmp_path / "sizes.txt"
    listed.write_text("a 1 2\n")
    text = NET.replace("NUM", "4").replace(
        'top: "prob" }', f'top: "prob" hdf5_output_param {{ file_name: "{listed}" }} }}'
    )
    net = load_net(text, "TEST")
    key = startup_cache.net_key(net, {"data": (2, 3, 12, 12)}, ())
    assert key == startup_cache.net_key(net, {"data": (2, 3, 12, 12)}, ())
    listed.write_text("a 1 2\nb 3 4\n")  # the named file changed: another key
    assert startup_cache.net_key(net, {"data": (2, 3, 12, 12)}, ()) != key
    python = load_net(
        NET.replace("NUM", "4") + 'layer { name: "py" type: "Python" bottom: "prob" top: "out" '
        'python_param { module: "m" layer: "L" } }',
        "TEST",
    )
    assert startup_cache.net_key(python, {"data": (2, 3, 12, 12)}, ()) is None


def test_damaged_shapes_entry_is_inferred_again(tmp_path, cache):
    folder, traces = cache
    first = _net(tmp_path)
    for entry in (folder / "shapes").iterdir():
        entry.write_text("{not json")
    traces.clear()
    again = _net(tmp_path)
    assert len(traces) == 5 and _shapes(again) == _shapes(first)


def _forward(net):
    rng = np.random.default_rng(1)
    net.blobs["data"].data[...] = rng.normal(size=net.blobs["data"].shape)
    return {k: np.array(v) for k, v in net.forward(blobs=["conv1", "pool1"]).items()}


def _loaded(net):
    return [p.loaded for p in net.model.programs.values() if isinstance(p, startup_cache.Program)]


def test_second_forward_loads_its_program_bit_identical(tmp_path, cache, monkeypatch):
    folder, _ = cache
    first = _net(tmp_path)
    out_first = _forward(first)
    assert _loaded(first) == [False]
    assert len(list((folder / "programs").iterdir())) == 1
    second = _net(tmp_path)
    out_second = _forward(second)
    assert _loaded(second) == [True]
    monkeypatch.setenv("CAFFE2JAX_NO_COMPILE_CACHE", "1")  # the plain jax.jit path
    plain = _net(tmp_path)
    out_plain = _forward(plain)
    assert _loaded(plain) == []
    for name in out_plain:
        np.testing.assert_array_equal(out_first[name], out_plain[name])
        np.testing.assert_array_equal(out_second[name], out_plain[name])
    # the next forward of the loaded program: the net's key moved on as the plain path's did
    np.testing.assert_array_equal(_forward(second)["prob"], _forward(plain)["prob"])


def test_damaged_or_foreign_program_is_logged_and_compiled(tmp_path, cache, monkeypatch, caplog):
    folder, _ = cache
    expected = _forward(_net(tmp_path))
    for entry in (folder / "programs").iterdir():
        entry.write_bytes(b"\x80\x04not a pickle")
    with caplog.at_level(logging.WARNING, logger="caffe2jax.startup"):
        net = _net(tmp_path)
        out = _forward(net)
    assert _loaded(net) == [False]
    assert "does not load" in caplog.text
    np.testing.assert_array_equal(out["prob"], expected["prob"])
    monkeypatch.setattr(jax, "__version__", "0.0.1")  # another JAX: another key, compiled
    other = _net(tmp_path)
    _forward(other)
    assert _loaded(other) == [False]


def test_program_outside_the_cache_is_plain_jit(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("CAFFE2JAX_NO_COMPILE_CACHE", "1")
    net = _net(tmp_path)
    model = net.model
    fn = programs.forward(model, 0, len(model.graph.caffe_layers) - 1, frozenset())
    assert not isinstance(fn, startup_cache.Program)


SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np, caffe2jax
    from caffe2jax.runtime.host import startup_cache
    net = caffe2jax.Net(sys.argv[1], caffe2jax.TEST, seed=0)
    net.blobs["data"].data[...] = np.arange(net.blobs["data"].count).reshape(
        net.blobs["data"].shape) % 7
    prob = net.forward()["prob"]
    kept = [p.loaded for p in net.model.programs.values()
            if isinstance(p, startup_cache.Program)]
    print(kept, prob.tobytes().hex())
    """
)


def test_second_process_loads_shapes_and_program(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET.replace("NUM", "4"))
    env = {**os.environ, "CAFFE2JAX_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("CAFFE2JAX_NO_COMPILE_CACHE", None)
    runs = [
        subprocess.run(
            [sys.executable, "-c", SCRIPT, str(path)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=600,
        )  # fmt: skip
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    (first, out_first), (second, out_second) = (r.stdout.split("] ") for r in runs)
    assert first == "[False" and second == "[True"
    assert out_first == out_second
