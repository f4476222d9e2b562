"""What caffe2jax says about fork things it does not support yet: fields of forks it has no
schema for and unknown V1 types (frontend/parse.py), and fork layer types it does not lower
(compile time, lowering/registry.py with frontend/forks/layer_types.py)."""

from __future__ import annotations

import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError, PrototxtError
from caffe2jax.frontend.forks.layer_types import unsupported_fork_type
from caffe2jax.frontend.parse import read_net

INPUT = 'layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 } } }\n'


def test_a_field_of_a_fork_names_its_layer():
    with pytest.raises(PrototxtError) as err:
        read_net('layer { name: "c" type: "Correlation" correlation_param { pad: 20 } }')
    message = str(err.value)
    assert "'correlation_param' is a field of the Correlation layer of FlowNet's Caffe" in message
    assert "does not support yet" in message and "did you mean" not in message


def test_typos_still_get_a_suggestion():
    with pytest.raises(PrototxtError, match="did you mean 'convolution_param'"):
        read_net('layer { name: "c" convolution_parm { num_output: 1 } }')


def test_unknown_v1_type_names_the_forks_read():
    with pytest.raises(PrototxtError) as err:
        read_net('layers { name: "s" type: SPATIAL_TRANSFORMER }')
    message = str(err.value)
    assert message.startswith("<string>:1:")
    assert "unknown V1 layer type SPATIAL_TRANSFORMER" in message
    assert "DeepLab v1, C3D v1.0, MobileNet-YOLO" in message


@pytest.mark.parametrize(
    ("layer", "expected"),
    [
        ('type: "DenseCRF" dense_crf_param { max_iter: 5 }',
         "the DenseCRF layer of DeepLab v2 (DrSleep/deeplab-public-ver2@a11f8a2); also in PSPNet"),
        ('type: "VoxelCustomLoss"', "a training layer of C3D v1.0 (facebook/C3D@71336a2"),
        ('type: "MatRead"',
         "a reader of input blobs from MATLAB .mat files of DeepLab v2 (DrSleep/deeplab-public"),
        ('type: "Yolov3"', "a training layer of MobileNet-YOLO"),
        ('type: "DomainTransform"', "the DomainTransform layer of DeepLab v2"),
        ('type: "UniqueLabel"', "the UniqueLabel layer of DeepLab v2"),
    ],
)  # fmt: skip
def test_unsupported_fork_types_fail_at_compile_time_naming_the_fork(layer, expected):
    text = INPUT + f'layer {{ name: "f" bottom: "x" top: "y" {layer} }}'
    with pytest.raises(NetError) as err:
        caffe2jax.compile(text)
    message = str(err.value)
    assert message.startswith("<string>:2: layer 'f' (type ") or "layer 'f' (type " in message
    assert expected in message
    assert "did you mean" not in message


def test_other_unknown_types_keep_the_usual_message():
    with pytest.raises(NetError, match="unsupported type 'Frobnicate'"):
        caffe2jax.compile(INPUT + 'layer { name: "f" type: "Frobnicate" bottom: "x" top: "y" }')
    assert unsupported_fork_type("Frobnicate") is None
    assert unsupported_fork_type("Convolution") is None


def test_forms_narrow_the_fork_named():
    assert "of SegNet" in unsupported_fork_type("Upsample", "max_unpool")
    assert "of darknet2caffe" in unsupported_fork_type("Upsample", "nearest")
    assert "SmoothL1Loss layer of SSD" in unsupported_fork_type("SmoothL1Loss", "ssd")


@pytest.mark.parametrize(
    ("layer", "field"),
    [
        ('type: "DataAugmentation" augmentation_param { max_multiplier: 1 }', "augmentation_param"),
        ('type: "Correlation" correlation_param { pad: 2 }', "correlation_param"),
        ('type: "DenseCRF" dense_crf_param { max_iterr: 5 }', "max_iterr"),
    ],
)
def test_an_unknown_field_of_an_unsupported_type_says_the_type_first(layer, field):
    """The type is what stops the net; its field is named after it, with no suggestion."""
    text = INPUT + f'layer {{ name: "f" bottom: "x" top: "y" {layer} }}'
    with pytest.raises(PrototxtError) as err:
        caffe2jax.compile(text)
    message = str(err.value)
    kind = layer.split('"')[1]
    assert message.startswith("<string>:2:") and f": layer 'f' (type {kind}): " in message
    assert message.index(kind) < message.index(field)
    assert f"its field '{field}' is unknown too" in message and "did you mean" not in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('layer { name: "n" type: "Normalize" normalize_param { across_spatial: false } }',
         "layer 'n' (type Normalize): unknown field 'across_spatial' in "
         "HappynearNormalizeParameter"),
        ('layer { name: "c" type: "Convolution" convolution_param { num_ouput: 1 } }',
         "layer 'c' (type Convolution): unknown field 'num_ouput' in ConvolutionParameter (did "
         "you mean 'num_output'?)"),
        ('layers { name: "m" type: MAT_WRITE mat_write_param { prefx: "a" } }',
         "layer 'm' (type MAT_WRITE): unknown field 'prefx' in MatWriteParameter (did you mean "
         "'prefix'?)"),
        ('layer {\n  name: "p" type: "Pooling"\n  pooling_param { pool: MAXX }\n}',
         "<string>:3:25: layer 'p' (type Pooling): "),
    ],
)  # fmt: skip
def test_every_field_error_names_its_layer(text, expected):
    with pytest.raises(PrototxtError) as err:
        read_net(text)
    assert expected in str(err.value)


@pytest.mark.parametrize(
    ("field", "suggestion"),
    [
        ("augmentation_param", None),  # FlowNet's DataAugmentation's, not a misspelt field
        ("correlation_param", None),  # FlowNet's Correlation, not a misspelt field
        ("convolution_parm", "convolution_param"),
        ("convolutoin_param", "convolution_param"),
        ("Pooling_Param", "pooling_param"),
        ("lr_mul", None),  # lr_mult lives in ParamSpec, not LayerParameter
    ],
)
def test_did_you_mean_only_for_the_same_field_misspelt(field, suggestion):
    with pytest.raises(PrototxtError) as err:
        read_net(f'layer {{ name: "l" type: "Convolution" {field} {{ }} }}')
    message = str(err.value)
    if suggestion is None:
        assert "did you mean" not in message
    else:
        assert f"(did you mean '{suggestion}'?)" in message


def test_a_misspelt_type_gets_a_suggestion_and_a_different_one_does_not():
    with pytest.raises(NetError, match=r"unsupported type 'Convolutoin' \(did you mean "):
        caffe2jax.compile(INPUT + 'layer { name: "f" type: "Convolutoin" bottom: "x" top: "y" }')
    with pytest.raises(NetError) as err:
        caffe2jax.compile(INPUT + 'layer { name: "f" type: "Correlation" bottom: "x" top: "y" }')
    assert "did you mean" not in str(err.value)
