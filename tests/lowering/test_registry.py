"""The layer registry (lowering/registry.py): one lowering per Caffe type string and fork form,
the lookup by (type, form), its blob-count rule (Caffe's CheckBlobCounts), its channels-last form,
engine rule and bf16 flag, the data-layer table, the unknown-type error, and docs/layers.md
(every registered type, form and built-in Python layer, and the function that runs it) kept
current."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering import registry
from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.lowering.registry import (
    DATA_LAYERS,
    Lowering,
    data_layers,
    lookup,
    lowering_of,
    register,
    registered_forms,
    registered_types,
)

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "scripts" / "layer_table.py"


def _noop(layer, params, bottoms, ctx):
    return list(bottoms)


def test_a_type_is_registered_once(monkeypatch):
    registered_types()  # every family registered first, into the real table
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    first = register("TestOnlyType", counts=(1, 1, 1, 1))(_noop)
    assert isinstance(first, Lowering) and lowering_of("TestOnlyType") is first
    assert "TestOnlyType" in registered_types()
    with pytest.raises(ValueError, match="layer type 'TestOnlyType' is registered twice"):
        register("TestOnlyType")(_noop)
    variant = register("TestOnlyType", form="fork")(_noop)
    assert lowering_of("TestOnlyType", "fork") is variant and variant.form == "fork"
    assert lowering_of("TestOnlyType", "another") is first  # no entry of that form: BVLC's
    with pytest.raises(ValueError, match="'TestOnlyType' in form 'fork' is registered twice"):
        register("TestOnlyType", form="fork")(_noop)


def _layer_of(text: str, name: str):
    return next(la for la in compile_net(text).net.layers if la.name == name)


def test_lookup_takes_the_layers_form_entry_else_the_bvlc_one():
    """A fork's variant of a BVLC type is its own entry, found by the layer's form; a layer of
    form "" (or of a form with no entry) runs the BVLC lowering."""
    loss = """layer { name: "in" type: "Input" top: "x" top: "l"
                      input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }
              layer { name: "loss" type: "SoftmaxWithLoss" bottom: "x" bottom: "l" top: "y"
                      %s }"""
    plain = _layer_of(loss % "", "loss")
    segnet = _layer_of(loss % "loss_param { weight_by_label_freqs: false }", "loss")
    assert (plain.form, segnet.form) == ("", "segnet")
    assert lookup(plain) is lowering_of("SoftmaxWithLoss")
    assert lookup(segnet) is lowering_of("SoftmaxWithLoss", "segnet")
    assert lookup(segnet).fn.__module__ == "caffe2jax.lowering.forks.segnet"
    assert lookup(plain).fn.__module__ == "caffe2jax.lowering.layers.loss"


def test_every_form_the_frontend_gives_has_an_entry_or_falls_back_to_the_types():
    """frontend/forks/forms.py's forms: each has its own entry, or the type has a form-"" entry
    that the layer runs (C3D v1.0's 3-D layers differ only in how their weights are stored)."""
    from caffe2jax.frontend.forks.forms import FORMS

    keys = set(registered_forms())
    for type_name, forms in FORMS.items():
        if type_name == "Python":  # built-ins: keyed by (module, layer, form) instead
            continue
        for form in forms:
            assert (type_name, form) in keys or (type_name, "") in keys, (type_name, form)
    fallback = {(t, f) for t, forms in FORMS.items() for f in forms if f and (t, f) not in keys}
    assert fallback == {
        ("Convolution3D", "c3d-v1.0"),
        ("Pooling3D", "c3d-v1.0"),
        ("Python", "rfcn"),
    }


def test_bf16_is_an_attribute_of_the_entry():
    """The layer types computed in bfloat16 under precision bf16 (lowering/engines/precision.py):
    the FLOP-heavy ones and those that only move, select or rectify values; a fork's variant of
    one of them computes as its BVLC entry does."""
    bf16 = {key for key in registered_forms() if lowering_of(*key).bf16}
    bvlc = {"Convolution", "Deconvolution", "InnerProduct", "Pooling", "ReLU", "Dropout",
            "Concat", "Slice", "Flatten", "Reshape", "Crop", "Eltwise", "Scale",
            "Bias"}  # fmt: skip
    forks = {("Pooling", "darknet2caffe"), ("Dropout", "scale_train"), ("Dropout", "sample_test")}
    assert bf16 == {(t, "") for t in bvlc} | forks


def test_data_layers_are_registered_with_their_feed():
    """The one data-layer table (lowering/registry.py DATA_LAYERS), filled by the families'
    registrations: BVLC's in lowering/layers/data.py, the forks' in their modules."""
    assert data_layers("caller") == ("Input",) and set(data_layers("sink")) == {
        "HDF5Output",
        "MatWrite",
    }
    assert data_layers("memory") == ("MemoryData",)
    pipeline = {"Data", "ImageData", "HDF5Data", "WindowData", "DenseImageData",
                "ImageSegData", "VideoData", "AnnotatedData", "RoIData", "BoxData"}  # fmt: skip
    assert set(data_layers("pipeline")) == pipeline
    assert DATA_LAYERS["ImageSegData"].counts == (0, 0, 2, 3)
    for type_name, kind in DATA_LAYERS.items():
        assert lowering_of(type_name).counts == kind.counts


def test_registered_types_are_sorted_and_complete():
    types = registered_types()
    assert types == sorted(types) and len(types) == len(set(types))
    for name in ("Convolution", "Pooling", "InnerProduct", "SoftmaxWithLoss", "Data", "Python"):
        assert name in types
    assert all(lowering_of(t).type == t for t in types)


def test_unknown_type_names_layer_type_and_supported_list():
    text = """layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 } } }
              layer { name: "odd" type: "Frobnicate" bottom: "x" top: "y" }"""
    with pytest.raises(NetError) as err:
        caffe2jax.compile(text)
    message = str(err.value)
    assert "layer 'odd'" in message and "'Frobnicate'" in message and len(message) < 200
    assert "layer_type_list()" in message and "Convolution" in registered_types()
    with pytest.raises(NetError, match=r"'Convolutoin' \(did you mean 'Convolution'\?\)"):
        caffe2jax.compile(text.replace("Frobnicate", "Convolutoin"))


def test_wrong_bottom_count_is_refused():
    text = """layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 } } }
              layer { name: "c" type: "Crop" bottom: "x" top: "y" }"""
    with pytest.raises(NetError, match=r"layer 'c' \(type Crop\): takes exactly 2 bottom"):
        caffe2jax.compile(text)


@pytest.mark.parametrize(
    "counts,equal,bottoms,tops,problem",
    [
        ((1, 1, 1, 1), False, 1, 1, None),
        ((1, 1, 1, 1), False, 2, 1, "takes exactly 1 bottom blob(s), got 2"),
        ((2, None, 1, 1), False, 1, 1, "takes at least 2 bottom blob(s), got 1"),
        ((2, None, 1, 1), False, 5, 1, None),
        ((1, 1, 1, 2), False, 1, 3, "produces 1 to 2 top blob(s), got 3"),
        ((0, 0, 1, None), False, 0, 4, None),
        ((1, None, 1, None), True, 2, 3, "needs as many tops as bottoms, got 2 bottom(s) and 3"),
        ((1, None, 1, None), True, 3, 3, None),
        (None, False, 7, 0, None),  # counts depend on the parameters: the lowering checks
    ],
)
def test_check_counts_is_caffes_check_blob_counts(counts, equal, bottoms, tops, problem):
    lowering = Lowering("T", _noop, counts=counts, equal_bottom_top=equal)
    found = lowering.check_counts(bottoms, tops)
    assert found == problem if problem is None else problem in found


@pytest.mark.parametrize(
    "type_name,bottoms,tops",
    [("Pooling", 2, 1), ("Pooling", 1, 3), ("LRN", 1, 2), ("Im2col", 2, 1), ("SPP", 1, 2),
     ("Eltwise", 1, 1), ("MemoryLoss", 3, 1), ("InfogainLoss", 4, 1), ("Accuracy", 2, 3),
     ("LSTMUnit", 3, 1), ("Convolution", 2, 1)],
)  # fmt: skip
def test_arity_is_the_registrys_alone(type_name, bottoms, tops):
    """The count checks lowerings used to repeat are the registry's: each of these is refused
    by ``counts`` before any lowering runs."""
    assert lowering_of(type_name).check_counts(bottoms, tops) is not None


def test_loss_layers_refuse_force_backward_into_labels():
    assert lowering_of("SoftmaxWithLoss").allow_force_backward(2) == (True, False)
    assert lowering_of("ReLU").allow_force_backward(1) == (True,)


def test_channels_last_forms_are_registered_on_their_lowering():
    """The types with a channels-last form, each registered in its family file."""
    with_nhwc = {t for t, f in registered_forms() if lowering_of(t, f).nhwc_fn is not None}
    forks = {"ConvolutionDepthwise", "DepthwiseConvolution", "ShuffleChannel", "Axpy", "ReLU6",
             "Mish", "Upsample", "Interp", "BN"}  # fmt: skip
    assert (
        with_nhwc
        == {"Convolution", "Pooling", "LRN", "ReLU", "Concat", "Eltwise", "BatchNorm", "Scale"}
        | forks
    )
    starts = sorted({t for t, f in registered_forms() if lowering_of(t, f).nhwc_starts})
    assert starts == ["Convolution", "ConvolutionDepthwise", "DepthwiseConvolution"]
    relu = lowering_of("ReLU")
    assert relu.nhwc_fn is relu.fn  # element by element: the same function in any layout
    with pytest.raises(ValueError, match="'ReLU' has two channels-last forms"):
        relu.nhwc(_noop)


class _Layer:
    """The few fields the eligibility rules read."""

    def __init__(self, type_name, text="", tops=("y",)):
        from google.protobuf import text_format

        from caffe2jax.frontend import caffe_pb2

        self.type, self.tops = type_name, tops
        self.param = text_format.Parse(text, caffe_pb2.LayerParameter())


@pytest.mark.parametrize(
    "type_name,text,shapes,tops,eligible",
    [
        ("Convolution", "convolution_param { kernel_size: 1 }", [(1, 2, 4, 4)], 1, True),
        ("Convolution", "convolution_param { kernel_size: 1 axis: 2 }", [(1, 2, 4, 4)], 1, False),
        ("Convolution", "convolution_param { kernel_size: 1 }", [(1, 2, 4, 4, 4)], 1, False),
        ("Pooling", "pooling_param { pool: MAX kernel_size: 2 }", [(1, 2, 4, 4)], 1, True),
        ("Pooling", "pooling_param { pool: MAX kernel_size: 2 }", [(1, 2, 4, 4)], 2, False),
        ("Pooling", "pooling_param { pool: STOCHASTIC kernel_size: 2 }", [(1, 2, 4, 4)], 1,
         False),
        ("Concat", "concat_param { axis: 1 }", [(1, 2, 4, 4)] * 2, 1, True),
        ("Concat", "concat_param { axis: -3 }", [(1, 2, 4, 4)] * 2, 1, True),
        ("Concat", "concat_param { concat_dim: 2 }", [(1, 2, 4, 4)] * 2, 1, False),
        ("ReLU", "", [(1, 2, 4, 4)], 1, True),
        ("ReLU", "", [(2, 4)], 1, False),
        ("LRN", "lrn_param { norm_region: WITHIN_CHANNEL }", [(1, 2, 4, 4)], 1, True),
        ("Sigmoid", "", [(1, 2, 4, 4)], 1, False),
    ],
)  # fmt: skip
def test_channels_last_eligibility(type_name, text, shapes, tops, eligible):
    layer = _Layer(type_name, text, ("y", "mask")[:tops])
    assert lowering_of(type_name).has_nhwc(layer, shapes) == eligible


def test_engine_rules_are_registered_for_the_layers_with_forms():
    with_rule = {t for t, f in registered_forms() if lowering_of(t, f).has_engine}
    assert with_rule == {"Convolution", "Pooling", "SPP", "ConvolutionDepthwise",
                         "DepthwiseConvolution"}  # fmt: skip
    assert lowering_of("ReLU").choose_engine(None, [], None) is None


def test_docs_layer_table_is_current():
    """docs/layers.md is what scripts/layer_table.py writes now (run it after registering a
    type); every registered type and form has a row naming its file and function, and every
    built-in Python layer one."""
    from caffe2jax.lowering.python_layer import builtin_python_layers

    script = runpy.run_path(str(TABLE))
    text = script["table"]()
    assert (ROOT / "docs" / "layers.md").read_text() == text, "run python scripts/layer_table.py"
    for type_name, form in registered_forms():
        fn = lowering_of(type_name, form).fn
        shown = f"`{form}`" if form else ""
        assert f"| `{type_name}` | {shown} | " in text and f"`{fn.__qualname__}`" in text
    for (module, layer, form), _ in builtin_python_layers():
        assert f"| `{module}` | `{layer}` | {f'`{form}`' if form else ''} |" in text
    vision = "[lowering/layers/vision.py](../lowering/layers/vision.py)"
    assert f"| `Convolution` |  | {vision} | `convolution` |" in text
    segnet = "[lowering/forks/segnet.py](../lowering/forks/segnet.py)"
    assert f"| `SoftmaxWithLoss` | `segnet` | {segnet} | `segnet_softmax_with_loss` |" in text
    assert script["main"](["--check"]) == 0
