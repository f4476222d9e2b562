"""``compare``: one input through caffe2jax and through an ONNX model (and OpenCV 4's Caffe
importer where asked), blob by blob in the net's order, naming the first blob that diverges.

Every blob the ONNX model computes under its Caffe name is made an output of a copy of the
model, so onnxruntime returns them all; caffe2jax's jitted forward returns every blob. For
each blob: the shapes, the largest absolute difference and that difference relative to the
blob's largest magnitude (caffe2jax's value as the reference). The first blob over the
tolerance (or of another shape) is where a conversion went wrong: everything before it
agrees, so the layer that wrote it is the one to look at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import jax
import numpy as np

from caffe2jax.frontend.errors import CaffeError


@dataclass
class BlobDiff:
    """One blob compared: where it comes from, its shapes and differences."""

    blob: str
    layer: str
    type: str
    ours: tuple
    theirs: tuple
    max_abs: float = float("nan")
    max_rel: float = float("nan")

    def diverges(self, tolerance: float) -> bool:
        return self.ours != self.theirs or not self.max_rel <= tolerance

    def line(self) -> str:
        if self.ours != self.theirs:
            return (
                f"{self.blob:24s} {self.layer:20s} shape {list(self.ours)} vs {list(self.theirs)}"
            )
        return (f"{self.blob:24s} {self.layer:20s} {str(list(self.ours)):20s} "
                f"max abs {self.max_abs:.3g}  max rel {self.max_rel:.3g}")  # fmt: skip


@dataclass
class Report:
    """The blobs compared with one runtime, in the net's order."""

    runtime: str
    tolerance: float
    blobs: list[BlobDiff] = field(default_factory=list)

    @property
    def first_divergence(self) -> BlobDiff | None:
        return next((b for b in self.blobs if b.diverges(self.tolerance)), None)

    def summary(self) -> str:
        bad = self.first_divergence
        if bad is None:
            return (f"{self.runtime}: all {len(self.blobs)} blobs agree within "
                    f"{self.tolerance:g} of each blob's largest magnitude")  # fmt: skip
        what = (f"shape {list(bad.ours)} vs {list(bad.theirs)}" if bad.ours != bad.theirs else
                f"max abs {bad.max_abs:.3g}, max rel {bad.max_rel:.3g}")  # fmt: skip
        return (f"{self.runtime}: first divergence at blob '{bad.blob}' (layer '{bad.layer}', "
                f"type {bad.type}): {what}; tolerance {self.tolerance:g}")  # fmt: skip


def diff(blob: str, layer, ours: np.ndarray, theirs: np.ndarray) -> BlobDiff:
    """The differences of ``theirs`` from ``ours`` (shape mismatch: no numbers)."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    entry = BlobDiff(blob, layer.name, layer.type, tuple(ours.shape), tuple(theirs.shape))
    if ours.shape != theirs.shape:
        return entry
    delta = np.abs(ours - theirs)
    both_nan = np.isnan(ours) & np.isnan(theirs)
    delta = np.where(both_nan, 0.0, delta)
    entry.max_abs = float(delta.max()) if delta.size else 0.0
    scale = float(np.nanmax(np.abs(ours))) if ours.size and not np.isnan(ours).all() else 0.0
    entry.max_rel = entry.max_abs / scale if scale > 0 else entry.max_abs
    return entry


def caffe2jax_blobs(model, params, state, inputs: Mapping[str, np.ndarray]) -> dict:
    """Every blob of one jitted forward (SSA id → numpy array)."""
    forward = jax.jit(lambda p, s, x: model.apply(p, s, x)[0])
    return {k: np.asarray(v) for k, v in forward(params, state, dict(inputs)).items()}


def onnx_blobs(model, proto, inputs: Mapping[str, np.ndarray]) -> dict:
    """Every blob ``proto`` computes under its Caffe name, run by onnxruntime (SSA id →
    array)."""
    import onnx
    import onnxruntime as ort

    from caffe2jax.runtime.onnx.graph import blob_names

    names = blob_names(model, proto)
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    have = {o.name for o in copy.graph.output}
    given = {i.name for i in copy.graph.input}
    for name in names.values():
        if name not in have and name not in given:
            copy.graph.output.append(onnx.ValueInfoProto(name=name))
    session = ort.InferenceSession(copy.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {i.name: np.asarray(inputs[i.name], np.float32) for i in session.get_inputs()}
    wanted = [o.name for o in session.get_outputs()]
    values = dict(zip(wanted, session.run(wanted, feed)))
    return {ssa: values[name] for ssa, name in names.items() if name in values}


def report(model, runtime: str, ours: dict, theirs: dict, tolerance: float) -> Report:
    """The blobs both computed, compared in the net's order (inputs left out)."""
    out = Report(runtime, tolerance)
    for layer in model.net.layers:
        for ssa in layer.tops:
            if ssa in theirs and ssa in ours and ssa not in model.graph.input_versions.values():
                out.blobs.append(diff(ssa, layer, ours[ssa], theirs[ssa]))
    return out


def compare_onnx(model, params, state, inputs, proto=None, *, tolerance: float = 1e-4) -> Report:
    """caffe2jax against the ONNX model ``proto`` (default: this model exported now)."""
    if proto is None:
        from caffe2jax.runtime.onnx import to_onnx

        proto = to_onnx(model, params, state)
    ours = caffe2jax_blobs(model, params, state, inputs)
    return report(model, "onnxruntime", ours, onnx_blobs(model, proto, inputs), tolerance)


def compare_opencv(model, params, state, inputs, prototxt, *, tolerance: float = 1e-4,
                   folder=None) -> Report:  # fmt: skip
    """caffe2jax against OpenCV 4's Caffe importer (``cv2.dnn.readNetFromCaffe``) reading
    ``prototxt`` and the weights written as a .caffemodel; each layer's first top, where it
    is the blob's last version."""
    import tempfile
    from pathlib import Path

    import cv2

    from caffe2jax.runtime.formats.weights import save_weights

    if not hasattr(cv2, "dnn") or not hasattr(cv2.dnn, "readNetFromCaffe"):
        raise CaffeError(f"OpenCV {cv2.__version__} has no Caffe importer (OpenCV 5 removed it)")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        weights = save_weights(Path(tmp) / "weights.caffemodel", model, params, state)
        try:
            net = cv2.dnn.readNetFromCaffe(str(prototxt), str(weights))
        except cv2.error as err:
            raise CaffeError(f"OpenCV cannot read the net: {str(err).strip()[:200]}") from None
    ours = caffe2jax_blobs(model, params, state, inputs)
    final = [ly for ly in model.net.layers if ly.tops and ly.tops[0] == ly.top_names[0]
             and ly.name in net.getLayerNames()]  # fmt: skip
    for name, value in inputs.items():
        net.setInput(np.asarray(value, np.float32), name)
    try:
        values = net.forward([ly.name for ly in final])
    except cv2.error as err:
        raise CaffeError(f"OpenCV cannot run the net: {str(err).strip()[:200]}") from None
    theirs = {ly.tops[0]: np.asarray(v) for ly, v in zip(final, values)}
    theirs = {k: v.reshape(ours[k].shape) if v.size == ours[k].size else v
              for k, v in theirs.items()}  # fmt: skip
    return report(model, f"OpenCV {cv2.__version__}", ours, theirs, tolerance)
