"""py-faster-rcnn's AnchorTargetLayer and ProposalTargetLayer as built-ins
(lowering/forks/rcnn_targets.py, lowering/boxes/coders.py): hand-worked cases, a numpy transcription
of the fork's deterministic rules (overlaps, threshold labels, targets, weights) and the sampled
counts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.lowering.boxes.iou import RCNN, iou
from caffe2jax.lowering.forks import rcnn_targets as rpn_targets
from caffe2jax.lowering.forks.rcnn_proposal import generate_anchors
from tests import jitted
from tests.lowering.nets import one_layer


def _anchor_net(h, w, g, param="'feat_stride': 16 \\n'scales': !!python/tuple [1, 2]"):
    body = (
        '  type: "Python"\n  bottom: "score"\n  bottom: "gt"\n  bottom: "info"\n'
        '  top: "labels"\n  top: "targets"\n  top: "w_in"\n  top: "w_out"\n'
        f'  python_param {{ module: "rpn.anchor_target_layer" layer: "AnchorTargetLayer" '
        f'param_str: "{param}" }}'
    )
    a = 6 if "[1, 2]" in param else 9
    return one_layer(body, {"score": (1, 2 * a, h, w), "gt": (g, 5), "info": (1, 3)}, "TRAIN")


def _run(model, inputs, seed=0):
    params, state = model.init(0)
    inputs = {k: jnp.asarray(v, jnp.float32) for k, v in inputs.items()}
    return {k: np.asarray(v) for k, v in jitted.forward(model, params, state, inputs,
                                                      jax.random.key(seed))[0].items()}  # fmt: skip


def _np_overlaps(b, q):
    """utils/bbox.pyx bbox_overlaps, float64."""
    out = np.zeros((len(b), len(q)))
    for k, qq in enumerate(q):
        qa = (qq[2] - qq[0] + 1) * (qq[3] - qq[1] + 1)
        for n, bb in enumerate(b):
            iw = min(bb[2], qq[2]) - max(bb[0], qq[0]) + 1
            ih = min(bb[3], qq[3]) - max(bb[1], qq[1]) + 1
            if iw > 0 and ih > 0:
                ua = (bb[2] - bb[0] + 1) * (bb[3] - bb[1] + 1) + qa - iw * ih
                out[n, k] = iw * ih / ua
    return out


def _np_transform(ex, gt):
    ew, eh = ex[:, 2] - ex[:, 0] + 1.0, ex[:, 3] - ex[:, 1] + 1.0
    gw, gh = gt[:, 2] - gt[:, 0] + 1.0, gt[:, 3] - gt[:, 1] + 1.0
    ecx, ecy = ex[:, 0] + 0.5 * ew, ex[:, 1] + 0.5 * eh
    gcx, gcy = gt[:, 0] + 0.5 * gw, gt[:, 1] + 0.5 * gh
    return np.stack([(gcx - ecx) / ew, (gcy - ecy) / eh, np.log(gw / ew), np.log(gh / eh)], 1)


def _np_anchor_target(h, w, gt, info, scales):
    """anchor_target_layer.py forward without the subsampling (no draw happens when fewer
    than RPN_BATCHSIZE anchors are labelled), float64."""
    base = generate_anchors(scales=scales)
    a = len(base)
    sx, sy = np.meshgrid(np.arange(w) * 16, np.arange(h) * 16)
    shifts = np.vstack((sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel())).T
    allb = (base[None] + shifts[:, None]).reshape(-1, 4)
    inds = np.where((allb[:, 0] >= 0) & (allb[:, 1] >= 0) & (allb[:, 2] < info[1])
                    & (allb[:, 3] < info[0]))[0]  # fmt: skip
    anchors = allb[inds]
    ov = _np_overlaps(anchors, gt)
    arg = ov.argmax(1)
    mx = ov[np.arange(len(inds)), arg]
    gmax = ov[ov.argmax(0), np.arange(ov.shape[1])]
    best = np.where(ov == gmax)[0]
    labels = np.full(len(inds), -1.0)
    labels[mx < 0.3] = 0
    labels[best] = 1
    labels[mx >= 0.7] = 1
    assert (labels == 1).sum() <= 128 and (labels >= 0).sum() <= 256  # no draw
    targets = _np_transform(anchors, gt[arg])
    w_in = np.zeros((len(inds), 4))
    w_in[labels == 1] = 1
    w_out = np.zeros((len(inds), 4))
    w_out[labels >= 0] = 1.0 / (labels >= 0).sum()
    total = len(allb)

    def unmap(x, fill):
        out = np.full((total,) + x.shape[1:], fill, np.float64)
        out[inds] = x
        return out

    lab = unmap(labels, -1).reshape(1, h, w, a).transpose(0, 3, 1, 2).reshape(1, 1, a * h, w)
    rest = [unmap(x, 0).reshape(1, h, w, 4 * a).transpose(0, 3, 1, 2)
            for x in (targets, w_in, w_out)]  # fmt: skip
    return [lab] + rest


def test_overlaps_match_bbox_pyx():
    rng = np.random.default_rng(0)
    b = rng.uniform(0, 60, (30, 4))
    b[:, 2:] += b[:, :2]
    q = rng.uniform(0, 60, (5, 4))
    q[:, 2:] += q[:, :2]
    ours = np.asarray(iou(jnp.asarray(b, jnp.float32), jnp.asarray(q, jnp.float32), RCNN))
    np.testing.assert_allclose(ours, _np_overlaps(b, q), atol=1e-6)


def test_anchor_target_matches_numpy_rules():
    """Deterministic regime: a small image, anchors of 16–45 px, two gt boxes plus one padding
    row (class 0, masked out)."""
    h, w = 5, 6
    gt = np.array([[10, 12, 40, 35, 1], [50, 20, 90, 70, 3], [0, 0, 0, 0, 0]], np.float64)
    info = np.array([h * 16 - 3, w * 16 - 1, 1.0])
    out = _run(_anchor_net(h, w, 3), {"score": np.zeros((1, 12, h, w)), "gt": gt,
                                       "info": info[None]})  # fmt: skip
    ref = _np_anchor_target(h, w, gt[:2], info, (1, 2))
    for name, r in zip(("labels", "targets", "w_in", "w_out"), ref):
        np.testing.assert_allclose(out[name], r, atol=2e-5, err_msg=name)
    assert (out["labels"] == 1).sum() >= 2 and (out["labels"] == 0).sum() > 10


def test_anchor_target_hand_worked():
    """One gt box equal to one anchor: that anchor is fg with zero targets and weights 1; with
    the default anchors (128–512 px) on a 100 px image every anchor is outside: all −1."""
    base = generate_anchors(scales=(1, 2))  # anchor 3 (ratio 1, scale 1): [0, 0, 15, 15]
    gt = np.array([[16, 16, 31, 31, 2]], np.float64)  # anchor 3 at position (1, 1)
    out = _run(_anchor_net(3, 3, 1), {"score": np.zeros((1, 12, 3, 3)), "gt": gt,
                                       "info": np.array([[48, 48, 1.0]])})  # fmt: skip
    assert base[2].tolist() == [0, 0, 15, 15]
    lab = out["labels"].reshape(6, 3, 3)
    assert lab[2, 1, 1] == 1 and (lab == 1).sum() == 1
    t = out["targets"].reshape(6, 4, 3, 3)[2, :, 1, 1]
    np.testing.assert_allclose(t, 0, atol=1e-7)
    n = (lab >= 0).sum()
    np.testing.assert_allclose(out["w_out"].reshape(6, 4, 3, 3)[2, :, 1, 1], 1 / n, rtol=1e-6)
    big = {"score": np.zeros((1, 18, 4, 4)), "gt": gt, "info": np.array([[100, 100, 1]])}
    out = _run(_anchor_net(4, 4, 1, "'feat_stride': 16"), big)
    assert (out["labels"] == -1).all() and not out["w_in"].any()


def test_anchor_target_sampled_counts():
    """Many labelled anchors: fg capped at 128, fg + bg = 256, drawn from the unsampled
    labels; different keys draw different subsets."""
    h = w = 24
    gt = np.array([[20, 20, 300, 300, 1], [200, 40, 370, 200, 2]], np.float64)
    info = np.array([h * 16, w * 16, 1.0])
    inputs = {"score": np.zeros((1, 12, h, w)), "gt": gt, "info": info[None]}
    model = _anchor_net(h, w, 2)
    a, b = _run(model, inputs, 1)["labels"], _run(model, inputs, 2)["labels"]
    full = np.asarray(rpn_targets.anchor_labels(
        iou(jnp.asarray(rpn_targets.shifted_anchors(h, w, 16, generate_anchors(
            scales=(1, 2))), jnp.float32), jnp.asarray(gt[:, :4], jnp.float32), RCNN),
        jnp.ones(h * w * 6, bool), jnp.ones(2, bool), jax.random.key(0),
        dict(rpn_targets.ANCHOR_CFG, RPN_BATCHSIZE=10**9)))  # fmt: skip
    assert (full == 1).sum() > 128 or (full == 0).sum() > 256
    for labels in (a, b):
        nfg = int((labels == 1).sum())
        assert nfg == min(128, int((full == 1).sum()))
        assert (labels == 0).sum() == 256 - nfg
    assert not np.array_equal(a, b)


def _target_net(r, g, classes=4):
    body = (
        '  type: "Python"\n  bottom: "rpn_rois"\n  bottom: "gt"\n  top: "rois"\n'
        '  top: "labels"\n  top: "targets"\n  top: "w_in"\n  top: "w_out"\n'
        '  python_param { module: "rpn.proposal_target_layer" layer: "ProposalTargetLayer" '
        f"param_str: \"'num_classes': {classes}\" }}"
    )
    return one_layer(body, {"rpn_rois": (r, 5), "gt": (g, 5)}, "TRAIN")


def test_proposal_target_hand_worked():
    """gt [0,0,31,31] class 2; roi [0,0,35,31] has IoU 32/36 (fg), targets
    ((16−18)/36, 0, log(32/36), 0) / (0.1, 0.1, 0.2, 0.2) in class 2's columns; roi
    [16,0,47,31] has IoU 1/3 (bg); the gt itself is appended (fg, zero targets); a zero row
    is padding. 3 chosen rows fill 128 by repeating."""
    rois = np.array([[0, 0, 0, 35, 31], [0, 16, 0, 47, 31], [0, 0, 0, 0, 0]], np.float64)
    gt = np.array([[0, 0, 31, 31, 2], [0, 0, 0, 0, 0]], np.float64)
    out = _run(_target_net(3, 2), {"rpn_rois": rois, "gt": gt})
    assert out["rois"].shape == (128, 5) and out["targets"].shape == (128, 16)
    assert out["labels"][:2].tolist() == [2, 2] and out["labels"][2] == 0
    np.testing.assert_array_equal(out["rois"][3:6], out["rois"][:3])  # repeats in order
    fg = {tuple(r): i for i, r in enumerate(out["rois"][:2].tolist())}
    t = out["targets"][fg[(0, 0, 0, 35, 31)]]
    want = [(16 - 18) / 36 / 0.1, 0, np.log(32 / 36) / 0.2, 0]
    np.testing.assert_allclose(t[8:12], want, rtol=1e-5, atol=1e-6)
    assert not t[:8].any() and not t[12:].any()
    np.testing.assert_allclose(out["targets"][fg[(0, 0, 0, 31, 31)]], 0, atol=1e-7)
    np.testing.assert_array_equal(out["w_in"][:2, 8:12], 1)
    np.testing.assert_array_equal(out["w_out"], out["w_in"])
    assert not out["w_in"][2].any() and (out["rois"][2] == [0, 16, 0, 47, 31]).all()


def test_proposal_target_matches_numpy_rules():
    """Random proposals around two gt boxes: each output row's label and targets are the
    fork's for that roi; fg count min(32, #fg), then 96 distinct bg rows."""
    rng = np.random.default_rng(3)
    gt = np.array([[30, 40, 90, 100, 1], [100, 20, 180, 90, 3], [0, 0, 0, 0, 0]], np.float64)
    centers = gt[rng.integers(0, 2, 400), :4]
    rois = np.concatenate([np.zeros((400, 1)), centers + rng.normal(0, 12, (400, 4))], 1)
    far = rng.uniform(0, 150, (200, 2))
    rois[200:, 1:] = np.hstack([far, far + rng.uniform(8, 60, (200, 2))])  # mostly bg
    rois[:, 3:] = np.maximum(rois[:, 3:], rois[:, 1:3] + 4)
    out = _run(_target_net(400, 3), {"rpn_rois": rois, "gt": gt}, seed=5)
    all_rois = np.vstack([rois, np.hstack([np.zeros((2, 1)), gt[:2, :4]])])
    ov = _np_overlaps(all_rois[:, 1:], gt[:2, :4])
    nfg = int((ov.max(1) >= 0.5).sum())
    assert nfg > 32
    assert (out["labels"] > 0).sum() == 32 and (out["labels"][32:] == 0).all()
    assert len({tuple(r) for r in out["rois"].round(3).tolist()}) == 128
    for row, label, t in zip(out["rois"], out["labels"], out["targets"]):
        i = int(np.argmin(np.abs(all_rois - row).sum(1)))
        k = ov[i].argmax()
        fg = ov[i, k] >= 0.5
        assert label == (gt[k, 4] if fg else 0)
        want = np.zeros(16)
        if fg:
            c = int(gt[k, 4])
            want[4 * c:4 * c + 4] = _np_transform(all_rois[i:i + 1, 1:], gt[k:k + 1, :4])[0] / [
                0.1, 0.1, 0.2, 0.2]  # fmt: skip
        np.testing.assert_allclose(t, want, rtol=1e-4, atol=1e-4)
