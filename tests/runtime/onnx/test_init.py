"""The public entry points of caffe2jax.runtime.onnx: ``caffe2jax.export_onnx`` writes a checked
file atomically (an existing one only with ``overwrite``), the opset range, a TRAIN net
refused, ``supported()`` listing the types with their forms."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import caffe2jax
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.runtime.formats.weights import load_weights
from caffe2jax.runtime.onnx import MIN_OPSET, OnnxExportError, supported
from tests.golden import GOLDEN, require
from tests.runtime.onnx import onnx_runs

NET = require(GOLDEN / "nets" / "cifar10_quick_deploy.prototxt")


def test_export_onnx_writes_a_checked_model(tmp_path):
    model = caffe2jax.compile(NET)
    params, state = load_weights(NET.with_suffix(".caffemodel"), model)
    path = caffe2jax.export_onnx(model, params, state, tmp_path / "quick.onnx",
                                 input_shapes={"data": (3, 3, 32, 32)})  # fmt: skip
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    dims = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert proto.graph.input[0].name == "data" and dims == [3, 3, 32, 32]
    assert [i.name for i in proto.graph.initializer][:2] == ["conv1/0", "conv1/1"]
    x = np.random.default_rng(0).uniform(0, 255, (3, 3, 32, 32)).astype(np.float32)
    member = model.reshape({"data": x.shape})
    expected = onnx_runs.reference(member, params, state, {"data": x})["prob"]
    np.testing.assert_allclose(onnx_runs.run(proto, {"data": x})["prob"], expected, rtol=1e-5,
                               atol=1e-7)  # fmt: skip
    with pytest.raises(CaffeError, match="already exists"):
        caffe2jax.export_onnx(model, params, state, path, overwrite=False)


def test_opsets_and_phase(tmp_path):
    model = caffe2jax.compile(NET)
    params, state = model.init(0)
    with pytest.raises(OnnxExportError, match=f"opset {MIN_OPSET - 1} is not supported"):
        caffe2jax.export_onnx(model, params, state, tmp_path / "x.onnx", opset=MIN_OPSET - 1)
    proto = onnx_runs.export(model, params, state, opset=MIN_OPSET)
    assert proto.opset_import[0].version == MIN_OPSET
    train = caffe2jax.compile(GOLDEN / "nets" / "lenet_train.prototxt", phase="TRAIN")
    with pytest.raises(OnnxExportError, match="compiled for phase TRAIN: export a TEST net"):
        onnx_runs.export(train, *train.init(0))
    assert not (tmp_path / "x.onnx").exists()


def test_supported_lists_types_and_forms():
    names = supported()
    for entry in ("Convolution", "DetectionOutput", "BN (pspnet)", "Upsample (max_unpool)",
                  "Python:rpn.proposal_layer.ProposalLayer", "Interp (deeplab-v1)"):  # fmt: skip
        assert entry in names
