"""Faster R-CNN end-to-end training through the CLI with caffe2jax's built-in py-faster-rcnn
layers (RoIDataLayer from an AnnotatedDatum LMDB, AnchorTargetLayer, ProposalLayer,
ProposalTargetLayer) plus ROIPooling and SmoothL1Loss, on a small net of the same layout as
the VGG16 one (examples/detection/frcnn_train.py runs that): the loss falls, the snapshot's
``bbox_pred`` is un-normalised as py-faster-rcnn's train.py writes it, and a resumed run ends
with the same weights, bit for bit, as an uninterrupted one."""

from __future__ import annotations

import re

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.runtime.formats.snapshot import read_snapshot
from examples.detection.frcnn_tiny_net import net_text
from examples.detection.synthetic_boxes import make_boxes
from tests.cli_runner import run_cli


def _solver(tmp_path, max_iter: int, snapshot: int) -> str:
    return (
        f'train_net: "{tmp_path / "train.prototxt"}"\nbase_lr: 0.01\nlr_policy: "step"\n'
        "gamma: 0.1\nstepsize: 50000\ndisplay: 1\nmomentum: 0.9\nweight_decay: 0.0005\n"
        f'snapshot: {snapshot}\nsnapshot_prefix: "{tmp_path / "snap" / "tiny"}"\n'
        f"iter_size: 2\nmax_iter: {max_iter}\nrandom_seed: 5\n"
    )


def _losses(log: str) -> list[float]:
    return [float(v) for v in re.findall(r"Iteration \d+ \(.*\), loss = ([-\d.e+naif]+)", log)]


def _weights(path) -> dict:
    net = caffe_pb2.NetParameter()
    net.ParseFromString(path.read_bytes())
    return {layer.name: [np.asarray(b.data) for b in layer.blobs] for layer in net.layer}


def _check_unnormalised(saved: dict, solverstate) -> None:
    """The CLI's snapshot writes ``bbox_pred`` as py-faster-rcnn's train.py does (weights ×
    np.tile(stds, num_classes)[:, None], bias × stds + means 0, float64 rounded) from the
    blobs as trained, which the resume record keeps; every other layer as trained."""
    arrays = read_snapshot(solverstate, "solver").record.arrays
    assert sorted(arrays) == ["params/bbox_pred/0", "params/bbox_pred/1"]
    stds = np.tile([0.1, 0.1, 0.2, 0.2], 4)
    w, b = (arrays[f"params/bbox_pred/{i}"].astype(np.float64) for i in (0, 1))
    np.testing.assert_array_equal(saved["bbox_pred"][0], (w * stds[:, None]).ravel()
                                  .astype(np.float32))  # fmt: skip
    np.testing.assert_array_equal(saved["bbox_pred"][1], (b * stds).astype(np.float32))


def test_train_loss_falls_and_resume_is_exact(tmp_path):
    make_boxes(tmp_path / "boxes_lmdb", count=12, size=64, seed=2)
    (tmp_path / "train.prototxt").write_text(net_text(tmp_path / "boxes_lmdb"))
    (tmp_path / "snap").mkdir()
    (tmp_path / "solver.prototxt").write_text(_solver(tmp_path, 24, 12))
    done = run_cli(
        "train", "--solver", tmp_path / "solver.prototxt", "--progress", "log", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    losses = _losses(done.stderr)
    assert len(losses) == 24 and np.isfinite(losses).all()
    assert np.mean(losses[-6:]) < 0.8 * np.mean(losses[:6]), losses
    straight = _weights(tmp_path / "snap" / "tiny_iter_24.caffemodel")
    _check_unnormalised(straight, tmp_path / "snap" / "tiny_iter_24.solverstate")
    (tmp_path / "snap" / "tiny_iter_24.caffemodel").unlink()
    (tmp_path / "snap" / "tiny_iter_24.solverstate").unlink()
    resumed = run_cli(
        "train",
        "--solver",
        tmp_path / "solver.prototxt",
        "--progress",
        "log",
        "--snapshot",
        tmp_path / "snap" / "tiny_iter_12.solverstate",
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = _weights(tmp_path / "snap" / "tiny_iter_24.caffemodel")
    assert straight.keys() == again.keys()
    for name in straight:
        for a, b in zip(straight[name], again[name]):
            np.testing.assert_array_equal(a, b, err_msg=name)
