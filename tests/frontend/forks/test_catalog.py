"""caffe.proto's fork fields: every development-set prototxt parses and upgrades by name, and
every fork field sits at the number caffe.proto's header rule gives it (the same numbers
frontend/forks/catalog.py and docs/forks.md list)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.forks.catalog import CAFFE2JAX_HOMES, FORKS
from caffe2jax.frontend.forks.layer_types import TRAINING_TYPES
from caffe2jax.frontend.forks.schema import schema
from caffe2jax.frontend.parse import read_net
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.frontend.upgrade import upgrade_net
from caffe2jax.lowering.registry import registered_types
from tests.forks import DEFINES, FORK_MODELS, manifest, model_names
from tests.golden import ROOT

#: The phases each development-set net builds in (a train-only file has no TEST data layer).
PHASES = {
    "c3d_v11_ucf101_train_simple.prototxt": ("TRAIN",),
    "deeplab_v1_vgg128_noup_test.prototxt": ("TEST",),
    "deeplab_v1_vgg128_noup_train.prototxt": ("TRAIN",),
    "ssd_mobilenet_train.prototxt": ("TRAIN",),
    "ssd_mobilenet_voc_test.prototxt": ("TEST",),
    "yolov3_mobilenetv3_test_eric612.prototxt": ("TEST",),
}


def test_development_set_is_there():
    assert len(model_names()) == 30
    assert all((FORK_MODELS / name).is_file() for name in model_names())


@pytest.mark.parametrize("name", model_names())
def test_prototxt_parses_upgrades_and_builds(name):
    path = FORK_MODELS / name
    net = read_net(path, defines=DEFINES)
    upgraded = upgrade_net(net, str(path))
    assert not upgraded.layers and upgraded.layer  # every net ends in the current format
    # Printing and re-reading the upgraded net gives it back: every field has a name.
    again = text_format.Parse(text_format.MessageToString(upgraded), caffe_pb2.NetParameter())
    assert again == upgraded
    for phase in PHASES.get(name, ("TRAIN", "TEST")):
        built = load_net(path, phase, defines=DEFINES)
        assert len(built.layers) >= 20


@pytest.mark.parametrize("name", model_names())
def test_manifest_fields_and_types_are_known(name):
    entry = next(e for e in manifest() if e["name"] == name)
    layer_fields = caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name
    transform = caffe_pb2.TransformationParameter.DESCRIPTOR.fields_by_name
    every_field = {f for m in _messages() for f in m.fields_by_name}
    for field in entry["non_bvlc_fields"]:
        assert field in every_field, field
        if field.endswith("_param") and field not in transform:
            assert field in layer_fields, field
    fork_types = {t for fork in FORKS for t in fork.types}
    v1_types = set(caffe_pb2.V1LayerParameter.LayerType.keys())
    for kind in entry["non_bvlc_types"]:
        if not kind.startswith("Python:"):
            assert kind in v1_types | fork_types, kind


def _messages():
    stack = list(caffe_pb2.DESCRIPTOR.message_types_by_name.values())
    while stack:
        msg = stack.pop()
        yield msg
        stack.extend(msg.nested_types)


# --------------------------------------------------------------------------------------------
# The numbering rule of caffe.proto's header

BASES = {
    "deeplab-v2": 2000, "pspnet": 2000, "rfcn": 3000, "crnn": 4000, "eric612": 5000,
    "darknet2caffe": 6000, "segnet": 7000, "enet": 7000, "c3d-v1.0": 8000,
    "deeplab-v1": 9000, "ssd": 10000, "ceil_mode": 11000, "sphereface": 21000,
    "lsoftmax": 22000, "caffe-face": 23000, "happynear": 24000, "yolov2": 31000, "ctpn": 32000,
    "textboxes": 26000,
}  # fmt: skip


def _bvlc_numbers(msg: str) -> dict[str, int]:
    try:
        cls = schema("bvlc", msg)
    except KeyError:
        return {}
    return {f.name: f.number for f in cls.DESCRIPTOR.fields}


def _placements() -> dict[tuple[str, str], int]:
    """Where the rule puts each fork field: its own number unless taken (by BVLC, MyCaffe or
    an earlier fork's field), then base + own number; a name placed earlier stays."""
    placed: dict[tuple[str, str], int] = {}
    taken: dict[str, set[int]] = {}
    for fork in FORKS:
        for msg, fields in fork.adds.items():
            used = taken.setdefault(msg, set(_bvlc_numbers(msg).values()))
            for name, number in fields.items():
                if (msg, name) in placed or name in _bvlc_numbers(msg):
                    continue
                merged = number if number not in used else BASES[fork.key] + number
                placed[msg, name] = merged
                used.add(merged)
    return placed


def _field(path: str, name: str):
    desc = caffe_pb2.DESCRIPTOR.message_types_by_name[path.split(".")[0]]
    for part in path.split(".")[1:]:
        desc = desc.nested_types_by_name[part]
    return desc.fields_by_name[name]


def test_every_fork_field_is_where_the_rule_puts_it():
    placements = _placements()
    assert len(placements) > 150
    for (msg, name), number in placements.items():
        assert _field(msg, name).number == number, (msg, name)


def test_bvlc_fields_keep_their_numbers_in_the_merged_schema():
    for msg in ("LayerParameter", "ConvolutionParameter", "PoolingParameter", "BlobProto",
                "LossParameter", "SolverParameter", "TransformationParameter"):  # fmt: skip
        for name, number in _bvlc_numbers(msg).items():
            assert _field(msg, name).number == number


def test_caffe2jax_homes_are_numbered_from_deeplab_v1_and_c3d():
    v1 = caffe_pb2.V1LayerParameter.DESCRIPTOR.fields_by_name
    for name in CAFFE2JAX_HOMES["LayerParameter"]:
        base = 8000 if name == "down_sampling_param" else 9000
        assert _field("LayerParameter", name).number == base + v1[name].number % 1000


def test_fork_v1_enum_values_follow_the_rule():
    enum = caffe_pb2.V1LayerParameter.LayerType
    assert enum.Value("IMAGE_SEG_DATA") == 9039  # DeepLab v1 39 = BVLC's DECONVOLUTION
    assert enum.Value("INTERP") == 41 and enum.Value("ONEHOT") == 56  # free in BVLC
    assert enum.Value("CONVOLUTION3D") == 8030 and enum.Value("DOWN_SAMPLING") == 8040
    assert enum.Value("ELTWISE_PRODUCT") == 8025 and enum.Value("RELU6") == 61


def test_docs_list_every_moved_field():
    docs = (ROOT / "docs" / "forks.md").read_text()
    for (msg, name), number in _placements().items():
        own = next(f.adds[msg][name] for f in FORKS if name in f.adds.get(msg, {}))
        if number != own:
            assert f"`{name}`" in docs and str(number) in docs, (msg, name, number)


def test_training_types_are_fork_types():
    fork_types = {t for fork in FORKS for t in fork.types}
    assert TRAINING_TYPES <= fork_types
    assert not TRAINING_TYPES & set(registered_types())


def test_ssd_solver_fields_parse_by_name():
    from caffe2jax.frontend.parse import read_solver

    solver = read_solver("""
        net: "train.prototxt" base_lr: 0.001 lr_policy: "multistep" gamma: 0.1
        stepvalue: 80000 stepvalue: 100000 eval_type: "detection" ap_version: "11point"
        show_per_class_result: true plateau_winsize: 10000 type: "SGD"
    """)
    assert list(solver.stepvalue) == [80000, 100000] and solver.eval_type == "detection"
    assert solver.ap_version == "11point" and solver.show_per_class_result
    assert list(solver.plateau_winsize) == [10000]
    assert caffe_pb2.SolverParameter().eval_type == "classification"
    assert caffe_pb2.SolverParameter().ap_version == "Integral"
