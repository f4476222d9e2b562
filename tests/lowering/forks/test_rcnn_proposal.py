"""py-faster-rcnn's rpn.proposal_layer.ProposalLayer as a built-in
(lowering/forks/rcnn_proposal.py): OpenCV dnn's Proposal layer where it applies (no min-size filter
there), a numpy transcription of the py-faster-rcnn steps with the filter, its anchors, and a user's
own module winning."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.forks.rcnn_proposal import generate_anchors, parse_param_str
from tests import jitted
from tests.lowering.opencv_parity import both, input_layer, rel_to_max

PVANET = (
    "{'feat_stride': 16, 'ratios': [0.333, 0.5, 0.667, 1, 1.5, 2, 3], "
    "'scales': [2, 3, 5, 9, 16, 32]}"
)


def _inputs(h: int, w: int, a: int, scale: float, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(1, 2, a, h, w))
    prob = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    return {
        "prob": prob.reshape(1, 2 * a, h, w).astype(np.float32),
        "deltas": (rng.normal(size=(1, 4 * a, h, w)) * 0.3).astype(np.float32),
        "im_info": np.array([[h * 16 - 5, w * 16 - 3, scale]], np.float32),
    }


def _text(inputs: dict, param_str: str = "'feat_stride': 16", tops=("rois", "scores")) -> str:
    top = " ".join(f'top: "{t}"' for t in tops)
    return input_layer({k: v.shape for k, v in inputs.items()}) + (
        f'layer {{ name: "rois" type: "Python" bottom: "prob" bottom: "deltas" '
        f'bottom: "im_info" {top} python_param {{ module: "rpn.proposal_layer" '
        f'layer: "ProposalLayer" param_str: "{param_str}" }} }}\n'
    )


def _cv_text(inputs: dict, scales=(8, 16, 32)) -> str:
    scale = " ".join(f"scale: {s}" for s in scales)
    return input_layer({k: v.shape for k, v in inputs.items()}) + (
        'layer { name: "rois" type: "Proposal" bottom: "prob" bottom: "deltas" '
        'bottom: "im_info" top: "rois" top: "scores" proposal_param { feat_stride: 16 '
        f"base_size: 16 ratio: 0.5 ratio: 1 ratio: 2 {scale} pre_nms_topn: 6000 "
        "post_nms_topn: 300 nms_thresh: 0.7 } }\n"
    )


@pytest.mark.parametrize(
    ("h", "w", "scales"), [(10, 12, (8, 16, 32)), (7, 9, (4, 8, 16, 32)), (20, 15, (8, 16, 32))]
)
def test_proposals_match_opencv(tmp_path, h, w, scales):
    """im_info's scale is small, so RPN_MIN_SIZE·scale < 1 pixel drops nothing (OpenCV's
    Proposal has no min-size filter)."""
    inputs = _inputs(h, w, 3 * len(scales), 0.01, seed=h)
    tuple_str = "!!python/tuple [" + ", ".join(str(s) for s in scales) + "]"
    param = "'feat_stride': 16 \\n'scales': " + tuple_str
    ours, theirs = both(tmp_path, _text(inputs, param), inputs, ["rois"],
                        cv_text=_cv_text(inputs, scales))  # fmt: skip
    o, t = ours["rois"], theirs["rois"]
    assert o.shape == t.shape == (300, 5)
    assert (o[:, 3] > 0).sum() > 50  # kept proposals, then zero rows
    assert rel_to_max(o, t) <= 1e-5


def _reference(inputs: dict, pre=6000, post=300, thresh=0.7, min_size=16, anchors=None):
    """py-faster-rcnn's ProposalLayer.forward, transcribed in float64 numpy."""
    anchors = generate_anchors() if anchors is None else anchors
    prob, deltas, info = inputs["prob"], inputs["deltas"], inputs["im_info"][0]
    a, (h, w) = anchors.shape[0], prob.shape[-2:]
    sx, sy = np.meshgrid(np.arange(w) * 16, np.arange(h) * 16)
    shifts = np.vstack((sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel())).T
    boxes = (anchors[None] + shifts[:, None]).reshape(-1, 4)
    d = deltas.transpose(0, 2, 3, 1).reshape(-1, 4).astype(np.float64)
    scores = prob[:, a:].transpose(0, 2, 3, 1).ravel()
    bw, bh = boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1
    cx, cy = boxes[:, 0] + 0.5 * bw, boxes[:, 1] + 0.5 * bh
    pcx, pcy = d[:, 0] * bw + cx, d[:, 1] * bh + cy
    pw, ph = np.exp(d[:, 2]) * bw, np.exp(d[:, 3]) * bh
    p = np.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw, pcy + 0.5 * ph], 1)
    p = np.clip(p, 0, [info[1] - 1, info[0] - 1, info[1] - 1, info[0] - 1])
    ws, hs = p[:, 2] - p[:, 0] + 1, p[:, 3] - p[:, 1] + 1
    keep = np.where((ws >= min_size * info[2]) & (hs >= min_size * info[2]))[0]
    p, scores = p[keep], scores[keep]
    order = np.argsort(-scores, kind="stable")[:pre]
    p = p[order]
    areas = (p[:, 2] - p[:, 0] + 1) * (p[:, 3] - p[:, 1] + 1)
    kept, rest = [], np.arange(len(p))
    while rest.size:
        i, rest = rest[0], rest[1:]
        kept.append(i)
        xx1, yy1 = np.maximum(p[i, 0], p[rest, 0]), np.maximum(p[i, 1], p[rest, 1])
        xx2, yy2 = np.minimum(p[i, 2], p[rest, 2]), np.minimum(p[i, 3], p[rest, 3])
        inter = np.maximum(0, xx2 - xx1 + 1) * np.maximum(0, yy2 - yy1 + 1)
        rest = rest[inter / (areas[i] + areas[rest] - inter) <= thresh]
    p = p[kept[:post]]
    return np.hstack([np.zeros((len(p), 1)), p])


