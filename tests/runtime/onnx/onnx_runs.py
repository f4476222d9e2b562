"""Running an exported net in onnxruntime beside caffe2jax's jitted forward, for the ONNX tests.

* :func:`export` exports and checks (``onnx.checker.check_model(full_check=True)`` runs inside
  ``to_onnx``); :func:`run` runs a model in onnxruntime, any blob it computes as an output.
* :func:`pinned`: a copy of a model in which chosen blobs are graph inputs, so that the layers
  after them read given values (caffe2jax's). Used where a layer's output is a discontinuous
  function of its bottoms (a MAX pooling's argmax mask, the boxes NMS keeps): the two
  runtimes' float32 rounding (~1e-7) can flip a near tie there, so such a layer is checked on
  identical bottoms and the layers after it on its pinned value.
* :func:`same_rows`: detection rows compared as a set (rows whose scores tie may come in
  either order).
"""

from __future__ import annotations

import jax
import numpy as np
import onnx
import onnxruntime as ort

from caffe2jax.runtime.onnx import to_onnx
from caffe2jax.runtime.onnx.graph import blob_names


def export(model, params, state, **kw) -> onnx.ModelProto:
    return to_onnx(model, params, state, **kw)


def run(proto: onnx.ModelProto, inputs: dict, outputs=None) -> dict[str, np.ndarray]:
    """onnxruntime's values of ``outputs`` (ONNX value names; default the graph's outputs)."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    have = {o.name for o in model.graph.output}
    for name in outputs or []:
        if name not in have:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {i.name: np.asarray(inputs[i.name], np.float32) for i in session.get_inputs()}
    names = list(outputs) if outputs else [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed)))


def pinned(proto: onnx.ModelProto, names) -> onnx.ModelProto:
    """A copy of ``proto`` where each value of ``names`` is a graph input (its producer writes
    an unused value instead)."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    for name in names:
        for node in model.graph.node:
            node.output[:] = [f"{o}__unpinned" if o == name else o for o in node.output]
        model.graph.input.append(onnx.helper.make_tensor_value_info(name, 1, None))
    return model


def reference(model, params, state, inputs, keep=None) -> dict[str, np.ndarray]:
    """The blobs ``keep`` (SSA ids; default every blob) of caffe2jax's jitted forward (a net
    that samples in TEST, as Bayesian SegNet's Dropout, draws from key 0). Only those live
    past the program."""

    def forward(p, s, x):
        blobs = model.apply(p, s, x, jax.random.key(0))[0]
        return blobs if keep is None else {k: blobs[k] for k in keep}

    return {k: np.asarray(v) for k, v in jax.jit(forward)(params, state, inputs).items()}


def relative(ours: np.ndarray, theirs: np.ndarray) -> float:
    """max |ours − theirs| relative to ours' largest magnitude (shapes must match)."""
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    scale = max(float(np.max(np.abs(ours))) if ours.size else 0.0, 1e-30)
    return float(np.max(np.abs(ours - theirs))) / scale if ours.size else 0.0


def same_rows(ours: np.ndarray, theirs: np.ndarray, rtol: float = 1e-5) -> None:
    """Detection tops (…, K, 7): the same padding rows, and the same valid rows (label ≥ 0) as
    a set, each within ``rtol`` of the top's largest magnitude."""
    a, b = ours.reshape(-1, 7), theirs.reshape(-1, 7)
    assert a.shape == b.shape
    np.testing.assert_array_equal(a[:, 1] >= 0, b[:, 1] >= 0)
    va, vb = a[a[:, 1] >= 0], b[b[:, 1] >= 0]
    tol = rtol * max(float(np.abs(a).max()), 1.0)
    used = np.zeros(len(vb), bool)
    for row in va:
        gap = np.abs(vb - row).max(axis=1)
        gap[used] = np.inf
        j = int(np.argmin(gap))
        assert gap[j] <= tol, f"row {row} has no match (nearest {vb[j]})"
        used[j] = True
    np.testing.assert_array_equal(a[a[:, 1] < 0], b[b[:, 1] < 0])


def onnx_names(model, proto) -> dict[str, str]:
    return blob_names(model, proto)
