"""PVANet's C++ Proposal layer (lowering/forks/pvanet.py): parity, jitted, with
ProposalLayer::Forward_cpu of sanghoon/caffe@6068dd0 (dev_pvanet) transcribed as loops below
(generate_anchors, enumerate_proposals_cpu, sort_box, nms_cpu, retrieve_rois_cpu), its
hand-worked anchors, the small boxes it keeps at score 0, OpenCV's Proposal where it agrees,
the dialect, and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.parse import read_net
from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.forks.pvanet import pvanet_anchors
from tests import jitted
from tests.lowering.opencv_parity import both, input_layer, rel_to_max

F = np.float32
#: PVANet's comp/test.pt proposal_param (sanghoon/pva-faster-rcnn@b0dc7d2).
RATIOS, SCALES = (0.5, 0.667, 1.0, 1.5, 2.0), (3, 6, 9, 16, 32)


def _param(pre=12000, post=200, thresh=0.7, min_size=16, ratios=RATIOS, scales=SCALES) -> str:
    r = " ".join(f"ratio: {v}" for v in ratios)
    s = " ".join(f"scale: {v}" for v in scales)
    return (f"proposal_param {{ {r} {s} base_size: 16 feat_stride: 16 pre_nms_topn: {pre} "
            f"post_nms_topn: {post} nms_thresh: {thresh} min_size: {min_size} }}")  # fmt: skip


def _text(inputs: dict, param: str, tops=("rois", "scores")) -> str:
    top = " ".join(f'top: "{t}"' for t in tops)
    return input_layer({k: v.shape for k, v in inputs.items()}) + (
        f'layer {{ name: "rois" type: "Proposal" bottom: "prob" bottom: "deltas" '
        f'bottom: "im_info" {top} {param} }}\n'
    )


def _inputs(h: int, w: int, a: int, info, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(1, 2, a, h, w))
    prob = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    return {
        "prob": prob.reshape(1, 2 * a, h, w).astype(F),
        "deltas": (rng.normal(size=(1, 4 * a, h, w)) * 0.3).astype(F),
        "im_info": np.asarray([info], F),
    }


def _anchors_loop(base_size, ratios, scales) -> list[list[float]]:
    """generate_anchors, with ROUND(x) = (int)(x + 0.5)."""
    base_area, center = F(base_size * base_size), F(0.5) * F(base_size - 1)
    out = []
    for r in ratios:
        ratio_w = F(int(F(math.sqrt(base_area / F(r))) + F(0.5)))
        ratio_h = F(int(ratio_w * F(r) + F(0.5)))
        for s in scales:
            sw, sh = F(0.5) * (ratio_w * F(s) - F(1)), F(0.5) * (ratio_h * F(s) - F(1))
            out.append([center - sw, center - sh, center + sw, center + sh])
    return out


def _transform_box(box, dx, dy, dw, dh, img_w, img_h, min_w, min_h) -> int:
    """transform_box: decode, clip, and the min-size test (1 or 0)."""
    w, h = box[2] - box[0] + F(1), box[3] - box[1] + F(1)
    cx, cy = box[0] + F(0.5) * w, box[1] + F(0.5) * h
    pcx, pcy = dx * w + cx, dy * h + cy
    pw, ph = F(np.exp(dw)) * w, F(np.exp(dh)) * h
    box[:] = [pcx - F(0.5) * pw, pcy - F(0.5) * ph, pcx + F(0.5) * pw, pcy + F(0.5) * ph]
    for i, hi in enumerate((img_w, img_h, img_w, img_h)):
        box[i] = max(F(0), min(box[i], hi - F(1)))
    return int(box[2] - box[0] + F(1) >= min_w) * int(box[3] - box[1] + F(1) >= min_h)


def _iou(a, b) -> float:
    """nms.cpp's iou."""
    if a[0] > b[2] or a[1] > b[3] or a[2] < b[0] or a[3] < b[1]:
        return F(0)
    w = max(F(0), min(a[2], b[2]) - max(a[0], b[0]) + F(1))
    h = max(F(0), min(a[3], b[3]) - max(a[1], b[1]) + F(1))
    area = w * h
    area_a = (a[2] - a[0] + F(1)) * (a[3] - a[1] + F(1))
    area_b = (b[2] - b[0] + F(1)) * (b[3] - b[1] + F(1))
    return area / (area_a + area_b - area)


def _forward_cpu(inputs, pre=12000, post=200, thresh=0.7, min_size=16, ratios=RATIOS,
                 scales=SCALES) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """ProposalLayer::Forward_cpu for one image: (rois (R, 5), scores (R,))."""
    anchors = _anchors_loop(16, ratios, scales)
    prob, deltas, info = inputs["prob"][0], inputs["deltas"][0], inputs["im_info"][0]
    a, (height, width) = len(anchors), prob.shape[-2:]
    proposals = []
    for h in range(height):
        for w in range(width):
            for k in range(a):
                box = [F(w * 16) + anchors[k][0], F(h * 16) + anchors[k][1],
                       F(w * 16) + anchors[k][2], F(h * 16) + anchors[k][3]]  # fmt: skip
                d = deltas[4 * k : 4 * k + 4, h, w]
                ok = _transform_box(box, *d, info[1], info[0], min_size * info[3],
                                    min_size * info[2])  # fmt: skip
                proposals.append([*box, ok * prob[a + k, h, w]])
    order = sorted(range(len(proposals)), key=lambda i: -proposals[i][4])  # ties: index order
    boxes = [proposals[i] for i in order[: min(len(proposals), pre)]]
    dead, kept = [False] * len(boxes), []
    for i in range(len(boxes)):
        if dead[i]:
            continue
        kept.append(i)
        if len(kept) == post:
            break
        for j in range(i + 1, len(boxes)):
            if not dead[j] and _iou(boxes[i], boxes[j]) > thresh:
                dead[j] = True
    rois = np.asarray([[0, *boxes[i][:4]] for i in kept], F).reshape(-1, 5)
    return rois, np.asarray([boxes[i][4] for i in kept], F)


