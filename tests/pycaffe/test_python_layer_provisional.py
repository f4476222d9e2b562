"""Python layers whose tops are provisional until their forward (lowering/model.py's probes):
py-faster-rcnn's AnchorTargetLayer (tests/pycaffe/frcnn_user) gives its tops in ``setup``
from the data layer's setup size (cfg.TRAIN.SCALES / MAX_SIZE) and reshapes them only in
``forward``, so with images of another size the RPN loss cannot take the setup shapes. Caffe
reshapes each layer just before it runs, so this trains; here the net is built up to the
anchor target layer, its forward runs, and the pass runs again at the real shapes. Results
must not depend on the setup size: each run is compared with one whose setup size is the
image's (the path without probes), and the RPN classification loss with numpy."""

from __future__ import annotations

import pickle
import re
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

import caffe2jax as caffe
from tests.cli_runner import run_cli

USER = Path(__file__).parent / "frcnn_user"
MODULES = ("rpn", "roi_data_layer", "fast_rcnn")
SIZES = ((96, 128), (112, 96))  # (height, width) of the images: not the setup size
# a small RPN (stride 16) on py-faster-rcnn's data and anchor target layers; anchors of
# 32-128 px ('scales': (2, 4, 8)) fit the images
NET = """name: "rpn"
layer { name: 'input-data' type: 'Python' top: 'data' top: 'im_info' top: 'gt_boxes'
  python_param { module: 'roi_data_layer.layer' layer: 'RoIDataLayer' param_str: "PARAMS" } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 4 stride: 4
    weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
  convolution_param { num_output: 8 kernel_size: 4 stride: 4
    weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "rpn_cls_score" type: "Convolution" bottom: "conv2" top: "rpn_cls_score"
  convolution_param { num_output: 18 kernel_size: 1 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "rpn_bbox_pred" type: "Convolution" bottom: "conv2" top: "rpn_bbox_pred"
  convolution_param { num_output: 36 kernel_size: 1 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "rpn_cls_score_reshape" type: "Reshape" bottom: "rpn_cls_score"
  top: "rpn_cls_score_reshape" reshape_param { shape { dim: 0 dim: 2 dim: -1 dim: 0 } } }
layer { name: 'rpn-data' type: 'Python' bottom: 'rpn_cls_score' bottom: 'gt_boxes'
  bottom: 'im_info' bottom: 'data' top: 'rpn_labels' top: 'rpn_bbox_targets'
  top: 'rpn_bbox_inside_weights' top: 'rpn_bbox_outside_weights'
  python_param { module: 'rpn.anchor_target_layer' layer: 'AnchorTargetLayer'
    param_str: "'feat_stride': 16\\n'scales': !!python/tuple [2, 4, 8]" } }
layer { name: "rpn_loss_cls" type: "SoftmaxWithLoss" bottom: "rpn_cls_score_reshape"
  bottom: "rpn_labels" propagate_down: 1 propagate_down: 0 top: "rpn_cls_loss" loss_weight: 1
  loss_param { ignore_label: -1 normalize: true } }
layer { name: "rpn_loss_bbox" type: "SmoothL1Loss" bottom: "rpn_bbox_pred"
  bottom: "rpn_bbox_targets" bottom: 'rpn_bbox_inside_weights'
  bottom: 'rpn_bbox_outside_weights' top: "rpn_loss_bbox" loss_weight: 1
  smooth_l1_loss_param { sigma: 3.0 } }
"""


def _forget_modules() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in MODULES]:
        del sys.modules[name]


@pytest.fixture
def checkout(tmp_path):
    """The user's checkout (tests/pycaffe/frcnn_user) on sys.path, as tools/_init_paths.py
    puts lib/ there."""
    folder = tmp_path / "lib"
    shutil.copytree(USER, folder)
    _forget_modules()
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    _forget_modules()


def write_net(folder: Path, setup: tuple[int, int], roidb: Path | None = None) -> Path:
    """The net with the data layer's setup size ``setup`` (cfg.TRAIN.SCALES, MAX_SIZE)."""
    params = f"'num_classes': 21\\n'scale': {setup[0]}\\n'max_size': {setup[1]}"
    if roidb is not None:  # pickled, the order drawn from a seed (no script to give them)
        params += f"\\n'roidb': '{roidb}'\\n'seed': 3"
    path = folder / f"rpn_{setup[0]}x{setup[1]}.prototxt"
    path.write_text(NET.replace("PARAMS", params))
    return path


