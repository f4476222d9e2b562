"""py-R-FCN's OHEM train net (/work/shared/forks/models/rfcn_resnet50_voc_train_ohem.prototxt:
its layer graph, param_strs, Python layers, PSROIPooling, the OHEM layers, Silence, iter_size 2
in its solver_ohem.prototxt; ResNet-50 shrunk by the test) through the USER's own Python layers
— tests/pycaffe/frcnn_user with tests/pycaffe/rfcn_user over it: py-R-FCN's RoIDataLayer,
AnchorTargetLayer, ProposalLayer and ProposalTargetLayer (every roi kept, class-agnostic 4-D
targets, tops reshaped in forward) — in pycaffe's ``solver.step`` and ``caffe2jax train``. The
losses of each pass equal a numpy computation from the blobs the user's layers gave (BVLC's
SoftmaxWithLoss with ignore, Faster R-CNN's SmoothL1Loss σ 3, BoxAnnotatorOHEM's hardest 128
and SmoothL1LossOHEM over 128)."""

from __future__ import annotations

import pickle
import re
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from google.protobuf import text_format

import caffe2jax as caffe
from caffe2jax.proto import caffe_pb2
from examples.detection.synthetic_boxes import make_image
from tests.cli_runner import run_cli

SHARED = Path("/work/shared") if Path("/work/shared").exists() else Path("../shared")
TRAIN_NET = SHARED / "forks/models/rfcn_resnet50_voc_train_ohem.prototxt"
HERE = Path(__file__).parent
MODULES = ("rpn", "roi_data_layer", "fast_rcnn")
SIZE = 64  # the images' side: a 4x4 feature map, 144 anchors (no RPN subsampling)
CLASSES = 4  # background + the 3 synthetic shapes
# ResNet-50 cut to one block per stage (res2a … res5a), its widths shrunk; the RPN's 18/36,
# the agnostic rfcn_bbox 2·4·7² kept, rfcn_cls CLASSES·7²
WIDTHS = {64: 4, 128: 4, 256: 8, 512: 8, 1024: 8, 2048: 8, 1029: CLASSES * 49}
LAST = {"res2c": "res2a", "res3d": "res3a", "res4f": "res4a", "res5c": "res5a"}
CUT = re.compile(r"^(res|bn|scale)[2-5][b-f](_|$)")
SCALES = "'scales': !!python/tuple [1, 2, 4]"  # anchors 16–64 px for 64-px images


def _forget_modules() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in MODULES]:
        del sys.modules[name]


@pytest.fixture
def checkout(tmp_path):
    """py-R-FCN's lib/ as tools/_init_paths.py puts it on sys.path: frcnn_user's modules with
    rfcn_user's over them."""
    _forget_modules()
    folder = tmp_path / "lib"
    shutil.copytree(HERE / "frcnn_user", folder)
    shutil.copytree(HERE / "rfcn_user", folder, dirs_exist_ok=True)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    _forget_modules()


def shrunk_net(folder: Path, roidb: Path) -> Path:
    """The fork's train prototxt, ResNet-50 cut and shrunk (WIDTHS, LAST), the anchors'
    scales set for SIZE-pixel images, the data layer given a pickled roidb and numpy's seed."""
    net = caffe_pb2.NetParameter()
    text_format.Parse(TRAIN_NET.read_text(), net)  # fails, not skips, when it is missing
    kept = [layer for layer in net.layer if not CUT.match(layer.name)]
    del net.layer[:]
    net.layer.extend(kept)
    for layer in net.layer:
        layer.bottom[:] = [LAST.get(b, b) for b in layer.bottom]
        conv = layer.convolution_param
        if layer.type == "Convolution":
            conv.num_output = WIDTHS.get(conv.num_output, conv.num_output)
        if layer.type == "PSROIPooling" and layer.psroi_pooling_param.output_dim == 21:
            layer.psroi_pooling_param.output_dim = CLASSES
        python = layer.python_param
        if python.module in ("rpn.anchor_target_layer", "rpn.proposal_layer"):
            python.param_str += "\n" + SCALES
        if python.module == "roi_data_layer.layer":
            python.param_str = f"'num_classes': {CLASSES}\n'roidb': '{roidb}'\n'seed': 3"
    path = folder / "train.prototxt"
    path.write_text(text_format.MessageToString(net))
    return path


