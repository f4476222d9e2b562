"""Every case of real BVLC Caffe's goldens (golden/layers and golden/nets) exported to ONNX:
checked with ``onnx.checker`` (full check), run in onnxruntime and compared with Caffe's own
outputs (the layer cases) and with caffe2jax's jitted forward.

Tolerances as tests/lowering/test_golden_layers.py (DESIGN.md): relative error ‖ours − caffe‖ /
‖caffe‖ ≤ 1e-5 per array, 1e-4 for layers that reduce over many elements. Cases a TEST export
cannot have are listed (:data:`REFUSED`) and must be refused in one line naming the layer.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import caffe2jax
from caffe2jax.runtime.formats.weights import load_weights
from caffe2jax.runtime.onnx import OnnxExportError
from tests.golden import GOLDEN, load_npz, require
from tests.lowering.test_golden_layers import (
    REDUCTION_TYPES,
    parameter_blobs_from_caffemodel,
    rel_err,
)
from tests.runtime.onnx import onnx_runs

jax.config.update("jax_default_matmul_precision", "highest")

LAYERS = GOLDEN / "layers"
CASES = sorted(p.stem for p in require(LAYERS).glob("*.npz"))
NETS = sorted(p.stem for p in require(GOLDEN / "nets").glob("*.prototxt"))

_LOSS = "a loss layer has no inference form"
_TRAIN = "is compiled for phase TRAIN: export a TEST net"
#: Cases whose layer has nothing to export in a TEST net, with the reason given.
REFUSED = {
    **{
        c: _TRAIN
        for c in (
            "batchnorm_global_in_train",
            "batchnorm_train",
            "batchnorm_train_2d",
            "dropout_train",
        )
    },  # fmt: skip
    **{
        c: _LOSS
        for c in (
            "contrastive",
            "contrastive_legacy",
            "euclidean",
            "euclidean_lossweight",
            "hinge_l1",
            "hinge_l2",
            "infogain",
            "multinomial_logistic",
            "sigmoidce_default",
            "sigmoidce_full",
            "sigmoidce_valid_ignore",
        )
    },  # fmt: skip
    "silence": "has no output blob to export",
}


def _case(case):
    arrays, meta = load_npz(LAYERS / f"{case}.npz")
    model = caffe2jax.compile(str(arrays["prototxt"]), phase=meta["phase"])
    params, state = model.init(0)
    for i in range(len(meta["params"])):
        target = state if model.graph.decls["layer"][i].state else params
        target["layer"][i] = np.asarray(arrays[f"param__{i}"])
    for name, value in parameter_blobs_from_caffemodel(case).items():
        params[name][0] = value
    inputs = {n: arrays[f"in__{n}"] for n in model.inputs}
    return arrays, meta, model, params, state, inputs


@pytest.mark.parametrize("case", CASES)
def test_golden_layer_case(case):
    arrays, meta, model, params, state, inputs = _case(case)
    tops = [t["name"] for t in meta["tops"]]
    if case in REFUSED:
        with pytest.raises(OnnxExportError, match=REFUSED[case]) as err:
            onnx_runs.export(model, params, state, outputs=tops or None)
        assert "\n" not in str(err.value)
        return
    proto = onnx_runs.export(model, params, state, outputs=tops)
    got = onnx_runs.run(proto, inputs)
    tol = 1e-4 if meta["type"] in REDUCTION_TYPES else 1e-5
    for top in tops:  # against Caffe itself (caffe2jax matches it: test_golden_layers.py)
        caffe = arrays[f"out__{top}"]
        value = got[top][: len(caffe)] if meta["type"] == "Filter" else got[top]
        assert rel_err(value, caffe) <= tol, f"top '{top}' against Caffe"


@pytest.fixture(scope="module", params=NETS)
def golden_net(request):
    name = request.param
    model = caffe2jax.compile(GOLDEN / "nets" / f"{name}.prototxt", phase="TEST")
    params, state = load_weights(GOLDEN / "nets" / f"{name}.caffemodel", model)
    return name, model, params, state


def _inputs(model, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in model.inputs.items():
        shape = (batch, *shape[1:])
        if name == "label":
            out[name] = rng.integers(0, 10, shape).astype(np.float32)
        else:
            out[name] = rng.uniform(0, 1, shape).astype(np.float32)
    return out


@pytest.mark.parametrize("batch", [1, 4])
def test_golden_net_with_a_dynamic_batch(golden_net, batch):
    """The whole golden nets (the train nets' TEST phase: loss and accuracy included),
    exported once with a symbolic batch, run at batch 1 and 4 against caffe2jax at that batch."""
    name, model, params, state = golden_net
    proto = onnx_runs.export(model, params, state, dynamic_batch=True)
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    member = model.reshape({k: (batch, *s[1:]) for k, s in model.inputs.items()})
    inputs = _inputs(member, batch)
    got = onnx_runs.run(proto, inputs)
    ours = onnx_runs.reference(member, params, state, inputs)
    for top, value in got.items():
        assert onnx_runs.relative(ours[top], value) <= 1e-5, (name, top)
