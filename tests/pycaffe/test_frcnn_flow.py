"""py-faster-rcnn's tools/train_net.py + lib/fast_rcnn/train.py flow with ``import caffe``
changed to ``import caffe2jax as caffe``, against a mini user checkout in its layout
(tests/pycaffe/frcnn_user: a RoIDataLayer served with ``set_roidb`` and an AnchorTargetLayer,
both class-style reading ``self.param_str_``; the proposal and proposal target layers are
caffe2jax's built-ins: the fixture's copy of the checkout leaves their modules out)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

import caffe2jax as caffe
from caffe2jax.frontend import caffe_pb2
from examples.detection.frcnn_tiny_net import net_text
from examples.detection.synthetic_boxes import make_image

USER = Path(__file__).parent / "frcnn_user"
STDS = np.array([0.1, 0.1, 0.2, 0.2])


@pytest.fixture
def user_checkout(tmp_path):
    """The checkout's lib folder on sys.path, as tools/_init_paths.py puts it, without its
    proposal and proposal target layers (the built-ins run for them:
    test_frcnn_own_layers.py runs the user's); removed after."""
    lib = tmp_path / "lib"
    shutil.copytree(USER, lib)
    for module in ("proposal_layer", "proposal_target_layer"):
        (lib / "rpn" / f"{module}.py").unlink()
    sys.path.insert(0, str(lib))
    yield
    sys.path.remove(str(lib))
    for name in [m for m in sys.modules if m.split(".")[0] in ("rpn", "roi_data_layer",
                                                                 "fast_rcnn")]:  # fmt: skip
        del sys.modules[name]


def _roidb(folder: Path, count: int) -> list[dict]:
    """A roidb as pascal_voc.gt_roidb() + append_flipped_images() make it: two boxes each."""
    rng = np.random.default_rng(4)
    roidb = []
    while len(roidb) < count:
        chw, boxes, labels = make_image(rng, 64)
        if len(labels) != 2:  # the user's layer serves a fixed (2, 5) gt_boxes
            continue
        path = folder / f"{len(roidb)}.png"
        cv2.imwrite(str(path), chw.transpose(1, 2, 0))
        entry = {"image": str(path), "boxes": boxes.astype(np.float32), "width": 64,
                 "height": 64, "gt_classes": labels.astype(np.int32), "flipped": False}  # fmt: skip
        flipped = dict(entry, flipped=True, boxes=entry["boxes"].copy())
        flipped["boxes"][:, [0, 2]] = 64 - entry["boxes"][:, [2, 0]] - 1
        roidb += [entry, flipped]
    return roidb


def _snapshot(solver, path: Path):
    """train.py's SolverWrapper.snapshot: un-normalize bbox_pred, save, restore."""
    net = solver.net
    orig_0 = net.params["bbox_pred"][0].data.copy()
    orig_1 = net.params["bbox_pred"][1].data.copy()
    stds = np.tile(STDS, 4)
    net.params["bbox_pred"][0].data[...] = net.params["bbox_pred"][0].data * stds[:, np.newaxis]
    net.params["bbox_pred"][1].data[...] = net.params["bbox_pred"][1].data * stds + 0.0
    net.save(str(path))
    net.params["bbox_pred"][0].data[...] = orig_0
    net.params["bbox_pred"][1].data[...] = orig_1
    return orig_0, orig_1


def test_train_net_flow(tmp_path, user_checkout):
    text = net_text("unused").replace(
        "'num_classes': 4 \\n'source': 'unused' \\n'scale': 64", "'num_classes': 4"
    )
    (tmp_path / "train.prototxt").write_text(text)
    (tmp_path / "solver.prototxt").write_text(
        f'train_net: "{tmp_path / "train.prototxt"}"\nbase_lr: 0.01\nlr_policy: "step"\n'
        "gamma: 0.1\nstepsize: 50000\ndisplay: 0\nmomentum: 0.9\nweight_decay: 0.0005\n"
        f'snapshot: 0\nsnapshot_prefix: "{tmp_path / "vgg16_faster_rcnn"}"\niter_size: 2\n'
    )
    caffe.set_mode_gpu()
    caffe.set_device(0)
    np.random.seed(3)
    caffe.set_random_seed(3)
    solver = caffe.SGDSolver(str(tmp_path / "solver.prototxt"))
    layer = solver.net.layers[0]
    assert type(layer).__name__ == "RoIDataLayer" and layer.param_str_ == "'num_classes': 4"
    layer.set_roidb(_roidb(tmp_path, 8))
    assert type(solver.net.layers[solver.net._layer_names.index("rpn-data")]).__name__ != (
        "AnchorTargetLayer"
    )  # a compiled layer's view; its class runs through host callbacks
    losses = []
    for _ in range(24):
        solver.step(1)
        losses.append(sum(float(solver.net.blobs[b].data) for b in
                          ("rpn_cls_loss", "rpn_loss_bbox", "loss_cls", "loss_bbox")))  # fmt: skip
    assert solver.iter == 24 and np.isfinite(losses).all()
    assert np.mean(losses[-6:]) < 0.8 * np.mean(losses[:6]), losses
    path = tmp_path / f"vgg16_faster_rcnn_iter_{solver.iter}.caffemodel"
    orig_0, orig_1 = _snapshot(solver, path)
    np.testing.assert_array_equal(solver.net.params["bbox_pred"][0].data, orig_0)
    saved = caffe_pb2.NetParameter()
    saved.ParseFromString(path.read_bytes())
    blobs = {layer.name: layer.blobs for layer in saved.layer}["bbox_pred"]
    w = np.asarray(blobs[0].data).reshape(orig_0.shape)
    np.testing.assert_allclose(w, orig_0 * np.tile(STDS, 4)[:, None], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(blobs[1].data), orig_1 * np.tile(STDS, 4), rtol=1e-6)
