"""runtime/train/snapshots.py with a fork's snapshot step: a train net running py-R-FCN's
built-in anchor target layer (form ``rfcn``) snapshots ``rpn_bbox_pred`` un-normalised as
py-R-FCN's lib/fast_rcnn/train.py does (weights × stds tiled over the anchors, bias × stds +
means, float64 rounded to float32), so the .caffemodel tests without normalisation; the solver
keeps training on the blobs as trained, and a restore from the snapshot goes on bit for bit.
``rfcn_bbox`` (py-R-FCN's proposal target layer): each of the 2 agnostic classes' 4 stds
repeated over the position-sensitive maps. py-faster-rcnn's built-in proposal target layer
(the frcnn form, end2end targets normalised) snapshots ``bbox_pred`` as its train.py does."""

from __future__ import annotations

import numpy as np
import pytest

import caffe2jax as caffe
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.python_layer import python_layers, snapshot_weights
from caffe2jax.proto import caffe_pb2

STDS = np.array([0.1, 0.1, 0.2, 0.2])

NET = """
name: "tiny_rpn"
layer { name: "data" type: "DummyData" top: "data" top: "gt" top: "im_info"
  dummy_data_param { shape { dim: 1 dim: 3 dim: 4 dim: 4 } shape { dim: 1 dim: 5 }
    shape { dim: 1 dim: 3 } data_filler { type: "gaussian" std: 1 }
    data_filler { type: "constant" value: 20 } data_filler { type: "constant" value: 64 } } }
layer { name: "rpn_cls_score" type: "Convolution" bottom: "data" top: "rpn_cls_score"
  convolution_param { num_output: 6 kernel_size: 1 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "rpn_bbox_pred" type: "Convolution" bottom: "data" top: "rpn_bbox_pred"
  convolution_param { num_output: 12 kernel_size: 1 weight_filler { type: "gaussian" std: 0.1 }
    bias_filler { type: "constant" value: 0.3 } } }
layer { name: "rpn-data" type: "Python" bottom: "rpn_cls_score" bottom: "gt" bottom: "im_info"
  top: "labels" top: "targets" top: "w_in" top: "w_out"
  python_param { module: "rpn.anchor_target_layer" layer: "AnchorTargetLayer"
    param_str: "'feat_stride': 16\\n'scales': !!python/tuple [1]" } }
layer { name: "loss" type: "EuclideanLoss" bottom: "rpn_bbox_pred" bottom: "targets" top: "loss" }
layer { name: "silence" type: "Silence" bottom: "labels" bottom: "w_in" bottom: "w_out" }
"""


def _solver(tmp_path, dialect: str) -> caffe.SGDSolver:
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(
        f'net: "{tmp_path / "net.prototxt"}"\nbase_lr: 0.01\nlr_policy: "fixed"\n'
        f'momentum: 0.9\nmax_iter: 10\nrandom_seed: 1\nsnapshot_prefix: "{tmp_path / "s"}"\n'
    )
    return caffe.SGDSolver(str(tmp_path / "solver.prototxt"), python_layers="builtin",
                           dialect=dialect)  # fmt: skip


def _caffemodel(path) -> dict:
    net = caffe_pb2.NetParameter()
    net.ParseFromString(path.read_bytes())
    return {layer.name: [np.asarray(b.data, np.float32) for b in layer.blobs]
            for layer in net.layer}  # fmt: skip


def _blobs(solver, name: str) -> list:
    return [np.array(b.data) for b in solver.net.params[name]]


