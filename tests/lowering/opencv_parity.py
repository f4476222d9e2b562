"""Run one prototxt in caffe2jax (under jax.jit, the path users run) and in OpenCV dnn
(cv2.dnn.readNetFromCaffe) with the same weights: caffe2jax's initial weights written as a
.caffemodel that OpenCV loads."""

from __future__ import annotations

import cv2
import numpy as np

import caffe2jax
from caffe2jax.runtime.formats.weights import save_weights
from tests import jitted


def both(tmp_path, text: str, inputs: dict, outputs: list[str], phase="TEST", seed=0, cv_text=None):
    """(ours, theirs): dicts of the named blobs from caffe2jax and from OpenCV (OpenCV
    names outputs by layer: each output blob must be the top of a layer of the same name).
    ``cv_text``: the net as OpenCV spells it, where its types differ (no weights there)."""
    proto = tmp_path / "net.prototxt"
    proto.write_text(text)
    model = caffe2jax.compile(proto, phase=phase)
    params, state = model.init(seed)
    weights = save_weights(tmp_path / "net.caffemodel", model, params, state)
    blobs = jitted.forward(model, params, state, {k: np.asarray(v) for k, v in inputs.items()})[0]
    if cv_text is None:
        net = cv2.dnn.readNetFromCaffe(str(proto), str(weights))
    else:
        (tmp_path / "cv.prototxt").write_text(cv_text)
        net = cv2.dnn.readNetFromCaffe(str(tmp_path / "cv.prototxt"))
    for name, value in inputs.items():
        net.setInput(np.ascontiguousarray(value, np.float32), name)
    theirs = net.forward(outputs)
    return {k: np.asarray(blobs[k]) for k in outputs}, dict(zip(outputs, theirs))


def rel_to_max(ours: np.ndarray, theirs: np.ndarray) -> float:
    """max |ours − theirs| relative to the largest magnitude of theirs (the issue's measure)."""
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    scale = max(float(np.abs(theirs).max()), 1e-30)
    return float(np.abs(ours.astype(np.float64) - theirs).max()) / scale


def input_layer(shapes: dict[str, tuple[int, ...]]) -> str:
    """An Input layer with one top per named shape."""
    tops = " ".join(f'top: "{n}"' for n in shapes)
    dims = " ".join("shape { " + " ".join(f"dim: {d}" for d in s) + " }" for s in shapes.values())
    return f'layer {{ name: "input" type: "Input" {tops} input_param {{ {dims} }} }}\n'


def check_fd(
    text: str, inputs: dict, top: str, wrt_params: bool = True, eps: float = 1e-6, fixed=()
):
    """Reverse-mode gradients of sum(w · top) against central finite differences, float64,
    with respect to the inputs (except those named in ``fixed``) and (``wrt_params``) the
    layers' params."""
    import jax
    from jax.test_util import check_grads

    if "force_backward" not in text:
        text = "force_backward: true\n" + text
    with jax.enable_x64(True):
        model = caffe2jax.compile(text, dtype=np.float64)
        params, state = model.init(0)
        xs = {k: np.asarray(v, np.float64) for k, v in inputs.items() if k not in fixed}
        const = {k: np.asarray(v, np.float64) for k, v in inputs.items() if k in fixed}
        shape = jitted.forward(model, params, state, {**xs, **const})[0][top].shape
        w = np.random.default_rng(7).normal(size=shape)

        @jax.jit  # the compiled path: reverse mode of the jitted forward, as users train
        def f(x, p):
            return (model.apply(p, state, {**x, **const})[0][top] * w).sum()

        if wrt_params:
            check_grads(f, (xs, params), order=1, modes=["rev"], eps=eps)
        else:
            check_grads(lambda x: f(x, params), (xs,), order=1, modes=["rev"], eps=eps)
