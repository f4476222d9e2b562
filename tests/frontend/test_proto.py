"""The Caffe schema (frontend/caffe.proto) and its generated module.

Checks that caffe_pb2.py is what scripts/gen_proto.py produces, spot-checks field numbers,
types, defaults and enum values against BVLC Caffe's schema, and parses every binary and text
file the real-Caffe oracle holds: binaries must have no unknown field and re-serialise to the
identical bytes.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor, text_format, unknown_fields

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.forks.schema import schema
from tests.golden import GOLDEN, MODELS, ROOT, require

FD = descriptor.FieldDescriptor

# --------------------------------------------------------------------------------------------
# The generated module


def test_generated_module_matches_a_fresh_generation():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_module_identity():
    assert caffe_pb2.DESCRIPTOR.name == "caffe.proto"
    assert caffe_pb2.DESCRIPTOR.package == "caffe"
    # The module lives inside the package, next to the schema it was generated from.
    assert Path(caffe_pb2.__file__).resolve().parent == (ROOT / "frontend").resolve()
    assert (ROOT / "frontend" / "caffe.proto").is_file()


# --------------------------------------------------------------------------------------------
# Field numbers, from BVLC Caffe's caffe.proto (message, field) -> number

FIELD_NUMBERS = {
    ("BlobShape", "dim"): 1,
    ("BlobProto", "num"): 1,
    ("BlobProto", "data"): 5,
    ("BlobProto", "diff"): 6,
    ("BlobProto", "shape"): 7,
    ("BlobProto", "double_data"): 8,
    ("BlobProto", "double_diff"): 9,
    ("Datum", "encoded"): 7,
    ("Datum", "float_data"): 6,
    ("FillerParameter", "sparse"): 7,
    ("FillerParameter", "variance_norm"): 8,
    ("NetParameter", "name"): 1,
    ("NetParameter", "layers"): 2,
    ("NetParameter", "input"): 3,
    ("NetParameter", "input_dim"): 4,
    ("NetParameter", "force_backward"): 5,
    ("NetParameter", "state"): 6,
    ("NetParameter", "debug_info"): 7,
    ("NetParameter", "input_shape"): 8,
    ("NetParameter", "layer"): 100,
    ("SolverParameter", "train_net"): 1,
    ("SolverParameter", "test_iter"): 3,
    ("SolverParameter", "base_lr"): 5,
    ("SolverParameter", "max_iter"): 7,
    ("SolverParameter", "lr_policy"): 8,
    ("SolverParameter", "gamma"): 9,
    ("SolverParameter", "momentum"): 11,
    ("SolverParameter", "weight_decay"): 12,
    ("SolverParameter", "stepsize"): 13,
    ("SolverParameter", "snapshot"): 14,
    ("SolverParameter", "snapshot_prefix"): 15,
    ("SolverParameter", "solver_mode"): 17,
    ("SolverParameter", "random_seed"): 20,
    ("SolverParameter", "net"): 24,
    ("SolverParameter", "net_param"): 25,
    ("SolverParameter", "regularization_type"): 29,
    ("SolverParameter", "solver_type"): 30,
    ("SolverParameter", "delta"): 31,
    ("SolverParameter", "test_initialization"): 32,
    ("SolverParameter", "average_loss"): 33,
    ("SolverParameter", "stepvalue"): 34,
    ("SolverParameter", "clip_gradients"): 35,
    ("SolverParameter", "iter_size"): 36,
    ("SolverParameter", "snapshot_format"): 37,
    ("SolverParameter", "rms_decay"): 38,
    ("SolverParameter", "momentum2"): 39,
    ("SolverParameter", "type"): 40,
    ("SolverParameter", "layer_wise_reduce"): 41,
    ("SolverParameter", "weights"): 42,
    ("SolverState", "iter"): 1,
    ("SolverState", "learned_net"): 2,
    ("SolverState", "history"): 3,
    ("SolverState", "current_step"): 4,
    ("NetStateRule", "not_stage"): 5,
    ("ParamSpec", "share_mode"): 2,
    ("ParamSpec", "lr_mult"): 3,
    ("ParamSpec", "decay_mult"): 4,
    ("LayerParameter", "loss_weight"): 5,
    ("LayerParameter", "param"): 6,
    ("LayerParameter", "blobs"): 7,
    ("LayerParameter", "include"): 8,
    ("LayerParameter", "exclude"): 9,
    ("LayerParameter", "phase"): 10,
    ("LayerParameter", "propagate_down"): 11,
    ("LayerParameter", "transform_param"): 100,
    ("LayerParameter", "loss_param"): 101,
    ("LayerParameter", "accuracy_param"): 102,
    ("LayerParameter", "argmax_param"): 103,
    ("LayerParameter", "concat_param"): 104,
    ("LayerParameter", "convolution_param"): 106,
    ("LayerParameter", "data_param"): 107,
    ("LayerParameter", "dropout_param"): 108,
    ("LayerParameter", "eltwise_param"): 110,
    ("LayerParameter", "hdf5_data_param"): 112,
    ("LayerParameter", "inner_product_param"): 117,
    ("LayerParameter", "lrn_param"): 118,
    ("LayerParameter", "memory_data_param"): 119,
    ("LayerParameter", "mvn_param"): 120,
    ("LayerParameter", "pooling_param"): 121,
    ("LayerParameter", "relu_param"): 123,
    ("LayerParameter", "softmax_param"): 125,
    ("LayerParameter", "slice_param"): 126,
    ("LayerParameter", "window_data_param"): 129,
    ("LayerParameter", "python_param"): 130,
    ("LayerParameter", "prelu_param"): 131,
    ("LayerParameter", "spp_param"): 132,
    ("LayerParameter", "reshape_param"): 133,
    ("LayerParameter", "log_param"): 134,
    ("LayerParameter", "flatten_param"): 135,
    ("LayerParameter", "reduction_param"): 136,
    ("LayerParameter", "embed_param"): 137,
    ("LayerParameter", "tile_param"): 138,
    ("LayerParameter", "batch_norm_param"): 139,
    ("LayerParameter", "elu_param"): 140,
    ("LayerParameter", "bias_param"): 141,
    ("LayerParameter", "scale_param"): 142,
    ("LayerParameter", "input_param"): 143,
    ("LayerParameter", "crop_param"): 144,
    ("LayerParameter", "parameter_param"): 145,
    ("LayerParameter", "recurrent_param"): 146,
    ("LayerParameter", "swish_param"): 147,
    ("LayerParameter", "clip_param"): 148,
    ("ConvolutionParameter", "stride"): 6,
    ("ConvolutionParameter", "engine"): 15,
    ("ConvolutionParameter", "axis"): 16,
    ("ConvolutionParameter", "force_nd_im2col"): 17,
    ("ConvolutionParameter", "dilation"): 18,
    ("PoolingParameter", "kernel_size"): 2,
    ("PoolingParameter", "pad"): 4,
    ("PoolingParameter", "global_pooling"): 12,
    ("PoolingParameter", "round_mode"): 13,
    ("ConcatParameter", "concat_dim"): 1,
    ("ConcatParameter", "axis"): 2,
    ("SliceParameter", "axis"): 3,
    ("LossParameter", "ignore_label"): 1,
    ("LossParameter", "normalize"): 2,
    ("LossParameter", "normalization"): 3,
    ("DataParameter", "backend"): 8,
    ("DataParameter", "prefetch"): 10,
    ("DummyDataParameter", "shape"): 6,
    ("SPPParameter", "engine"): 6,
    ("ClipParameter", "min"): 1,
    ("ClipParameter", "max"): 2,
    ("V1LayerParameter", "layer"): 1,
    ("V1LayerParameter", "bottom"): 2,
    ("V1LayerParameter", "name"): 4,
    ("V1LayerParameter", "type"): 5,
    ("V1LayerParameter", "blobs"): 6,
    ("V1LayerParameter", "blobs_lr"): 7,
    ("V1LayerParameter", "weight_decay"): 8,
    ("V1LayerParameter", "convolution_param"): 10,
    ("V1LayerParameter", "include"): 32,
    ("V1LayerParameter", "loss_weight"): 35,
    ("V1LayerParameter", "transform_param"): 36,
    ("V1LayerParameter", "loss_param"): 42,
    ("V1LayerParameter", "param"): 1001,
    ("V1LayerParameter", "blob_share_mode"): 1002,
    ("V0LayerParameter", "kernelsize"): 8,
    ("V0LayerParameter", "k"): 22,
    ("V0LayerParameter", "blobs"): 50,
    ("V0LayerParameter", "blobs_lr"): 51,
    ("V0LayerParameter", "det_fg_threshold"): 54,
    ("V0LayerParameter", "det_context_pad"): 58,
    ("V0LayerParameter", "det_crop_mode"): 59,
    ("V0LayerParameter", "new_num"): 60,
    ("V0LayerParameter", "shuffle_images"): 64,
    ("V0LayerParameter", "concat_dim"): 65,
    ("V0LayerParameter", "hdf5_output_param"): 1001,
    # MyCaffe extensions, numbered outside BVLC's ranges.
    ("LayerParameter", "memory_loss_param"): 1000,
    ("SolverParameter", "rl_param"): 1000,
}


def _field(message: str, field: str) -> descriptor.FieldDescriptor:
    return caffe_pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name[field]


@pytest.mark.parametrize(
    ("message", "field"), sorted(FIELD_NUMBERS), ids=[f"{m}.{f}" for m, f in sorted(FIELD_NUMBERS)]
)
def test_field_number(message, field):
    assert _field(message, field).number == FIELD_NUMBERS[(message, field)]


def test_field_table_is_substantial():
    assert len(FIELD_NUMBERS) >= 40


# Wire types matter where Caffe's choice is not the obvious one (BVLC uses int32 for counters;
# some forks widened them to int64, which the golden files would not reveal for small values).
FIELD_TYPES = {
    ("BlobShape", "dim"): FD.TYPE_INT64,
    ("BlobProto", "num"): FD.TYPE_INT32,
    ("BlobProto", "double_data"): FD.TYPE_DOUBLE,
    ("NetParameter", "input_dim"): FD.TYPE_INT32,
    ("SolverParameter", "test_iter"): FD.TYPE_INT32,
    ("SolverParameter", "display"): FD.TYPE_INT32,
    ("SolverParameter", "max_iter"): FD.TYPE_INT32,
    ("SolverParameter", "stepvalue"): FD.TYPE_INT32,
    ("SolverParameter", "device_id"): FD.TYPE_INT32,
    ("SolverParameter", "random_seed"): FD.TYPE_INT64,
    ("SolverState", "iter"): FD.TYPE_INT32,
    ("SolverState", "current_step"): FD.TYPE_INT32,
    ("FillerParameter", "sparse"): FD.TYPE_INT32,
    ("ConvolutionParameter", "kernel_size"): FD.TYPE_UINT32,
    ("PoolingParameter", "round_mode"): FD.TYPE_ENUM,
    ("Datum", "data"): FD.TYPE_BYTES,
    ("TileParameter", "tiles"): FD.TYPE_INT32,
    ("RLParameter", "seed"): FD.TYPE_INT64,
}


@pytest.mark.parametrize(
    ("message", "field"), sorted(FIELD_TYPES), ids=[f"{m}.{f}" for m, f in sorted(FIELD_TYPES)]
)
def test_field_type(message, field):
    assert _field(message, field).type == FIELD_TYPES[(message, field)]


def test_packed_and_required_labels():
    packed = [
        ("BlobShape", "dim"),
        ("BlobProto", "data"),
        ("BlobProto", "diff"),
        ("BlobProto", "double_data"),
        ("BlobProto", "double_diff"),
    ]
    for message, field in packed:
        f = _field(message, field)
        assert f.is_packed, (message, field)
    # Other repeated scalars are not packed in Caffe's proto2 schema.
    assert not _field("Datum", "float_data").is_packed
    assert not _field("ConvolutionParameter", "kernel_size").is_packed
    assert not _field("LayerParameter", "loss_weight").is_packed
    # ClipParameter's bounds are `required` in BVLC.
    assert _field("ClipParameter", "min").is_required
    assert _field("ClipParameter", "max").is_required
    assert _field("NetParameter", "layer").is_repeated


def test_bvlc_numbering_is_bvlcs_without_the_fork_fields():
    # caffe.proto also holds the forks' fields (tests/frontend/forks/test_catalog.py); BVLC's
    # numbering (the "bvlc" dialect) is exactly BVLC's: LayerParameter ends at 148.
    layer = schema("bvlc", "LayerParameter").DESCRIPTOR
    numbers = {f.number for f in layer.fields}
    assert max(n for n in numbers if n != 1000) == 148
    for name in ("annotated_data_param", "multibox_loss_param", "norm_param", "permute_param"):
        assert name not in layer.fields_by_name
        assert name in caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name
    assert "ap_version" not in schema("bvlc", "SolverParameter").DESCRIPTOR.fields_by_name


# --------------------------------------------------------------------------------------------
# Defaults

DEFAULTS = [
    (caffe_pb2.FillerParameter, "type", "constant"),
    (caffe_pb2.FillerParameter, "max", 1.0),
    (caffe_pb2.FillerParameter, "std", 1.0),
    (caffe_pb2.FillerParameter, "sparse", -1),
    (caffe_pb2.FillerParameter, "variance_norm", caffe_pb2.FillerParameter.FAN_IN),
    (caffe_pb2.ConvolutionParameter, "bias_term", True),
    (caffe_pb2.ConvolutionParameter, "group", 1),
    (caffe_pb2.ConvolutionParameter, "axis", 1),
    (caffe_pb2.InnerProductParameter, "bias_term", True),
    (caffe_pb2.InnerProductParameter, "transpose", False),
    (caffe_pb2.LRNParameter, "local_size", 5),
    (caffe_pb2.LRNParameter, "alpha", 1.0),
    (caffe_pb2.LRNParameter, "beta", 0.75),
    (caffe_pb2.LRNParameter, "k", 1.0),
    (caffe_pb2.LRNParameter, "norm_region", caffe_pb2.LRNParameter.ACROSS_CHANNELS),
    (caffe_pb2.BatchNormParameter, "moving_average_fraction", 0.999),
    (caffe_pb2.BatchNormParameter, "eps", 1e-5),
    (caffe_pb2.PoolingParameter, "pool", caffe_pb2.PoolingParameter.MAX),
    (caffe_pb2.PoolingParameter, "stride", 1),
    (caffe_pb2.PoolingParameter, "round_mode", caffe_pb2.PoolingParameter.CEIL),
    (caffe_pb2.SolverParameter, "delta", 1e-8),
    (caffe_pb2.SolverParameter, "momentum2", 0.999),
    (caffe_pb2.SolverParameter, "rms_decay", 0.99),
    (caffe_pb2.SolverParameter, "clip_gradients", -1.0),
    (caffe_pb2.SolverParameter, "average_loss", 1),
    (caffe_pb2.SolverParameter, "iter_size", 1),
    (caffe_pb2.SolverParameter, "test_initialization", True),
    (caffe_pb2.SolverParameter, "snapshot_after_train", True),
    (caffe_pb2.SolverParameter, "type", "SGD"),
    (caffe_pb2.SolverParameter, "solver_type", caffe_pb2.SolverParameter.SGD),
    (caffe_pb2.SolverParameter, "solver_mode", caffe_pb2.SolverParameter.GPU),
    (caffe_pb2.SolverParameter, "snapshot_format", caffe_pb2.SolverParameter.BINARYPROTO),
    (caffe_pb2.SolverParameter, "regularization_type", "L2"),
    (caffe_pb2.SolverParameter, "random_seed", -1),
    (caffe_pb2.SolverParameter, "layer_wise_reduce", True),
    (caffe_pb2.LossParameter, "normalization", caffe_pb2.LossParameter.VALID),
    (caffe_pb2.ParamSpec, "lr_mult", 1.0),
    (caffe_pb2.ParamSpec, "decay_mult", 1.0),
    (caffe_pb2.DropoutParameter, "dropout_ratio", 0.5),
    (caffe_pb2.NetState, "phase", caffe_pb2.TEST),
    (caffe_pb2.EltwiseParameter, "operation", caffe_pb2.EltwiseParameter.SUM),
    (caffe_pb2.EltwiseParameter, "stable_prod_grad", True),
    (caffe_pb2.ReshapeParameter, "num_axes", -1),
    (caffe_pb2.FlattenParameter, "end_axis", -1),
    (caffe_pb2.CropParameter, "axis", 2),
    (caffe_pb2.ExpParameter, "base", -1.0),
    (caffe_pb2.MVNParameter, "eps", 1e-9),
    (caffe_pb2.MVNParameter, "normalize_variance", True),
    (caffe_pb2.ReductionParameter, "operation", caffe_pb2.ReductionParameter.SUM),
    (caffe_pb2.HingeLossParameter, "norm", caffe_pb2.HingeLossParameter.L1),
    (caffe_pb2.ContrastiveLossParameter, "margin", 1.0),
    (caffe_pb2.ScaleParameter, "bias_term", False),
    (caffe_pb2.SwishParameter, "beta", 1.0),
    (caffe_pb2.DataParameter, "backend", caffe_pb2.DataParameter.LEVELDB),
    (caffe_pb2.DataParameter, "prefetch", 4),
    (caffe_pb2.ImageDataParameter, "batch_size", 1),
    (caffe_pb2.ImageDataParameter, "is_color", True),
    (caffe_pb2.WindowDataParameter, "fg_fraction", 0.25),
    (caffe_pb2.WindowDataParameter, "crop_mode", "warp"),
    (caffe_pb2.V0LayerParameter, "biasterm", True),
    (caffe_pb2.V0LayerParameter, "det_crop_mode", "warp"),
    (caffe_pb2.V0LayerParameter, "dropout_ratio", 0.5),
    (caffe_pb2.ConcatParameter, "axis", 1),
    (caffe_pb2.ConcatParameter, "concat_dim", 1),
    (caffe_pb2.TransformationParameter, "scale", 1.0),
    # MyCaffe extensions.
    (caffe_pb2.MemoryLossParameter, "normalize_by_length", False),
    (caffe_pb2.RLParameter, "gamma", 0.99),
    (caffe_pb2.RLParameter, "batch_size", 10),
    (caffe_pb2.RLParameter, "env", "cartpole"),
    (caffe_pb2.RLParameter, "max_episodes", 0),
    (caffe_pb2.RLParameter, "target_return", 475.0),
    (caffe_pb2.RLParameter, "pole_angle_limit_deg", 20.0),
    (caffe_pb2.RLParameter, "max_steps", 0),
    (caffe_pb2.RLParameter, "normalize_by_length", False),
    (caffe_pb2.RLParameter, "population_std", True),
    (caffe_pb2.RLParameter, "difference_input", False),
    (caffe_pb2.RLParameter, "stale_observation", False),
    (caffe_pb2.RLParameter, "seed", -1),
]


@pytest.mark.parametrize(
    ("cls", "field", "expected"),
    DEFAULTS,
    ids=[f"{c.DESCRIPTOR.name}.{f}" for c, f, _ in DEFAULTS],
)
def test_default(cls, field, expected):
    value = getattr(cls(), field)
    if isinstance(expected, float):
        # float fields hold the float32 rounding of the default.
        assert math.isclose(value, expected, rel_tol=1e-7), value
    else:
        assert value == expected
        assert type(value) is type(expected)


def test_rl_param_field_numbers():
    names = [
        "gamma",
        "batch_size",
        "env",
        "max_episodes",
        "target_return",
        "pole_angle_limit_deg",
        "max_steps",
        "normalize_by_length",
        "population_std",
        "difference_input",
        "stale_observation",
        "seed",
        "horizon",
        "rollout_chunk",
        "allow_discount_reset",
        "eps_steps",
        "eps_start",
        "eps_end",
        "episode_elite_percent",
        # 20-26: the Atari (ALE) environment's settings
        "num_envs",
        "frameskip",
        "repeat_action_probability",
        "actions",
        "preprocess",
        "overlap",
        "env_threads",
        # 27: how Atari batches are played (runtime/rl/ale_program.py)
        "ale_rollout",
        # 40: caffe2jax's update rule (TRPO, PPO, multi-step; runtime/rl/update.py)
        "update",
    ]
    fields = caffe_pb2.RLParameter.DESCRIPTOR.fields
    assert [f.name for f in sorted(fields, key=lambda f: f.number)] == names
    assert [f.number for f in sorted(fields, key=lambda f: f.number)] == [*range(1, 28), 40]
    assert _field("MemoryLossParameter", "normalize_by_length").number == 1


# --------------------------------------------------------------------------------------------
# Enums and names

V1_LAYER_TYPES = {
    "NONE": 0, "ABSVAL": 35, "ACCURACY": 1, "ARGMAX": 30, "BNLL": 2, "CONCAT": 3,
    "CONTRASTIVE_LOSS": 37, "CONVOLUTION": 4, "DATA": 5, "DECONVOLUTION": 39, "DROPOUT": 6,
    "DUMMY_DATA": 32, "EUCLIDEAN_LOSS": 7, "ELTWISE": 25, "EXP": 38, "FLATTEN": 8,
    "HDF5_DATA": 9, "HDF5_OUTPUT": 10, "HINGE_LOSS": 28, "IM2COL": 11, "IMAGE_DATA": 12,
    "INFOGAIN_LOSS": 13, "INNER_PRODUCT": 14, "LRN": 15, "MEMORY_DATA": 29,
    "MULTINOMIAL_LOGISTIC_LOSS": 16, "MVN": 34, "POOLING": 17, "POWER": 26, "RELU": 18,
    "SIGMOID": 19, "SIGMOID_CROSS_ENTROPY_LOSS": 27, "SILENCE": 36, "SOFTMAX": 20,
    "SOFTMAX_LOSS": 21, "SPLIT": 22, "SLICE": 33, "TANH": 23, "WINDOW_DATA": 24,
    "THRESHOLD": 31,
}  # fmt: skip


def test_v1_layer_type_enum_is_complete():
    enum = caffe_pb2.V1LayerParameter.LayerType
    assert {k: v for k, v in enum.items() if k in V1_LAYER_TYPES} == V1_LAYER_TYPES
    assert enum.DESCRIPTOR.full_name == "caffe.V1LayerParameter.LayerType"
    # The forks' V1 types are extra names (at the numbers caffe.proto's rule gives them).
    bvlc = schema("bvlc", "V1LayerParameter").DESCRIPTOR.enum_types_by_name["LayerType"]
    assert {v.name: v.number for v in bvlc.values} == V1_LAYER_TYPES


ENUMS = {
    "caffe.Phase": {"TRAIN": 0, "TEST": 1},
    "caffe.PoolingParameter.PoolMethod": {"MAX": 0, "AVE": 1, "STOCHASTIC": 2},
    "caffe.PoolingParameter.RoundMode": {"CEIL": 0, "FLOOR": 1},
    "caffe.PoolingParameter.Engine": {"DEFAULT": 0, "CAFFE": 1, "CUDNN": 2},
    "caffe.SolverParameter.SolverType": {
        "SGD": 0, "NESTEROV": 1, "ADAGRAD": 2, "RMSPROP": 3, "ADADELTA": 4, "ADAM": 5,
    },
    "caffe.SolverParameter.SnapshotFormat": {"HDF5": 0, "BINARYPROTO": 1},
    "caffe.SolverParameter.SolverMode": {"CPU": 0, "GPU": 1},
    "caffe.ParamSpec.DimCheckMode": {"STRICT": 0, "PERMISSIVE": 1},
    "caffe.V1LayerParameter.DimCheckMode": {"STRICT": 0, "PERMISSIVE": 1},
    "caffe.LossParameter.NormalizationMode": {
        "FULL": 0, "VALID": 1, "BATCH_SIZE": 2, "NONE": 3, "PRE_FIXED": 3003,  # R-FCN's: 3
    },
    "caffe.FillerParameter.VarianceNorm": {"FAN_IN": 0, "FAN_OUT": 1, "AVERAGE": 2},
    "caffe.DataParameter.DB": {"LEVELDB": 0, "LMDB": 1},
    "caffe.EltwiseParameter.EltwiseOp": {"PROD": 0, "SUM": 1, "MAX": 2},
    "caffe.HingeLossParameter.Norm": {"L1": 1, "L2": 2},
    "caffe.LRNParameter.NormRegion": {"ACROSS_CHANNELS": 0, "WITHIN_CHANNEL": 1},
    "caffe.ReductionParameter.ReductionOp": {"SUM": 1, "ASUM": 2, "SUMSQ": 3, "MEAN": 4},
    "caffe.SPPParameter.PoolMethod": {"MAX": 0, "AVE": 1, "STOCHASTIC": 2},
    "caffe.V0LayerParameter.PoolMethod": {"MAX": 0, "AVE": 1, "STOCHASTIC": 2},
    "caffe.ConvolutionParameter.Engine": {"DEFAULT": 0, "CAFFE": 1, "CUDNN": 2},
}  # fmt: skip


@pytest.mark.parametrize("full_name", sorted(ENUMS))
def test_enum_values(full_name):
    pool = caffe_pb2.DESCRIPTOR.pool
    enum = pool.FindEnumTypeByName(full_name)
    assert {v.name: v.number for v in enum.values} == ENUMS[full_name]


def test_bvlc_message_set():
    bvlc = {
        "BlobShape", "BlobProto", "BlobProtoVector", "Datum", "FillerParameter", "NetParameter",
        "SolverParameter", "SolverState", "NetState", "NetStateRule", "ParamSpec",
        "LayerParameter", "TransformationParameter", "LossParameter", "AccuracyParameter",
        "ArgMaxParameter", "ClipParameter", "ConcatParameter", "BatchNormParameter",
        "BiasParameter", "ContrastiveLossParameter", "ConvolutionParameter", "CropParameter",
        "DataParameter", "DropoutParameter", "DummyDataParameter", "EltwiseParameter",
        "ELUParameter", "EmbedParameter", "ExpParameter", "FlattenParameter",
        "HDF5DataParameter", "HDF5OutputParameter", "HingeLossParameter", "ImageDataParameter",
        "InfogainLossParameter", "InnerProductParameter", "InputParameter", "LogParameter",
        "LRNParameter", "MemoryDataParameter", "MVNParameter", "ParameterParameter",
        "PoolingParameter", "PowerParameter", "PythonParameter", "RecurrentParameter",
        "ReductionParameter", "ReLUParameter", "ReshapeParameter", "ScaleParameter",
        "SigmoidParameter", "SliceParameter", "SoftmaxParameter", "SwishParameter",
        "TanHParameter", "TileParameter", "ThresholdParameter", "WindowDataParameter",
        "SPPParameter", "V1LayerParameter", "V0LayerParameter", "PReLUParameter",
    }  # fmt: skip
    mycaffe = {"MemoryLossParameter", "RLParameter"}
    assert bvlc | mycaffe <= set(caffe_pb2.DESCRIPTOR.message_types_by_name)
    assert set(caffe_pb2.DESCRIPTOR.enum_types_by_name) == {"Phase"}
    # Each LayerParameter parameter field holds a message of the matching name.
    layer = caffe_pb2.LayerParameter.DESCRIPTOR
    params = {f.name: f.message_type.name for f in layer.fields if f.name.endswith("_param")}
    bvlc_params = {f.name for f in schema("bvlc", "LayerParameter").DESCRIPTOR.fields}
    params = {n: m for n, m in params.items() if n in bvlc_params}
    # transform_param, loss_param, 47 type-specific ones (102..148) and memory_loss_param.
    assert len(params) == 50
    assert sorted(layer.fields_by_name[n].number for n in params)[2:-1] == list(range(102, 149))
    assert params["pooling_param"] == "PoolingParameter"
    assert params["clip_param"] == "ClipParameter"
    assert params["batch_norm_param"] == "BatchNormParameter"
    assert params["argmax_param"] == "ArgMaxParameter"
    assert _field("V1LayerParameter", "layer").message_type.full_name == "caffe.V0LayerParameter"


def test_v0_layer_parameter_fields():
    expected = {
        "name", "type", "num_output", "biasterm", "weight_filler", "bias_filler", "pad",
        "kernelsize", "group", "stride", "pool", "dropout_ratio", "local_size", "alpha", "beta",
        "k", "source", "scale", "meanfile", "batchsize", "cropsize", "mirror", "blobs",
        "blobs_lr", "weight_decay", "rand_skip", "det_fg_threshold", "det_bg_threshold",
        "det_fg_fraction", "det_context_pad", "det_crop_mode", "new_num", "new_channels",
        "new_height", "new_width", "shuffle_images", "concat_dim", "hdf5_output_param",
    }  # fmt: skip
    assert set(caffe_pb2.V0LayerParameter.DESCRIPTOR.fields_by_name) == expected


def test_extensions_round_trip():
    solver = caffe_pb2.SolverParameter(type="SGD")
    solver.rl_param.gamma = 0.9
    solver.rl_param.env = "cartpole"
    layer = caffe_pb2.LayerParameter(name="loss", type="MemoryLoss")
    layer.memory_loss_param.normalize_by_length = True
    for msg in (solver, layer):
        again = type(msg).FromString(msg.SerializeToString())
        assert again == msg
        text = text_format.MessageToString(msg)
        assert text_format.Parse(text, type(msg)()) == msg


# --------------------------------------------------------------------------------------------
# The oracle's files


def _binary_files() -> list[Path]:
    return sorted(
        p for p in GOLDEN.rglob("*") if p.suffix in (".caffemodel", ".solverstate") and p.is_file()
    )


def _text_files() -> list[Path]:
    return sorted(p for root in (GOLDEN, MODELS) for p in root.rglob("*.prototxt"))


def _unknown_count(msg) -> int:
    """Unknown fields in `msg` and, recursively, in every message it holds."""
    count = len(unknown_fields.UnknownFieldSet(msg))
    for field, value in msg.ListFields():
        if field.type != FD.TYPE_MESSAGE:
            continue
        for sub in value if field.is_repeated else [value]:
            count += _unknown_count(sub)
    return count


def _rel(path: Path) -> str:
    for root in (GOLDEN, MODELS):
        if path.is_relative_to(root):
            return f"{root.name}/{path.relative_to(root)}"
    return str(path)


def test_oracle_files_present():
    require(GOLDEN)
    require(MODELS)
    binaries = _binary_files()
    assert sum(p.suffix == ".caffemodel" for p in binaries) >= 200
    assert sum(p.suffix == ".solverstate" for p in binaries) >= 19
    assert len(_text_files()) >= 250


@pytest.mark.parametrize("path", _binary_files(), ids=_rel)
def test_binary_file_round_trips(path):
    data = path.read_bytes()
    cls = caffe_pb2.SolverState if path.suffix == ".solverstate" else caffe_pb2.NetParameter
    msg = cls.FromString(data)
    assert _unknown_count(msg) == 0
    assert msg.IsInitialized()
    # Caffe writes fields in number order, as protobuf does: the bytes come back identical.
    assert msg.SerializeToString() == data
    # With unknown fields dropped, nothing changes either.
    msg.DiscardUnknownFields()
    assert msg.SerializeToString() == data


@pytest.mark.parametrize("path", _text_files(), ids=_rel)
def test_text_file_parses(path):
    cls = caffe_pb2.SolverParameter if "solver" in path.name else caffe_pb2.NetParameter
    msg = text_format.Parse(path.read_text(), cls())
    assert msg.IsInitialized()
    # Printing and re-reading reproduces the message.
    assert text_format.Parse(text_format.MessageToString(msg), cls()) == msg


def test_unknown_field_check_catches_fork_fields():
    # A layer carrying field 9999, which no schema defines.
    layer = caffe_pb2.LayerParameter(name="data").SerializeToString() + b"\xfa\xf0\x04\x00"
    net = caffe_pb2.NetParameter.FromString(b"\xa2\x06" + bytes([len(layer)]) + layer)
    assert _unknown_count(net) == 1
