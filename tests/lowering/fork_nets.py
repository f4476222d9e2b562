"""Helpers for the fork layers' tests: tiny nets run by caffe2jax and by OpenCV dnn with the
same weights, and float64 finite-difference gradient checks."""

from __future__ import annotations

import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.test_util import check_grads

from caffe2jax.frontend import caffe_pb2
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted


def net(layers: str, inputs: dict[str, tuple[int, ...]]) -> str:
    """A prototxt: one Input layer with ``inputs`` (names → shapes), then ``layers``."""
    tops = "".join(f'top: "{name}" ' for name in inputs)
    shapes = "".join("shape { " + " ".join(f"dim: {d}" for d in s) + " } " for s in inputs.values())
    return (
        "force_backward: true\n"
        f'layer {{ name: "input" type: "Input" {tops} input_param {{ {shapes} }} }}\n{layers}\n'
    )


def ours(text: str, inputs: dict, weights: dict | None = None, phase: str = "TEST") -> dict:
    """caffe2jax's blobs for ``inputs`` with ``weights`` (layer name → blob list)."""
    model = compile_net(text, phase=phase)
    params, state = model.init(0)
    for name, blobs in (weights or {}).items():
        params[name] = [jnp.asarray(b, jnp.float32) for b in blobs]
    feed = {k: jnp.asarray(v, jnp.float32) for k, v in inputs.items()}
    blobs, _ = jitted.forward(model, params, state, feed, jax.random.key(0))
    return {k: np.asarray(v) for k, v in blobs.items()}


def caffemodel(weights: dict) -> bytes:
    """A binary NetParameter holding only each layer's name and blobs (what OpenCV reads)."""
    out = caffe_pb2.NetParameter()
    for name, blobs in weights.items():
        layer = out.layer.add(name=name)
        for b in blobs:
            blob = layer.blobs.add()
            blob.shape.dim.extend(np.shape(b))
            blob.data.extend(np.asarray(b, np.float32).ravel().tolist())
    return out.SerializeToString()


def opencv(text: str, inputs: dict, layers: list[str], weights: dict | None = None) -> dict:
    """OpenCV dnn's outputs (cv2.dnn.readNetFromCaffe) for the same net and weights: every
    top of each of ``layers``, by layer name."""
    import cv2

    with tempfile.TemporaryDirectory() as tmp:
        proto, model = Path(tmp) / "net.prototxt", Path(tmp) / "net.caffemodel"
        proto.write_text(text.replace("force_backward: true\n", ""))
        model.write_bytes(caffemodel(weights or {}))
        cvnet = cv2.dnn.readNetFromCaffe(str(proto), str(model))
    cvnet.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    for name, value in inputs.items():
        cvnet.setInput(np.ascontiguousarray(value, np.float32), name)
    values = cvnet.forwardAndRetrieve(layers)
    return {name: [np.asarray(v) for v in tops] for name, tops in zip(layers, values)}


def max_rel(a, b) -> float:
    """max |a − b| relative to the largest magnitude of b."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def fd_check(
    text: str,
    inputs: dict,
    top: str,
    *,
    fixed: dict | None = None,
    weights: dict | None = None,
    phase: str = "TEST",
    params: bool = True,
) -> None:
    """Reverse-mode gradients of ``Σ c·top`` (c fixed, random) against central finite
    differences in float64, w.r.t. ``inputs`` and (with ``params``) the layers' blobs;
    ``fixed`` inputs (masks, labels) are held constant."""
    with jax.enable_x64(True):
        model = compile_net(text, phase=phase, dtype=jnp.float64)
        p0, state = model.init(0)
        for name, blobs in (weights or {}).items():
            p0[name] = [None if b is None else jnp.asarray(b, jnp.float64) for b in blobs]
        const = {k: jnp.asarray(v, jnp.float64) for k, v in (fixed or {}).items()}
        x0 = {k: jnp.asarray(v, jnp.float64) for k, v in inputs.items()}
        shape = jitted.forward(model, p0, state, {**x0, **const}, jax.random.key(0))[0][top].shape
        c = jnp.asarray(np.random.default_rng(7).standard_normal(shape))

        @jax.jit  # the compiled path: reverse mode of the jitted forward, as users train
        def f(x, p):
            blobs = model.apply(p if params else p0, state, {**x, **const}, jax.random.key(0))
            return jnp.sum(blobs[0][top] * c)

        check_grads(f, (x0, p0), order=1, modes=["rev"], eps=1e-6, atol=1e-6, rtol=1e-6)


CONV = (
    'layer { name: "c" type: "Convolution" bottom: "x" top: "c" '
    "convolution_param { num_output: %d kernel_size: 1 } }\n"
)


def channels_last_agrees(layer: str, shape: tuple[int, ...], tops=("y",)) -> None:
    """``layer`` (reading blob "c") after a 1×1 convolution of "x" runs channels-last under
    the channels-last policy (lowering/layout.py) and gives the plain run's tops."""
    from caffe2jax.lowering import layout
    from caffe2jax.lowering.engines.policy import EnginePolicy

    text = net(CONV % shape[1] + layer, {"x": shape})
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    plain = ours(text, {"x": x})
    model = compile_net(text, policy=EnginePolicy(channels_last=True))
    assert "y" in layout.plan(model.net), "the layer did not take its channels-last form"
    params, state = model.init(0)
    blobs, _ = jitted.forward(model, params, state, {"x": jnp.asarray(x)}, jax.random.key(0))
    for top in tops:
        np.testing.assert_allclose(np.asarray(blobs[top]), plain[top], rtol=1e-5, atol=1e-5)
