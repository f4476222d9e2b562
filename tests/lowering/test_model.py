"""The functional API: every registered layer type compiles and runs; compile-once; errors."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import DataError, NetError
from caffe2jax.lowering.python_layer import register_python_layer, unregister_python_layer
from caffe2jax.lowering.registry import registered_types
from tests.golden import GOLDEN, ROOT, load_npz
from tests.lowering.sweep_forks import FORK_SWEEP

LAYERS = GOLDEN / "layers"


def golden_prototxt_by_type() -> dict[str, str]:
    """One golden case per Caffe type (the first, alphabetically)."""
    out: dict[str, str] = {}
    for path in sorted(LAYERS.glob("*.npz")):
        arrays, meta = load_npz(path)
        out.setdefault(meta["type"], str(arrays["prototxt"]))
    return out


HDF5 = GOLDEN / "formats" / "hdf5_data"
DIGITS = ROOT / "examples" / "digits"
EXTRA = {
    "Input": """layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 } } }""",
    "MemoryData": """layer { name: "m" type: "MemoryData" top: "d" top: "l"
        memory_data_param { batch_size: 2 channels: 1 height: 2 width: 2 } }""",
    "Data": f"""layer {{ name: "d" type: "Data" top: "d" top: "l"
        data_param {{ source: "{DIGITS / "digits_test_lmdb"}" batch_size: 4 backend: LMDB }} }}""",
    "HDF5Data": f"""layer {{ name: "h" type: "HDF5Data" top: "data" top: "label"
        hdf5_data_param {{ source: "{HDF5 / "list.txt"}" batch_size: 3 }} }}""",
    "MemoryLoss": """
        layer { name: "in" type: "Input" top: "p" input_param { shape { dim: 3 dim: 2 } } }
        layer { name: "l" type: "MemoryLoss" bottom: "p" top: "loss" }""",
    "Convolution3D": """
        layer { name: "in" type: "Input" top: "x"
                input_param { shape { dim: 1 dim: 2 dim: 3 dim: 4 dim: 4 } } }
        layer { name: "c" type: "Convolution3D" bottom: "x" top: "y"
                convolution3d_param { num_output: 2 kernel_size: 3 kernel_depth: 3 pad: 1 } }""",
    "Pooling3D": """
        layer { name: "in" type: "Input" top: "x"
                input_param { shape { dim: 1 dim: 2 dim: 3 dim: 4 dim: 4 } } }
        layer { name: "p" type: "Pooling3D" bottom: "x" top: "y"
                pooling3d_param { kernel_size: 2 kernel_depth: 2 stride: 2
                                  temporal_stride: 2 } }""",
    "ContinuationIndicator": """layer { name: "c" type: "ContinuationIndicator" top: "c"
        continuation_indicator_param { time_step: 3 batch_size: 2 } }""",
    "Python": """
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
        layer { name: "py" type: "Python" bottom: "x" top: "y"
                python_param { module: "sweep" layer: "Double" } }""",
}


def sweep_cases() -> dict[str, str]:
    cases = golden_prototxt_by_type()
    cases.update(EXTRA)
    cases.update(FORK_SWEEP)
    return cases


# Checked by their own tests below or in tests/runtime/data (ImageData needs image files;
# MatWrite: tests/runtime/data/test_mat_write.py; the face-recognition layers, whose nets need
# labels: tests/lowering/forks/test_face.py; BoxData reads an LMDB of the YOLOv2 fork's
# records: tests/runtime/data/test_box_data.py).
SWEPT_ELSEWHERE = {"ImageData", "WindowData", "HDF5Output", "DenseImageData", "ImageSegData",
                   "VideoData", "AnnotatedData", "RoIData", "MatWrite", "BoxData",
                   "CenterLoss", "Flip", "LabelSpecificAdd", "LargeMarginInnerProduct",
                   "MarginInnerProduct"}  # fmt: skip


def test_every_registered_type_is_covered_by_the_sweep():
    missing = set(registered_types()) - set(sweep_cases()) - SWEPT_ELSEWHERE
    assert not missing, f"types without a sweep net: {sorted(missing)}"


@pytest.mark.parametrize("layer_type", sorted(sweep_cases()))
def test_registered_type_compiles_and_runs(layer_type, tmp_path):
    text = sweep_cases()[layer_type]
    register_python_layer("sweep", "Double")(
        lambda bottoms, params, param_str, ctx: [2 * bottoms[0]]
    )
    try:
        model = caffe2jax.compile(text, phase="TRAIN", input_shapes=_source_shapes(text))
        params, state = model.init(0)
        inputs = {n: np.ones(s, np.float32) for n, s in model.inputs.items()}
        blobs, _ = jax.jit(model.apply)(params, state, inputs, jax.random.key(0))
        for name in model.outputs:
            assert (
                blobs[model.net.blob_names[name]].shape
                == model.net.shapes[model.net.blob_names[name]]
            )
    finally:
        unregister_python_layer("sweep", "Double")


def _source_shapes(text: str):
    """Data-pipeline layers learn their shapes from the source (as Caffe's DataLayerSetUp)."""
    if '"Data"' in text or '"HDF5Data"' in text:
        from caffe2jax.frontend.pipeline import load_net
        from caffe2jax.runtime.data.feeding import Feeder

        feeder = Feeder(load_net(text, "TRAIN"))
        shapes = feeder.input_shapes()
        feeder.close()
        return shapes
    return None


def test_window_data_is_refused_with_a_clear_error():
    text = """layer { name: "w" type: "WindowData" top: "d" top: "l"
              window_data_param { source: "windows.txt" batch_size: 2 } }"""
    with pytest.raises(DataError, match="WindowData"):
        caffe2jax.Net(text, caffe2jax.TRAIN)


def test_hdf5_output_writes_its_bottoms(tmp_path):
    out = tmp_path / "out.h5"
    text = f"""
    layer {{ name: "in" type: "Input" top: "x" top: "y"
             input_param {{ shape {{ dim: 2 dim: 3 }} shape {{ dim: 2 }} }} }}
    layer {{ name: "o" type: "HDF5Output" bottom: "x" bottom: "y"
             hdf5_output_param {{ file_name: "{out}" }} }}"""
    net = caffe2jax.Net(text)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    net.forward(x=x, y=np.array([1, 0], np.float32))
    net.close()
    import h5py

    with h5py.File(out) as f:
        np.testing.assert_array_equal(np.asarray(f["data"]).reshape(2, 3), x)


def test_second_call_with_same_shapes_does_not_retrace():
    arrays, meta = load_npz(GOLDEN / "nets" / "lenet_deploy.npz")
    model = caffe2jax.compile(str(arrays["prototxt"]))
    params, state = model.init(0)
    traces = []

    def forward(params, inputs):
        traces.append(1)
        return model.apply(params, state, inputs)[0]["prob"]

    jitted = jax.jit(forward)
    for _ in range(3):
        jitted(params, {"data": arrays["in__data"]}).block_until_ready()
    assert len(traces) == 1


def test_incompatible_shapes_name_layer_blobs_and_shapes():
    text = """layer { name: "in" type: "Input" top: "a" top: "b"
                      input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 4 } } }
              layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "y" }"""
    with pytest.raises(NetError) as err:
        caffe2jax.compile(text)
    message = str(err.value)
    assert "layer 'sum' (type Eltwise)" in message
    assert "'a'" in message and "'b'" in message and "[2, 3]" in message and "[2, 4]" in message


def test_float64_when_asked():
    jax.config.update("jax_enable_x64", True)
    try:
        arrays, _ = load_npz(GOLDEN / "nets" / "lenet_deploy.npz")
        model = caffe2jax.compile(str(arrays["prototxt"]), dtype=np.float64)
        params, state = model.init(0)
        blobs, _ = model.apply(params, state, {"data": arrays["in__data"]})
        assert blobs["prob"].dtype == np.float64
    finally:
        jax.config.update("jax_enable_x64", False)


def test_the_engine_policy_is_passed_like_the_precision():
    """``compile(policy=)`` / ``Model(policy=)`` fix a net's engines; ``reshape`` keeps them;
    ``channels_last=`` overrides the policy's pass switch."""
    from caffe2jax.lowering.engines.policy import EnginePolicy
    from caffe2jax.lowering.model import Model

    text = (GOLDEN / "nets" / "lenet_deploy.prototxt").read_text()
    given = EnginePolicy(pool="xla", conv="xla")
    model = caffe2jax.compile(text, policy=given)
    assert model.policy is given and model.graph.policy is given
    assert model.graph.engines["pool1"] == "xla"
    assert model.reshape({"data": (2, 1, 28, 28)}).policy is given
    off = Model(model.net, model.inputs, policy=given, channels_last=False)
    assert off.policy == EnginePolicy(pool="xla", conv="xla", channels_last=False)
    assert not off.graph.nhwc_layers and model.graph.nhwc_layers
    assert caffe2jax.EnginePolicy is EnginePolicy
