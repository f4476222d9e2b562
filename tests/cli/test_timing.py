"""`caffe2jax time` (runtime/tools/timing.py): Caffe's per-layer lines from per-layer programs, the
fused whole-net figures, and the CLI's persistent compilation cache (on by default, off by flag
or environment variable). Timings themselves are measured in benchmarks/, never asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.runtime.tools.timing import random_inputs, time_net

NET = """
name: "tiny"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 2 dim: 8 dim: 8 } shape { dim: 4 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" }
"""
LAYERS = ["label_data_1_split", "conv", "relu", "pool", "ip", "ip_ip_0_split", "loss", "acc"]


def test_time_net_lists_caffes_layers_splits_included():
    model = compile_net(NET, "TRAIN")
    t = time_net(model, random_inputs(model), iterations=1)
    assert [layer.name for layer in t.layers] == LAYERS
    assert all(x.forward_ms > 0 and x.backward_ms > 0 for x in t.layers)
    assert t.forward_ms == sum(x.forward_ms for x in t.layers)
    assert t.fused_forward_ms > 0 and t.fused_forward_backward_ms > 0
    assert t.peak_bytes > 4 * 2 * 8 * 8 * 4  # at least the input
    assert t.seeded == "loss"


ALIKE = """
name: "alike"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } } }
""" + "".join(
    f"""layer {{ name: "conv{i}" type: "Convolution" bottom: "{b}" top: "conv{i}"
    convolution_param {{ num_output: 3 kernel_size: 3 pad: 1
                         weight_filler {{ type: "xavier" }} }} }}
    layer {{ name: "relu{i}" type: "ReLU" bottom: "conv{i}" top: "conv{i}" }}
    """
    for i, b in ((1, "data"), (2, "conv1"), (3, "conv2"))
)


def test_layers_alike_share_programs_and_each_is_reported_as_timed():
    model = compile_net(ALIKE, "TEST")
    seen = []
    t = time_net(model, random_inputs(model), iterations=1, per_layer=True,
                 on_layer=lambda layer: seen.append(layer.name))  # fmt: skip
    names = ["conv1", "relu1", "conv2", "relu2", "conv3", "relu3"]
    assert seen == names and [x.name for x in t.layers] == names
    assert t.layer_programs == 2  # one convolution's programs, one ReLU's
    assert all(x.forward_ms > 0 and x.backward_ms > 0 for x in t.layers)


def test_a_net_without_loss_is_timed_from_its_outputs():
    deploy = NET.replace('top: "label"', "").replace("shape { dim: 4 } ", "")
    deploy = deploy[: deploy.index('layer { name: "loss"')]
    model = compile_net(deploy, "TEST")
    t = time_net(model, random_inputs(model), iterations=1, per_layer=False)
    assert t.seeded == "outputs" and not t.layers and t.fused_forward_backward_ms > 0


def cli(tmp_path, *args, time_args=(), **env):
    model = tmp_path / "tiny.prototxt"
    model.write_text(NET)
    done = subprocess.run(
        [sys.executable, "-m", "caffe2jax", *args, "time", "--model", str(model),
         "--iterations", "2", *time_args],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "CAFFE2JAX_CACHE_DIR": str(tmp_path / "cache"), **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [line.split("] ", 1)[-1] for line in done.stderr.splitlines()]


def test_time_prints_caffes_lines_and_fills_the_compile_cache(tmp_path):
    lines = cli(tmp_path)
    number = r"[0-9.e+-]+"
    for name in LAYERS:
        for phase in ("forward", "backward"):
            pattern = rf"^ *{re.escape(name)}\t{phase}: {number} ms\.$"
            assert any(re.match(pattern, ln) for ln in lines), (pattern, lines)
    fused = "Fused forward (one XLA program, returning the net's outputs)"
    for head in ("Average Forward pass", "Average Backward pass", "Average Forward-Backward",
                 "Total Time", fused):  # fmt: skip
        assert any(re.match(rf"^{re.escape(head)}: {number} ms\.$", ln) for ln in lines), head
    assert any(ln.startswith("Compile time (XLA, or the compilation cache): forward ")
               for ln in lines)  # fmt: skip
    assert any(ln.startswith("Peak memory: ") for ln in lines)
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert cached
    cli(tmp_path)  # the same net again: every program comes from the cache, none is added
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == cached


def test_compile_cache_off_by_flag_or_environment(tmp_path):
    lines = cli(tmp_path, "--no-compile-cache", time_args=("--precision", "bf16",
                                                          "--no-per-layer"))  # fmt: skip
    assert not (tmp_path / "cache").exists()
    assert any("precision bf16" in ln for ln in lines)
    assert not any("\tforward: " in ln for ln in lines)  # --no-per-layer
    cli(tmp_path, CAFFE2JAX_NO_COMPILE_CACHE="1")
    assert not (tmp_path / "cache").exists()