def _ours(inputs, param, tops=("rois", "scores")):
    model = caffe2jax.compile(_text(inputs, param, tops))
    blobs = jitted.forward(model, {}, {}, inputs)[0]
    return [np.asarray(blobs[t]) for t in tops]


def test_anchors_round_halves_up():
    """base 15, ratio 0.5: ratio_w = ROUND(√450 = 21.2) = 21, ratio_h = ROUND(10.5) = 11 (numpy's
    round, py-faster-rcnn's, gives 10); centre 7, half sides 10 and 5."""
    np.testing.assert_array_equal(pvanet_anchors(15, [0.5], [1]), [[-3, 2, 17, 12]])
    want = np.asarray(_anchors_loop(16, RATIOS, SCALES), F)
    np.testing.assert_array_equal(pvanet_anchors(16, RATIOS, SCALES), want)


@pytest.mark.parametrize(
    ("h", "w", "pre", "post", "seed", "zeros"),
    [(6, 7, 12000, 200, 0, True), (5, 9, 300, 40, 1, False)],
)
def test_rois_and_scores_match_forward_cpu(h, w, pre, post, seed, zeros):
    """scale_h ≠ scale_w, so min_size·scale_w bounds widths and min_size·scale_h heights;
    with 200 kept of 1,050, boxes kept at score 0 (too small) come out too."""
    inputs = _inputs(h, w, 25, [h * 16 - 5, w * 16 - 3, 1.6, 0.9, 1, 1], seed)
    rois, scores = _ours(inputs, _param(pre=pre, post=post))
    want_rois, want_scores = _forward_cpu(inputs, pre=pre, post=post)
    assert (want_scores == 0).any() == zeros and (want_scores > 0).any()
    n = len(want_rois)
    assert rois.shape == (min(post, pre, h * w * 25), 5) and scores.shape == (rois.shape[0],)
    np.testing.assert_allclose(rois[:n], want_rois, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(scores[:n], want_scores, rtol=1e-6, atol=1e-7)
    assert (rois[n:] == 0).all() and (scores[n:] == 0).all()


def test_all_boxes_too_small_still_come_out():
    """min_size past the image: every score is 0, yet NMS still runs over the boxes in anchor
    order and the kept ones come out (py-faster-rcnn's Python layer would give none)."""
    inputs = _inputs(4, 5, 4, [60, 75, 1, 1], seed=2)
    param = _param(min_size=1000, ratios=(0.5, 2), scales=(2, 4), post=50)
    rois, scores = _ours(inputs, param)
    want_rois, want_scores = _forward_cpu(inputs, post=50, min_size=1000, ratios=(0.5, 2),
                                          scales=(2, 4))  # fmt: skip
    assert len(want_rois) > 3 and (want_scores == 0).all() and (scores == 0).all()
    np.testing.assert_allclose(rois[: len(want_rois)], want_rois, rtol=1e-5, atol=1e-3)


def test_matches_opencv_without_small_boxes(tmp_path):
    """OpenCV's Proposal reads the same proposal_param; with min_size 0 nothing is filtered
    (OpenCV has no min-size filter)."""
    inputs = _inputs(7, 8, 25, [107, 125, 1, 1, 1, 1], seed=4)
    text = _text(inputs, _param(min_size=0, pre=6000, post=100), tops=("rois",))
    ours, theirs = both(tmp_path, text, inputs, ["rois"])
    assert rel_to_max(ours["rois"], theirs["rois"].reshape(ours["rois"].shape)) <= 1e-5


def test_dialect_and_defaults():
    net = read_net('layer { name: "p" type: "Proposal" proposal_param { ratio: 1 scale: 8 } }')
    p = net.layer[0].proposal_param
    assert (p.feat_stride, p.base_size, p.min_size) == (16, 16, 16)
    assert (p.pre_nms_topn, p.post_nms_topn) == (6000, 300)
    assert abs(p.nms_thresh - 0.7) < 1e-7
    inputs = _inputs(3, 3, 1, [40, 40, 1, 1])
    net = load_net(_text(inputs, "proposal_param { ratio: 1 scale: 8 }"))
    assert net.dialect == "pvanet"


@pytest.mark.parametrize(
    ("param", "info", "a", "message"),
    [
        ("proposal_param { scale: 8 }", [40, 40, 1, 1], 1, "at least one ratio and one scale"),
        ("proposal_param { ratio: 1 scale: 8 }", [40, 40, 1], 1, r"scale_h, scale_w"),
        ("proposal_param { ratio: 1 ratio: 2 scale: 8 }", [40, 40, 1, 1], 1, r"2·A = 4"),
    ],
)
def test_refusals_name_the_layer(param, info, a, message):
    inputs = _inputs(3, 3, a, info)
    with pytest.raises(NetError, match=message) as err:
        caffe2jax.compile(_text(inputs, param))
    assert "rois" in str(err.value) and "Proposal" in str(err.value)