def write_roidb(folder: Path, count: int, images: int) -> Path:
    """``count`` entries cycling over ``images`` synthetic SIZE-pixel images (1–3 boxes of
    classes 1–3), pickled."""
    rng = np.random.default_rng(11)
    out = []
    for i in range(images):
        chw, boxes, labels = make_image(rng, SIZE)
        cv2.imwrite(str(folder / f"{i}.png"), chw.transpose(1, 2, 0))
        out.append({"image": str(folder / f"{i}.png"), "boxes": boxes.astype(np.float32),
                    "gt_classes": labels.astype(np.int32), "flipped": False})  # fmt: skip
    with open(folder / "roidb.pkl", "wb") as f:
        pickle.dump([out[i % images] for i in range(count)], f)
    return folder / "roidb.pkl"


def solver_file(folder: Path, net: Path, **extra) -> Path:
    """py-R-FCN's solver_ohem.prototxt (iter_size 2) with a fixed lr and 2 iterations."""
    fields = "".join(f"{k}: {v}\n" for k, v in extra.items())
    path = folder / "solver.prototxt"
    path.write_text(
        f'train_net: "{net}"\nbase_lr: 0.001\nlr_policy: "fixed"\nmomentum: 0.9\n'
        f"weight_decay: 0.0005\ndisplay: 1\nsnapshot: 0\niter_size: 2\nrandom_seed: 5\n{fields}"
    )
    return path


def init_weights(net_path: Path, out: Path) -> None:
    """Random weights where the prototxt has no filler (the ImageNet layers): MSRA
    convolutions, Scale 1 / 0, BatchNorm mean 0 and variance 1."""
    net = caffe.Net(str(net_path), caffe.TRAIN)
    rng = np.random.default_rng(5)
    for name, blobs in net.params.items():
        kind = net.layer_dict[name].type
        if kind == "BatchNorm":
            blobs[0].data[...], blobs[1].data[...], blobs[2].data[...] = 0.0, 1.0, 1.0
        elif kind == "Scale":
            blobs[0].data[...], blobs[1].data[...] = 1.0, 0.0
        elif not blobs[0].data.any():
            w = blobs[0].data
            w[...] = rng.normal(0, np.sqrt(2.0 / np.prod(w.shape[1:])), w.shape)
    net.save(str(out))


# -- the numpy losses -----------------------------------------------------------------------