def test_rfcn_snapshot_unnormalises_rpn_bbox_pred_and_resumes_exactly(tmp_path):
    solver = _solver(tmp_path, "rfcn")
    solver.step(2)
    trained = _blobs(solver, "rpn_bbox_pred")
    weights, state = solver.snapshot()
    saved = _caffemodel(weights)
    stds = np.tile(STDS, 3)  # py-R-FCN: np.tile(RPN_NORMALIZE_STDS, num_anchor), means 0
    w = (trained[0].astype(np.float64) * stds[:, None, None, None]).astype(np.float32)
    b = (trained[1].astype(np.float64) * stds + 0.0).astype(np.float32)
    np.testing.assert_array_equal(saved["rpn_bbox_pred"][0].reshape(w.shape), w)
    np.testing.assert_array_equal(saved["rpn_bbox_pred"][1], b)
    assert np.abs(b - trained[1]).max() > 0.1  # bias ~0.3 × 0.1 or 0.2: not the trained one
    np.testing.assert_array_equal(  # other layers as trained
        saved["rpn_cls_score"][0].ravel(), _blobs(solver, "rpn_cls_score")[0].ravel()
    )
    for mine, before in zip(_blobs(solver, "rpn_bbox_pred"), trained):
        np.testing.assert_array_equal(mine, before)  # training goes on with the trained blobs
    solver.step(2)
    straight = _blobs(solver, "rpn_bbox_pred")
    solver.restore(str(state))  # the blobs as trained, from the resume record
    for mine, before in zip(_blobs(solver, "rpn_bbox_pred"), trained):
        np.testing.assert_array_equal(mine, before)
    solver.step(2)
    for mine, before in zip(_blobs(solver, "rpn_bbox_pred"), straight):
        np.testing.assert_array_equal(mine, before)


def test_rfcn_bbox_unnormalised_as_py_rfcn_train():
    """rfcn_bbox (2·4·k² outputs): output c × stds[c // k²] (numpy's repeat of the 8 values)."""
    text = (
        'layer { name: "input" type: "Input" top: "rpn_rois" top: "gt" input_param { '
        "shape { dim: 4 dim: 5 } shape { dim: 2 dim: 5 } } }\n"
        'layer { name: "roi-data" type: "Python" bottom: "rpn_rois" bottom: "gt" top: "rois" '
        'top: "labels" top: "targets" top: "w_in" top: "w_out" python_param { module: '
        '"rpn.proposal_target_layer" layer: "ProposalTargetLayer" '
        "param_str: \"'num_classes': 2\" } }\n"
    )
    net = load_net(text, "TRAIN", dialect="rfcn")
    rng = np.random.default_rng(0)
    w, b = rng.normal(0, 1, (8 * 9, 5, 1, 1)).astype(np.float32), rng.normal(0, 1, 72)
    params = {"rfcn_bbox": [w, b.astype(np.float32)], "other": [np.ones(3, np.float32)]}
    with python_layers("builtin"):
        out = snapshot_weights(net, params)
    stds = np.repeat(np.tile(STDS, 2), 9)
    np.testing.assert_array_equal(
        out["rfcn_bbox"][0], (w * stds[:, None, None, None]).astype(np.float32)
    )
    np.testing.assert_array_equal(
        out["rfcn_bbox"][1], (b.astype(np.float32) * stds).astype(np.float32)
    )
    assert out["other"] is params["other"]
    bad = {"rfcn_bbox": [w[:70], b[:70]]}
    with python_layers("builtin"), pytest.raises(NetError, match="rfcn_bbox"):
        snapshot_weights(net, bad)


FRCNN = """
name: "tiny_frcnn_head"
layer { name: "data" type: "DummyData" top: "feat" top: "rpn_rois" top: "gt"
  dummy_data_param { shape { dim: 128 dim: 6 } shape { dim: 4 dim: 5 } shape { dim: 1 dim: 5 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 0 }
    data_filler { type: "constant" value: 1 } } }
layer { name: "roi-data" type: "Python" bottom: "rpn_rois" bottom: "gt" top: "rois"
  top: "labels" top: "targets" top: "w_in" top: "w_out"
  python_param { module: "rpn.proposal_target_layer" layer: "ProposalTargetLayer"
    param_str: "'num_classes': 2" } }
layer { name: "bbox_pred" type: "InnerProduct" bottom: "feat" top: "bbox_pred"
  inner_product_param { num_output: 8 weight_filler { type: "gaussian" std: 0.1 }
    bias_filler { type: "constant" value: 0.3 } } }
layer { name: "cls_score" type: "InnerProduct" bottom: "feat" top: "cls_score"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss_cls" type: "SoftmaxWithLoss" bottom: "cls_score" bottom: "labels"
  top: "loss_cls" }
layer { name: "loss_bbox" type: "EuclideanLoss" bottom: "bbox_pred" bottom: "targets"
  top: "loss_bbox" }
layer { name: "silence" type: "Silence" bottom: "rois" bottom: "w_in" bottom: "w_out" }
"""