def test_min_size_filter_and_ordering_match_py_faster_rcnn():
    inputs = _inputs(12, 14, 9, 1.6, seed=3)  # RPN_MIN_SIZE·scale = 25.6 pixels
    model = caffe2jax.compile(_text(inputs, tops=("rois",)))
    rois = np.asarray(jitted.forward(model, {}, {}, inputs)[0]["rois"])
    want = _reference(inputs, min_size=16)
    unfiltered = _reference(inputs, min_size=0)
    assert len(want) < len(unfiltered)  # the filter dropped something
    np.testing.assert_allclose(rois[: len(want)], want, rtol=1e-5, atol=1e-3)
    assert (rois[len(want) :] == 0).all()


def test_train_phase_takes_cfg_train():
    inputs = _inputs(20, 20, 9, 0.01)  # 3,600 anchors: more than either post-NMS count
    text = _text(inputs, tops=("rois",))
    train = jitted.forward(caffe2jax.compile(text, phase="TRAIN"), {}, {}, inputs)[0]["rois"]
    test = jitted.forward(caffe2jax.compile(text, phase="TEST"), {}, {}, inputs)[0]["rois"]
    assert train.shape == (2000, 5) and test.shape == (300, 5)


def test_anchors_and_param_str():
    first = [[-84, -40, 99, 55], [-176, -88, 191, 103], [-360, -184, 375, 199]]
    np.testing.assert_array_equal(generate_anchors()[:3], first)
    np.testing.assert_array_equal(generate_anchors()[6], [-36, -80, 51, 95])
    parsed = parse_param_str("'feat_stride': 16 \n'scales': !!python/tuple [4, 8, 16, 32]")
    assert parsed == {"feat_stride": 16.0, "scales": (4.0, 8.0, 16.0, 32.0)}
    inputs = _inputs(4, 4, 9, 1.0)
    with pytest.raises(NetError, match="feat_stride"):
        caffe2jax.compile(_text(inputs, "'scales': [8]"))


USER_LAYER = """
import numpy as np
import caffe2jax as caffe


class ProposalLayer(caffe.Layer):
    def reshape(self, bottom, top):
        top[0].reshape(1, 5)

    def forward(self, bottom, top):
        top[0].data[...] = [[0, 1, 2, 3, 4]]
"""


