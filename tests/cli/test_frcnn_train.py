"""Faster R-CNN end-to-end training through the CLI with caffe2jax's built-in py-faster-rcnn
layers (RoIDataLayer from an AnnotatedDatum LMDB, AnchorTargetLayer, ProposalLayer,
ProposalTargetLayer) plus ROIPooling and SmoothL1Loss, on a small net of the same layout as
the VGG16 one (scripts/frcnn_train.py runs that): the loss falls and a resumed run ends with
the same weights, bit for bit, as an uninterrupted one."""

from __future__ import annotations

import re

import numpy as np

from caffe2jax.frontend import caffe_pb2
from scripts.frcnn_boxes import make_boxes
from tests.cli_runner import run_cli

ANCHORS = "'feat_stride': 16 \\n'scales': !!python/tuple [1, 2, 4]"


def _conv(name, bottom, n, k=3, pad=1, std=0.1):
    return (
        f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
        f"convolution_param {{ num_output: {n} kernel_size: {k} pad: {pad} "
        f'weight_filler {{ type: "gaussian" std: {std} }} }} }}\n'
        f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{name}" top: "{name}" }}\n'
    )


def _pool(name, bottom):
    return (
        f'layer {{ name: "{name}" type: "Pooling" bottom: "{bottom}" top: "{name}" '
        "pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n"
    )


def net_text(lmdb) -> str:
    """py-faster-rcnn's end2end train layout with a 4-conv backbone (stride 16), 3 classes."""
    data = f"'num_classes': 4 \\n'source': '{lmdb}' \\n'scale': 64"
    body = (
        'name: "tiny_frcnn"\n'
        'layer { name: "input-data" type: "Python" top: "data" top: "im_info" top: "gt_boxes" '
        f"python_param {{ module: 'roi_data_layer.layer' layer: 'RoIDataLayer' "
        f'param_str: "{data}" }} }}\n'
    )
    bottom = "data"
    for i, n in enumerate((8, 16, 16, 32)):
        body += _conv(f"conv{i}", bottom, n, std=0.05) + _pool(f"pool{i}", f"conv{i}")
        bottom = f"pool{i}"
    body += _conv("rpn_conv", bottom, 32, std=0.05)
    body += (
        'layer { name: "rpn_cls_score" type: "Convolution" bottom: "rpn_conv" top: '
        '"rpn_cls_score" convolution_param { num_output: 18 kernel_size: 1 weight_filler { '
        'type: "gaussian" std: 0.01 } } }\n'
        'layer { name: "rpn_bbox_pred" type: "Convolution" bottom: "rpn_conv" top: '
        '"rpn_bbox_pred" convolution_param { num_output: 36 kernel_size: 1 weight_filler { '
        'type: "gaussian" std: 0.01 } } }\n'
        'layer { name: "rpn_cls_score_reshape" type: "Reshape" bottom: "rpn_cls_score" top: '
        '"rpn_cls_score_reshape" reshape_param { shape { dim: 0 dim: 2 dim: -1 dim: 0 } } }\n'
        'layer { name: "rpn-data" type: "Python" bottom: "rpn_cls_score" bottom: "gt_boxes" '
        'bottom: "im_info" bottom: "data" top: "rpn_labels" top: "rpn_bbox_targets" top: '
        '"rpn_bbox_inside_weights" top: "rpn_bbox_outside_weights" python_param { module: '
        f"'rpn.anchor_target_layer' layer: 'AnchorTargetLayer' param_str: \"{ANCHORS}\" }} }}\n"
        'layer { name: "rpn_loss_cls" type: "SoftmaxWithLoss" bottom: "rpn_cls_score_reshape" '
        'bottom: "rpn_labels" propagate_down: 1 propagate_down: 0 top: "rpn_cls_loss" '
        "loss_weight: 1 loss_param { ignore_label: -1 normalize: true } }\n"
        'layer { name: "rpn_loss_bbox" type: "SmoothL1Loss" bottom: "rpn_bbox_pred" bottom: '
        '"rpn_bbox_targets" bottom: "rpn_bbox_inside_weights" bottom: '
        '"rpn_bbox_outside_weights" top: "rpn_loss_bbox" loss_weight: 1 '
        "smooth_l1_loss_param { sigma: 3.0 } }\n"
        'layer { name: "rpn_cls_prob" type: "Softmax" bottom: "rpn_cls_score_reshape" top: '
        '"rpn_cls_prob" }\n'
        'layer { name: "rpn_cls_prob_reshape" type: "Reshape" bottom: "rpn_cls_prob" top: '
        '"rpn_cls_prob_reshape" reshape_param { shape { dim: 0 dim: 18 dim: -1 dim: 0 } } }\n'
        'layer { name: "proposal" type: "Python" bottom: "rpn_cls_prob_reshape" bottom: '
        '"rpn_bbox_pred" bottom: "im_info" top: "rpn_rois" python_param { module: '
        f"'rpn.proposal_layer' layer: 'ProposalLayer' param_str: \"{ANCHORS}\" }} }}\n"
        'layer { name: "roi-data" type: "Python" bottom: "rpn_rois" bottom: "gt_boxes" top: '
        '"rois" top: "labels" top: "bbox_targets" top: "bbox_inside_weights" top: '
        "\"bbox_outside_weights\" python_param { module: 'rpn.proposal_target_layer' "
        "layer: 'ProposalTargetLayer' param_str: \"'num_classes': 4\" } }\n"
        'layer { name: "roi_pool5" type: "ROIPooling" bottom: "pool3" bottom: "rois" top: '
        '"pool5" roi_pooling_param { pooled_w: 3 pooled_h: 3 spatial_scale: 0.0625 } }\n'
        'layer { name: "fc6" type: "InnerProduct" bottom: "pool5" top: "fc6" '
        'inner_product_param { num_output: 64 weight_filler { type: "xavier" } } }\n'
        'layer { name: "relu6" type: "ReLU" bottom: "fc6" top: "fc6" }\n'
        'layer { name: "cls_score" type: "InnerProduct" bottom: "fc6" top: "cls_score" '
        'inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.01 } } }\n'
        'layer { name: "bbox_pred" type: "InnerProduct" bottom: "fc6" top: "bbox_pred" '
        'inner_product_param { num_output: 16 weight_filler { type: "gaussian" std: 0.001 } } }\n'
        'layer { name: "loss_cls" type: "SoftmaxWithLoss" bottom: "cls_score" bottom: "labels" '
        'propagate_down: 1 propagate_down: 0 top: "loss_cls" loss_weight: 1 }\n'
        'layer { name: "loss_bbox" type: "SmoothL1Loss" bottom: "bbox_pred" bottom: '
        '"bbox_targets" bottom: "bbox_inside_weights" bottom: "bbox_outside_weights" top: '
        '"loss_bbox" loss_weight: 1 }\n'
    )
    return body


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