def test_frcnn_snapshot_unnormalises_bbox_pred_and_resumes_exactly(tmp_path):
    """py-faster-rcnn's built-in proposal target layer (the frcnn form; targets normalised,
    end2end's BBOX_NORMALIZE_TARGETS_PRECOMPUTED): ``bbox_pred`` snapshot as train.py's
    SolverWrapper.snapshot writes it (weights × np.tile(stds, num_classes)[:, None], bias ×
    stds + means, float64 rounded), found by name; training and restore as trained."""
    (tmp_path / "net.prototxt").write_text(FRCNN)
    (tmp_path / "solver.prototxt").write_text(
        f'net: "{tmp_path / "net.prototxt"}"\nbase_lr: 0.01\nlr_policy: "fixed"\n'
        f'momentum: 0.9\nmax_iter: 10\nrandom_seed: 1\nsnapshot_prefix: "{tmp_path / "s"}"\n'
    )
    solver = caffe.SGDSolver(str(tmp_path / "solver.prototxt"), python_layers="builtin",
                             dialect="frcnn")  # fmt: skip
    solver.step(2)
    trained = _blobs(solver, "bbox_pred")
    weights, state = solver.snapshot()
    saved = _caffemodel(weights)
    stds = np.tile(STDS, 2)  # add_bbox_regression_targets: np.tile(stds, (num_classes, 1))
    w = (trained[0].astype(np.float64) * stds[:, np.newaxis]).astype(np.float32)
    b = (trained[1].astype(np.float64) * stds + 0.0).astype(np.float32)
    np.testing.assert_array_equal(saved["bbox_pred"][0].reshape(w.shape), w)
    np.testing.assert_array_equal(saved["bbox_pred"][1], b)
    assert np.abs(b - trained[1]).max() > 0.1  # bias ~0.3 × 0.1 or 0.2: not the trained one
    np.testing.assert_array_equal(saved["cls_score"][0].ravel(),
                                  _blobs(solver, "cls_score")[0].ravel())  # fmt: skip
    for mine, before in zip(_blobs(solver, "bbox_pred"), trained):
        np.testing.assert_array_equal(mine, before)  # training goes on with the trained blobs
    solver.step(2)
    straight = [_blobs(solver, name) for name in ("bbox_pred", "cls_score")]
    solver.restore(str(state))  # the blobs as trained, from the resume record
    for mine, before in zip(_blobs(solver, "bbox_pred"), trained):
        np.testing.assert_array_equal(mine, before)
    solver.step(2)
    for name, blobs in zip(("bbox_pred", "cls_score"), straight):
        for mine, before in zip(_blobs(solver, name), blobs):
            np.testing.assert_array_equal(mine, before, err_msg=name)


def test_frcnn_net_without_bbox_pred_snapshots_blobs_as_trained():
    """train.py finds the layer by its name only (``net.params.has_key('bbox_pred')``): a net
    whose box regressor has another name is written as trained, as py-faster-rcnn writes it;
    so is a net running the user's own layer (Caffe's snapshot). A ``bbox_pred`` of a width
    that is no multiple of 4 is refused, naming it."""
    net = load_net(FRCNN.replace('"bbox_pred"', '"box_deltas"'), "TRAIN", dialect="frcnn")
    params = {"box_deltas": [np.ones((8, 6), np.float32), np.ones(8, np.float32)]}
    with python_layers("builtin"):
        assert snapshot_weights(net, params) is params
    theirs = load_net(FRCNN, "TRAIN", dialect="frcnn")
    params = {"bbox_pred": [np.ones((8, 6), np.float32), np.ones(8, np.float32)]}
    with python_layers("user"):
        assert snapshot_weights(theirs, params) is params
        with pytest.raises(NetError, match="'bbox_pred': 6 outputs.*py-faster-rcnn"):
            snapshot_weights(net, {"bbox_pred": [np.ones((6, 6), np.float32)]})


def test_frcnn_rpn_snapshot_blobs_as_trained():
    """py-faster-rcnn's anchor target layer (RPN_NORMALIZE_TARGETS False) registers no step:
    ``rpn_bbox_pred`` is written as trained, the params themselves."""
    net = load_net(NET, "TRAIN", dialect="frcnn")
    params = {"rpn_bbox_pred": [np.ones((12, 3, 1, 1), np.float32), np.ones(12, np.float32)]}
    with python_layers("builtin"):
        assert snapshot_weights(net, params) is params
