"""`caffe2jax summary` (caffe2jax/cli/summary.py, summary_shapes.py) on the forks'
development set: every train and test prototxt is listed, with its data layers' shapes where
their parameters fix them, "from the data source" where only the data can tell, and the
reason a layer caffe2jax does not lower yet has no shape."""

from __future__ import annotations

import re

import pytest

from caffe2jax.cli.main import main
from tests.cli_runner import run_cli
from tests.forks import FORK_MODELS, model_names
from tests.frontend.forks.test_catalog import PHASES


def _summary(capsys, *args) -> str:
    assert main(["summary", *map(str, args)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", model_names())
def test_every_development_net_is_listed(capsys, name):
    for phase in PHASES.get(name, ("TRAIN", "TEST")):
        out = _summary(capsys, FORK_MODELS / name, "--phase", phase, "--define", "NUM_LABELS=21")
        assert "Initializing net" in out and "Network initialization done." in out
        assert out.count("Creating Layer ") >= 20
        assert "Top shape:" in out


def test_fork_data_layers_shapes_without_data(capsys):
    ssd = _summary(capsys, FORK_MODELS / "ssd_mobilenet_train.prototxt", "--phase", "TRAIN")
    assert "(dialect ssd: SSD)" in ssd
    assert "Top shape: 24 ? 300 300 (? from the data source)" in ssd  # resize 300x300
    assert "Top shape: 1 1 ? 8 (? from the data source)" in ssd  # one row per box
    assert "data_param.source not found: trainval_lmdb/" in ssd  # every SSD layer is lowered
    c3d = _summary(capsys, FORK_MODELS / "c3d_v10_ucf101_finetune_train.prototxt",
                   "--phase", "TRAIN")  # fmt: skip
    assert "Top shape: 30 3 16 112 112 (18063360)" in c3d  # batch, RGB, length, crop
    segnet = _summary(capsys, FORK_MODELS / "segnet_basic_train.prototxt", "--phase", "TRAIN")
    assert "Top shape: 4 3 ? ? (? from the data source)" in segnet  # no size given: the images


def test_supported_layers_after_known_shapes_are_shaped(capsys):
    out = _summary(capsys, FORK_MODELS / "pspnet101_cityscapes_713.prototxt")
    assert "Top shape: 1 3 713 713 (1525107)" in out
    assert "Top shape: 1 64 357 357 (8156736)" in out  # conv1_1_3x3_s2 before the first BN
    assert "not every shape" not in out  # BN (PSPNet's form) and Interp are lowered now
    assert "Top shape: 1 19 713 713 (9659011)" in out


def test_a_ceil_mode_net_compiles_whole(capsys):
    out = _summary(capsys, FORK_MODELS / "densenet201_shicai.prototxt")
    assert "(dialect ceil_mode: the ceil_mode patch)" in out
    assert "not every shape" not in out and "Top shape: 1 1000 1 1 (1000)" in out


def test_dialect_and_define_options_are_checked():
    proc = run_cli("summary", FORK_MODELS / "densenet201_shicai.prototxt", "--dialect", "nope")
    assert proc.returncode == 1 and "unknown dialect 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("summary", FORK_MODELS / "deeplab_v1_vgg128_noup_test.prototxt")
    assert proc.returncode == 1
    assert re.search(
        r"noup_test\.prototxt:\d+:\d+: layer 'fc8_\$\{EXP\}' \(type CONVOLUTION\): template "
        r"variable \$\{NUM_LABELS\}",
        proc.stderr,
    )


def test_c3d_crnn_deeplab_segnet_enet_data_and_3d_shapes(capsys):
    """Issue 22's 3-D layers, ContinuationIndicator and the fork data layers are shaped; what
    still stops each net is named (the training layers of issue 26)."""
    c3d = _summary(capsys, FORK_MODELS / "c3d_v10_ucf101_finetune_train.prototxt")
    assert "Top shape: 30 (30)" in c3d  # VideoData's labels
    assert "Top shape: 30 512 1 4 4 (245760)" in c3d  # pool5: C3D's ceil rounding, 8192 per clip
    assert "Top shape: 30 101 (3030)" in c3d and "not supported" not in c3d
    c3d = _summary(capsys, FORK_MODELS / "c3d_v11_ucf101_train_simple.prototxt",
                   "--stage", "test-on-val")  # fmt: skip
    assert "Top shape: 30 3 16 112 112 (18063360)" in c3d and "Top shape: 30 101 (3030)" in c3d
    crnn = _summary(capsys, FORK_MODELS / "crnn_train.prototxt", "--phase", "TRAIN")
    assert "Top shape: 13 523 (6799)" in crnn  # ContinuationIndicator: (time_step, batch_size)
    assert "ctc_loss <- label" in crnn and "not supported" not in crnn  # CtcLoss is lowered
    deeplab = _summary(capsys, FORK_MODELS / "deeplab_v1_vgg128_noup_train.prototxt",
                       "--phase", "TRAIN", "--define", "NUM_LABELS=21")  # fmt: skip
    assert "Top shape: 30 3 321 321 (9273690)" in deeplab  # ImageSegData: crop_size 321
    assert "Top shape: 30 1 321 321 (3091230)" in deeplab
    assert "layer 'accuracy' (type SegAccuracy): a training layer of DeepLab v2" in deeplab
    enet = _summary(capsys, FORK_MODELS / "enet_encoder_train.prototxt", "--phase", "TRAIN")
    assert "Top shape: 4 1 64 128 (32768)" in enet  # 512×1024 / label_divide_factor 8
    assert "not supported" not in enet  # BN and SpatialDropout are lowered now


def test_outputs_are_listed_by_name_as_caffe_logs_them(capsys, tmp_path):
    """Net::Init logs "This network produces output" from a std::set<string>: by name."""
    convs = "".join(
        f'layer {{ name: "{t}" type: "Convolution" bottom: "data" top: "{t}" '
        "convolution_param { num_output: 1 kernel_size: 1 } }\n"
        for t in ("zz", "bb", "Mb", "Ma")
    )
    net = tmp_path / "n.prototxt"
    net.write_text('input: "data"\ninput_shape { dim: 1 dim: 1 dim: 2 dim: 2 }\n' + convs)
    out = _summary(capsys, net)
    assert re.findall(r"This network produces output (\w+)", out) == ["Ma", "Mb", "bb", "zz"]
