"""Small nets for the per-layer ONNX tests: one or a few layers behind Input layers, random
weights and inputs, the export run in onnxruntime beside caffe2jax's jitted forward."""

from __future__ import annotations

import numpy as np

import caffe2jax
from tests.runtime.onnx import onnx_runs


def net_text(layers: str, inputs: dict[str, tuple]) -> str:
    """A prototxt: one Input layer per entry of ``inputs``, then ``layers``."""
    head = "".join(
        f'layer {{ name: "in_{k}" type: "Input" top: "{k}" '
        f"input_param {{ shape {{ {' '.join(f'dim: {d}' for d in s)} }} }} }}\n"
        for k, s in inputs.items()
    )
    return 'name: "small"\n' + head + layers


def random_model(text: str, seed: int = 0, **compile_args):
    """The compiled net with every param blob drawn from N(0, 1) (state blobs ≥ 0.5)."""
    model = caffe2jax.compile(text, **compile_args)
    params, state = model.init(0)
    rng = np.random.default_rng(seed)
    for key, j, decl in model.graph.owned():
        tree = state if decl.state else params
        value = rng.standard_normal(decl.shape)
        tree[key][j] = (np.abs(value) + 0.5 if decl.state else value).astype(np.float32)
    return model, params, state


def random_inputs(model, seed: int = 1, low: float = -1.0, high: float = 1.0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.uniform(low, high, s).astype(np.float32) for k, s in model.inputs.items()}


def agree(model, params, state, inputs, rtol: float = 1e-5, **export_args) -> dict:
    """Export, run, and check every output against caffe2jax; returns onnxruntime's values."""
    proto = onnx_runs.export(model, params, state, **export_args)
    got = onnx_runs.run(proto, inputs)
    ours = onnx_runs.reference(model, params, state, inputs)
    for name, value in got.items():
        mine = ours[model.net.blob_names.get(name, name)]
        assert onnx_runs.relative(mine, value) <= rtol, (name, onnx_runs.relative(mine, value))
    return got