def test_a_users_own_rpn_module_wins(tmp_path, monkeypatch):
    (tmp_path / "rpn").mkdir()
    (tmp_path / "rpn" / "__init__.py").write_text("")
    (tmp_path / "rpn" / "proposal_layer.py").write_text(textwrap.dedent(USER_LAYER))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("rpn", "rpn.proposal_layer"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    try:
        inputs = _inputs(4, 4, 9, 1.0)
        model = caffe2jax.compile(_text(inputs, tops=("rois",)))
        rois = np.asarray(jitted.forward(model, {}, {}, inputs)[0]["rois"])
        np.testing.assert_array_equal(rois, [[0, 1, 2, 3, 4]])
    finally:
        for name in ("rpn.proposal_layer", "rpn"):
            sys.modules.pop(name, None)


def _pvanet_like(path) -> str:
    """The end of PVANet's test net (sanghoon/pva-faster-rcnn models/pvanet/example_train/
    test.prototxt) on a small trunk: its 84- and 168-channel RPN heads, its Reshape / Softmax /
    Reshape, its single-quoted Python proposal layer with its param_str (7 ratios × 6 scales),
    its 6×6 ROIPooling and its 6-wide im_info."""
    text = f"""name: "pva_like"
input: "data"
input_shape {{ dim: 1 dim: 3 dim: 96 dim: 128 }}
input: "im_info"
input_shape {{ dim: 1 dim: 6 }}
layer {{ name: "convf" type: "Convolution" bottom: "data" top: "convf"
  convolution_param {{ num_output: 8 kernel_size: 3 stride: 16 pad: 1
    weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "rpn_cls_score" type: "Convolution" bottom: "convf" top: "rpn_cls_score"
  convolution_param {{ num_output: 84 kernel_size: 1
    weight_filler {{ type: "gaussian" std: 1 }} }} }}
layer {{ name: "rpn_bbox_pred" type: "Convolution" bottom: "convf" top: "rpn_bbox_pred"
  convolution_param {{ num_output: 168 kernel_size: 1
    weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ bottom: "rpn_cls_score" top: "rpn_cls_score_reshape" name: "rpn_cls_score_reshape"
  type: "Reshape" reshape_param {{ shape {{ dim: 0 dim: 2 dim: -1 dim: 0 }} }} }}
layer {{ name: "rpn_cls_prob" type: "Softmax" bottom: "rpn_cls_score_reshape" top: "rpn_cls_prob" }}
layer {{
  name: 'rpn_cls_prob_reshape'
  type: 'Reshape'
  bottom: 'rpn_cls_prob'
  top: 'rpn_cls_prob_reshape'
  reshape_param {{ shape {{ dim: 0 dim: 84 dim: -1 dim: 0 }} }}
}}
layer {{
  name: 'proposal'
  type: 'Python'
  bottom: 'rpn_cls_prob_reshape'
  bottom: 'rpn_bbox_pred'
  bottom: 'im_info'
  top: 'rois'
  top: 'scores'
  include {{ phase: TEST }}
  python_param {{
    module: 'rpn.proposal_layer'
    layer: 'ProposalLayer'
    param_str: "{PVANET}"
  }}
}}
layer {{ name: "roi_pool_conv5" type: "ROIPooling" bottom: "convf" bottom: "rois"
  top: "roi_pool_conv5" roi_pooling_param {{ pooled_w: 6 pooled_h: 6 spatial_scale: 0.0625 }} }}
"""
    path.write_text(text)
    return str(path)


def test_pvanet_param_str_gives_42_anchors_with_its_ratios():
    """generate_anchors(ratios=PVANet's, scales=PVANet's): 42 anchors, ratio-major; ratio 0.333
    at scale 2 is round(√(256/0.333)) = 28 by round(28·0.333) = 9 pixels, times 2."""
    settings = parse_param_str(PVANET)
    anchors = generate_anchors(16, settings["ratios"], settings["scales"])
    assert anchors.shape == (42, 4)
    np.testing.assert_array_equal(anchors[0], [7.5 - 27.5, 7.5 - 8.5, 7.5 + 27.5, 7.5 + 8.5])
    np.testing.assert_array_equal(anchors[3 * 6 + 4], [-120, -120, 135, 135])  # ratio 1, 16
    # py-RFCN-priv's base_size: a base box of 8 pixels, centre 3.5
    np.testing.assert_array_equal(generate_anchors(8, (1,), (2,)), [[-4, -4, 11, 11]])


def test_pvanet_like_test_net_runs_jitted_with_42_anchors(tmp_path):
    """The net runs forward under jit (caffe2jax.Net's path), and its rois are py-faster-rcnn's
    proposals from PVANet's 42 anchors for the net's own RPN outputs."""
    net = caffe2jax.Net(_pvanet_like(tmp_path / "test.prototxt"), caffe2jax.TEST)
    rng = np.random.default_rng(0)
    net.blobs["data"].data[...] = rng.normal(size=(1, 3, 96, 128))
    net.blobs["im_info"].data[...] = [[96, 128, 0.5, 0.5, 96, 128]]
    net.forward()
    settings = parse_param_str(PVANET)
    feed = {
        "prob": net.blobs["rpn_cls_prob_reshape"].data,
        "deltas": net.blobs["rpn_bbox_pred"].data,
        "im_info": net.blobs["im_info"].data,
    }
    want = _reference(feed, anchors=generate_anchors(16, settings["ratios"], settings["scales"]))
    rois = net.blobs["rois"].data
    assert net.blobs["rpn_cls_prob_reshape"].data.shape == (1, 84, 6, 8)
    assert len(want) > 20 and net.blobs["roi_pool_conv5"].data.shape == (300, 8, 6, 6)
    np.testing.assert_allclose(rois[: len(want)], want, rtol=1e-5, atol=1e-3)
    assert (rois[len(want) :] == 0).all()


def test_anchor_count_mismatch_names_the_place_the_layer_and_what_it_expected(tmp_path):
    path = tmp_path / "test.prototxt"
    _pvanet_like(path)
    path.write_text(path.read_text().replace("'ratios': [0.333, 0.5, 0.667, 1, 1.5, 2, 3], ", ""))
    line = path.read_text().splitlines().index("  name: 'proposal'") + 1
    with pytest.raises(NetError) as err:
        caffe2jax.compile(str(path))
    assert str(err.value) == (
        f"{path}:{line}: layer 'proposal' (type Python): bottoms need 2·A = 36 and 4·A = 72 "
        "channels (A = 18 anchors: 3 ratios × 6 scales), got [1, 84, 6, 8] and [1, 168, 6, 8]"
    )