def softmax_loss(scores: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """BVLC's SoftmaxWithLoss over axis 1, ignore_label −1, VALID: (loss, per-position loss)."""
    s = scores.astype(np.float64)
    logp = s - s.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    lab = labels.reshape(logp.shape[:1] + logp.shape[2:]).astype(int)
    picked = np.take_along_axis(logp, np.maximum(lab, 0)[:, None], 1)[:, 0]
    each = np.where(lab >= 0, -picked, 0.0)
    return each.sum() / max((lab >= 0).sum(), 1), each


def smooth_l1(d: np.ndarray, sigma: float) -> np.ndarray:
    s2 = sigma * sigma
    return np.where(np.abs(d) < 1 / s2, 0.5 * s2 * d * d, np.abs(d) - 0.5 / s2)


def numpy_losses(b: dict[str, np.ndarray]) -> dict[str, float]:
    """The four losses of R-FCN's OHEM net from the blobs of one pass (module docstring)."""
    rpn_cls, _ = softmax_loss(b["rpn_cls_score_reshape"], b["rpn_labels"])
    d = b["rpn_bbox_inside_weights"] * (b["rpn_bbox_pred"] - b["rpn_bbox_targets"])
    rpn_box = (b["rpn_bbox_outside_weights"] * smooth_l1(d, 3.0)).sum() / len(d)
    _, each_cls = softmax_loss(b["cls_score"], b["labels"])  # the OHEM layer: no ignore
    each_box = smooth_l1(b["bbox_inside_weights"] * (b["bbox_pred"] - b["bbox_targets"]), 1.0)
    per_roi = each_cls.reshape(-1) + each_box.reshape(len(each_box), -1).sum(1)
    hard = np.zeros(len(per_roi), bool)
    hard[np.argsort(-per_roi, kind="stable")[:128]] = True  # BoxAnnotatorOHEM, one image
    labels = np.where(hard, b["labels"].reshape(-1), -1)
    np.testing.assert_array_equal(b["labels_ohem"].reshape(-1), labels)
    cls, _ = softmax_loss(b["cls_score"], labels)
    weights = np.where(hard[:, None, None, None], b["bbox_inside_weights"], 0.0)
    box = smooth_l1(weights * (b["bbox_pred"] - b["bbox_targets"]), 1.0).sum() / 128
    return {"rpn_cls_loss": rpn_cls, "rpn_loss_bbox": rpn_box, "loss_cls": cls, "loss_bbox": box}


BLOBS = ("rpn_cls_score_reshape", "rpn_labels", "rpn_bbox_pred", "rpn_bbox_targets",
         "rpn_bbox_inside_weights", "rpn_bbox_outside_weights", "cls_score", "labels",
         "bbox_pred", "bbox_targets", "bbox_inside_weights", "labels_ohem", "rpn_rois", "rois",
         "rpn_cls_loss", "rpn_loss_bbox", "loss_cls", "loss_bbox")  # fmt: skip


# -- pycaffe and the CLI --------------------------------------------------------------------


@pytest.mark.heavy  # ~8.5 min on 2 cores: each new Python-layer top shape recompiles the step
def test_solver_step_and_cli_train_run_the_users_rfcn_layers(tmp_path, checkout, monkeypatch):
    """Two ``solver.step(1)`` at iter_size 2 (four passes, each its own image and roi count):
    each step's last pass gives the numpy losses at rtol 1e-5 and the layers after the user's
    ran at its counts; then ``caffe2jax train`` (2 iterations) exits 0 and logs the same
    losses, the user's proposal layer read cfg['TRAIN']."""
    # 5 entries: no reshuffle (numpy draws) within the 4 passes; one image: each new roi count
    # compiles the whole step (tens of seconds on 2 cores)
    roidb = write_roidb(tmp_path, 5, 1)
    net = shrunk_net(checkout, roidb)
    init_weights(net, tmp_path / "init.caffemodel")
    solver = caffe.SGDSolver(str(solver_file(tmp_path, net)))
    solver.net.copy_from(str(tmp_path / "init.caffemodel"))
    import rpn.proposal_layer as proposal
    import rpn.proposal_target_layer as target

    losses = []
    for _ in range(2):
        solver.step(1)
        blobs = {k: np.array(solver.net.blobs[k].data) for k in BLOBS}
        n, (given, rois, fg) = proposal.forwards[-1][1], target.forwards[-1]
        assert blobs["rpn_rois"].shape == (n, 5) and given == n and fg > 0
        assert blobs["rois"].shape == (rois, 5, 1, 1)  # every roi kept: proposals + gt
        assert blobs["cls_score"].shape == (rois, CLASSES, 1, 1)
        assert blobs["bbox_pred"].shape == (rois, 8, 1, 1)
        for key, value in numpy_losses(blobs).items():
            np.testing.assert_allclose(blobs[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
        losses.append(solver.smoothed_loss)  # average_loss 1: the iteration's loss
    assert [key for key, _ in proposal.forwards] == ["TRAIN"] * 4  # iter_size 2: two passes
    assert target.forwards[0][1] > 1, target.forwards  # not setup's (1, 5, 1, 1)

    monkeypatch.setenv("PYTHONPATH", f"{checkout}:{Path.cwd()}")
    monkeypatch.setenv("RFCN_USER_LOG", str(tmp_path / "proposals.log"))
    cli = solver_file(tmp_path, net, max_iter=2, snapshot_prefix=f'"{tmp_path / "rfcn"}"')
    done = run_cli("train", "--solver", cli, "--weights", tmp_path / "init.caffemodel",
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    logged = [float(v) for v in re.findall(r"Iteration \d+ \(.*\), loss = (\S+)", done.stderr)]
    np.testing.assert_allclose(logged, losses, rtol=1e-5)
    keys = (tmp_path / "proposals.log").read_text().split()[::2]
    assert keys[:4] == ["TRAIN"] * 4, keys  # cfg['TRAIN'], by self.phase == 0