def images(folder: Path) -> list[dict]:
    """A roidb of one image per size in SIZES, 2 boxes each."""
    rng = np.random.default_rng(5)
    out = []
    for i, (h, w) in enumerate(SIZES):
        path = folder / f"{i}.png"
        cv2.imwrite(str(path), rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        boxes = np.array([[8, 10, 60, 70], [40, 30, w - 9, h - 5]], np.float32)
        out.append({"image": str(path), "boxes": boxes, "gt_classes": np.array([3, 7], np.int32),
                    "flipped": False})  # fmt: skip
    return out


def softmax_loss(scores: np.ndarray, labels: np.ndarray) -> float:
    """Caffe's SoftmaxWithLoss over axis 1, ignore_label -1, normalized by the valid count."""
    s = scores.astype(np.float64)
    logp = s - s.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    lab = labels.reshape(labels.shape[0], *labels.shape[2:]).astype(int)
    valid = lab >= 0
    picked = np.take_along_axis(logp, np.where(valid, lab, 0)[:, None], 1)[:, 0]
    return float(-(picked * valid).sum() / max(valid.sum(), 1))


def _counting(monkeypatch) -> list:
    """Count the anchor target layer's forwards (each pass must run it once, as Caffe)."""
    import rpn.anchor_target_layer as anchor

    calls: list = []
    original = anchor.AnchorTargetLayer.forward

    def forward(self, bottom, top):
        calls.append(bottom[0].data.shape)
        original(self, bottom, top)

    monkeypatch.setattr(anchor.AnchorTargetLayer, "forward", forward)
    return calls


WANTED = ["rpn_labels", "rpn_cls_score_reshape"]


def _forward(net, image: dict) -> dict:
    """One forward of pycaffe's ``net`` on ``image``: the RPN's labels, scores and losses."""
    net.layers[0].set_roidb([image])
    np.random.seed(11)  # the anchor target layer's npr.choice draws
    return {k: np.array(v) for k, v in net.forward(blobs=WANTED).items()}


def test_forward_at_an_image_size_not_the_setup_size(tmp_path, checkout, monkeypatch):
    roidb = images(tmp_path)
    calls = _counting(monkeypatch)
    net = caffe.Net(str(write_net(tmp_path, (160, 160))), caffe.TRAIN)  # setup 160x160
    net.save(str(tmp_path / "w.caffemodel"))
    assert net.blobs["rpn_labels"].data.shape == (1, 1, 9 * 10, 10)  # setup's provisional tops
    probed = _forward(net, roidb[0])
    h, w = SIZES[0][0] // 16, SIZES[0][1] // 16
    assert calls == [(1, 18, h, w)]  # its forward ran once: the pass ran again on its record
    assert probed["rpn_labels"].shape == (1, 1, 9 * h, w)
    loss = softmax_loss(probed["rpn_cls_score_reshape"], probed["rpn_labels"])
    np.testing.assert_allclose(probed["rpn_cls_loss"], loss, rtol=1e-5)
    # the same image with the setup size its own: no provisional tops on the way
    same = caffe.Net(str(write_net(tmp_path, SIZES[0])), caffe.TRAIN,
                     weights=str(tmp_path / "w.caffemodel"))  # fmt: skip
    reference = _forward(same, roidb[0])
    for key, value in reference.items():
        np.testing.assert_array_equal(probed[key], value, err_msg=key)
    # another size: the tops its last forward left are provisional again
    other = _forward(net, roidb[1])
    h, w = SIZES[1][0] // 16, SIZES[1][1] // 16
    assert calls[2:] == [(1, 18, h, w)]  # after the reference net's
    assert other["rpn_labels"].shape == (1, 1, 9 * h, w)
    loss = softmax_loss(other["rpn_cls_score_reshape"], other["rpn_labels"])
    np.testing.assert_allclose(other["rpn_cls_loss"], loss, rtol=1e-5)


def _solver(folder: Path, net: Path, name: str) -> Path:
    path = folder / f"{name}_solver.prototxt"
    path.write_text(
        f'train_net: "{net}"\nbase_lr: 0.01\nlr_policy: "fixed"\nmomentum: 0.9\n'
        f"weight_decay: 0.0005\ndisplay: 1\nmax_iter: 2\nsnapshot: 0\nrandom_seed: 5\n"
        f'snapshot_after_train: true\nsnapshot_prefix: "{folder / name}"\n'
    )
    return path


def _caffemodel(path: Path) -> dict[str, list[np.ndarray]]:
    from caffe2jax.proto import caffe_pb2

    net = caffe_pb2.NetParameter()
    net.ParseFromString(path.read_bytes())
    return {layer.name: [np.array(b.data, np.float32).reshape(b.shape.dim) for b in layer.blobs]
            for layer in net.layer if layer.blobs}  # fmt: skip


def test_solver_step_and_cli_train_at_an_image_size_not_the_setup_size(tmp_path, checkout,
                                                                       monkeypatch):  # fmt: skip
    """Two iterations: pycaffe's solver.step with the setup size 160x160 (its first pass a
    probe), ``caffe2jax train`` with the images' size as the setup size (no probe); the same
    losses and weights."""
    with open(tmp_path / "roidb.pkl", "wb") as f:
        pickle.dump(images(tmp_path)[:1] * 2, f)
    calls = _counting(monkeypatch)
    probed = write_net(tmp_path, (160, 160), tmp_path / "roidb.pkl")
    solver = caffe.SGDSolver(str(_solver(tmp_path, probed, "probed")))
    losses = []
    for _ in range(2):
        solver.step(1)
        blobs = solver.net.blobs
        losses.append(float(blobs["rpn_cls_loss"].data) + float(blobs["rpn_loss_bbox"].data))
    h, w = SIZES[0][0] // 16, SIZES[0][1] // 16
    assert calls == [(1, 18, h, w)] * 2  # once per pass
    mine = {name: [np.array(b.data) for b in blobs] for name, blobs in solver.net.params.items()}

    net = write_net(tmp_path, SIZES[0], tmp_path / "roidb.pkl")
    monkeypatch.setenv("PYTHONPATH", f"{checkout}:{Path.cwd()}")
    done = run_cli("train", "--solver", _solver(tmp_path, net, "cli"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    logged = [float(v) for v in re.findall(r"Iteration \d+ \(.*\), loss = (\S+)", done.stderr)]
    np.testing.assert_allclose(logged, losses, rtol=1e-5)
    theirs = _caffemodel(tmp_path / "cli_iter_2.caffemodel")
    assert theirs.keys() == mine.keys()
    for name, blobs in mine.items():
        for a, b in zip(blobs, theirs[name]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=name)


COPY = '''import numpy as np
import caffe2jax as caffe


class Copy(caffe.Layer):
    """Its top is its bottom, shaped only in forward (one row short with param_str 'short')."""

    def setup(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        rows = bottom[0].data[: len(bottom[0].data) - (self.param_str == "short")]
        top[0].reshape(*rows.shape)
        top[0].data[...] = rows
'''


@pytest.mark.parametrize("short", [False, True])
def test_a_shape_still_wrong_after_forward_is_one_line(tmp_path, monkeypatch, short):
    """Input rows 4 at Net::Init, 6 in the forward: the Python layer's tops stay (4,) until
    its forward (``net.reshape()`` refuses them, as Caffe's Net::Reshape). When the forward
    gives 6 rows the sum takes them; when it gives 5 the Eltwise refuses them in one line
    naming it, as Caffe's Reshape would."""
    (tmp_path / "copy_layer.py").write_text(COPY)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "net.prototxt"
    path.write_text(
        'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 4 } } }\n'
        'layer { name: "copy" type: "Python" bottom: "data" top: "c" python_param { '
        f'module: "copy_layer" layer: "Copy" param_str: "{"short" if short else ""}" }} }}\n'
        'layer { name: "sum" type: "Eltwise" bottom: "c" bottom: "data" top: "s" }\n'
    )
    net = caffe.Net(str(path), caffe.TEST)
    net.blobs["data"].reshape(6)
    net.blobs["data"].data[...] = np.arange(6)
    with pytest.raises(caffe.CaffeError, match="layer 'sum'"):
        net.reshape()  # Caffe's Net::Reshape: the Python layer's tops (4,) as they stand
    if not short:
        np.testing.assert_array_equal(net.forward()["s"], 2 * np.arange(6))
        return
    with pytest.raises(caffe.CaffeError) as err:
        net.forward()
    message = str(err.value)
    assert "\n" not in message and "layer 'sum' (type Eltwise)" in message, message
