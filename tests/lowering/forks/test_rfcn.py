"""py-R-FCN's ProposalTargetLayer and ProposalLayer config as built-ins (lowering/forks/rfcn.py,
the form rule in frontend/forks/forms.py): a hand-worked case, a numpy transcription of py-R-FCN's
``_sample_rois`` with BATCH_SIZE −1 and AGONISTIC, the padding rows, and which form the
forks' prototxts get."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.model import Model
from tests import jitted
from tests.forks import FORK_MODELS
from tests.lowering.forks.test_rcnn_targets import _np_overlaps, _np_transform

MODELS = FORK_MODELS
STDS = np.array([0.1, 0.1, 0.2, 0.2])


def _model(text: str, dialect: str = "rfcn") -> Model:
    return Model(load_net(text, "TRAIN", dialect=dialect), None, jnp.float32, None)


def _target_net(r: int, g: int, dialect: str = "rfcn", classes: int = 2) -> Model:
    text = (
        'layer { name: "input" type: "Input" top: "rpn_rois" top: "gt" input_param { '
        f"shape {{ dim: {r} dim: 5 }} shape {{ dim: {g} dim: 5 }} }} }}\n"
        'layer { name: "roi-data" type: "Python" bottom: "rpn_rois" bottom: "gt" top: "rois" '
        'top: "labels" top: "targets" top: "w_in" top: "w_out" python_param { module: '
        '"rpn.proposal_target_layer" layer: "ProposalTargetLayer" param_str: '
        f"\"'num_classes': {classes}\" }} }}\n"
    )
    return _model(text, dialect)


def _run(model: Model, inputs: dict, seed: int = 0) -> dict:
    params, state = model.init(0)
    feed = {k: jnp.asarray(v, jnp.float32) for k, v in inputs.items()}
    out = jitted.forward(model, params, state, feed, jax.random.key(seed))[0]
    return {k: np.asarray(v) for k, v in out.items()}


def test_hand_worked_every_candidate_kept_agnostic_targets():
    """gt [0,0,31,31] class 3; roi [0,0,35,31] IoU 32/36 (fg, targets ((16−18)/36, 0,
    log(32/36), 0)/stds in slot 1 whatever the class); roi [16,0,47,31] IoU 1/3 (bg); roi
    [60,60,70,70] IoU 0 (bg: BG_THRESH_LO 0); the gt appended (fg, zero targets); a zero
    proposal row and the padding gt row are not candidates: rows 5 and 6 are padding."""
    rois = np.array([[0, 0, 0, 35, 31], [0, 16, 0, 47, 31], [0, 60, 60, 70, 70], [0] * 5], float)
    gt = np.array([[0, 0, 31, 31, 3], [0, 0, 0, 0, 0]], float)
    out = _run(_target_net(4, 2), {"rpn_rois": rois, "gt": gt})
    assert out["rois"].shape == (6, 5, 1, 1) and out["labels"].shape == (6, 1, 1, 1)
    assert out["targets"].shape == out["w_in"].shape == out["w_out"].shape == (6, 8, 1, 1)
    r, lab, t = out["rois"][..., 0, 0], out["labels"].ravel(), out["targets"][..., 0, 0]
    assert lab.tolist()[:2] == [3, 3] and lab.tolist()[2:] == [0, 0, -1, -1]
    assert {tuple(x) for x in r[:2].tolist()} == {(0, 0, 0, 35, 31), (0, 0, 0, 31, 31)}
    assert {tuple(x) for x in r[2:4].tolist()} == {(0, 16, 0, 47, 31), (0, 60, 60, 70, 70)}
    assert not r[4:].any() and not t[2:].any() and not out["w_in"][2:].any()
    i = [tuple(x) for x in r.tolist()].index((0, 0, 0, 35, 31))
    want = np.array([(16 - 18) / 36, 0, np.log(32 / 36), 0]) / STDS
    np.testing.assert_allclose(t[i, 4:], want, rtol=1e-5, atol=1e-6)
    assert not t[:, :4].any()
    np.testing.assert_array_equal(out["w_in"][:2, 4:, 0, 0], 1)
    np.testing.assert_array_equal(out["w_out"], out["w_in"])


def test_matches_numpy_sample_rois_with_batch_size_minus_one():
    """Random proposals around two gt boxes: the output is every candidate once (fg then bg),
    each with py-R-FCN's label and agnostic targets; two seeds give other orders, same set."""
    rng = np.random.default_rng(3)
    gt = np.array([[30, 40, 90, 100, 1], [100, 20, 180, 90, 3], [0, 0, 0, 0, 0]], float)
    rois = np.concatenate([np.zeros((300, 1)), gt[rng.integers(0, 2, 300), :4]], 1)
    rois[:, 1:] += rng.normal(0, 20, (300, 4))
    rois[:, 3:] = np.maximum(rois[:, 3:], rois[:, 1:3] + 4)
    rois[280:] = 0  # the proposal layer's padding rows
    runs = [_run(_target_net(300, 3), {"rpn_rois": rois, "gt": gt}, seed) for seed in (0, 1)]
    cands = np.vstack([rois[:280], np.hstack([np.zeros((2, 1)), gt[:2, :4]])])
    ov = _np_overlaps(cands[:, 1:], gt[:2, :4])
    fg = ov.max(1) >= 0.5
    assert 10 < fg.sum() < 270
    for out in runs:
        r, lab = out["rois"].reshape(-1, 5), out["labels"].ravel()
        t = out["targets"].reshape(-1, 8)
        assert len(r) == 303 and (lab[282:] == -1).all() and not r[282:].any()
        assert (lab[: fg.sum()] > 0).all() and (lab[fg.sum() : 282] == 0).all()
        seen = set()
        for row, label, tt in zip(r[:282], lab[:282], t[:282]):
            i = int(np.argmin(np.abs(cands - row).sum(1)))
            seen.add(i)
            k = ov[i].argmax()
            assert label == (gt[k, 4] if fg[i] else 0)
            want = np.zeros(8)
            if fg[i]:
                want[4:] = _np_transform(cands[i : i + 1, 1:], gt[k : k + 1, :4])[0] / STDS
            np.testing.assert_allclose(tt, want, rtol=1e-4, atol=1e-4)
        assert len(seen) == 282
    assert not np.array_equal(runs[0]["rois"], runs[1]["rois"])


def test_faster_rcnn_form_unchanged_outside_the_rfcn_dialect():
    out = _run(_target_net(3, 2, dialect="frcnn", classes=4),
               {"rpn_rois": np.zeros((3, 5)), "gt": [[0, 0, 31, 31, 2], [0] * 5]})  # fmt: skip
    assert out["rois"].shape == (128, 5) and out["targets"].shape == (128, 16)


def _forms(name: str) -> dict[str, str]:
    net = load_net(MODELS / name, "TRAIN")
    return {layer.name: layer.form for layer in net.layers if layer.type == "Python"}


def test_forks_prototxts_get_their_form():
    """The R-FCN train prototxt's dialect is R-FCN's: its proposal and proposal target layers
    take py-R-FCN's form; py-faster-rcnn's prototxt keeps the Faster R-CNN form."""
    rfcn = _forms("rfcn_resnet50_voc_train_ohem.prototxt")
    assert rfcn["proposal"] == rfcn["roi-data"] == "rfcn"
    assert rfcn["rpn-data"] == rfcn["input-data"] == ""
    frcnn = _forms("faster_rcnn_vgg16_train.prototxt")
    assert set(frcnn.values()) == {""}


def _proposal_net(dialect: str) -> Model:
    text = (
        'layer { name: "input" type: "Input" top: "prob" top: "pred" top: "info" input_param {'
        " shape { dim: 1 dim: 18 dim: 40 dim: 40 } shape { dim: 1 dim: 36 dim: 40 dim: 40 }"
        " shape { dim: 1 dim: 3 } } }\n"
        'layer { name: "proposal" type: "Python" bottom: "prob" bottom: "pred" bottom: "info" '
        'top: "rois" python_param { module: "rpn.proposal_layer" layer: "ProposalLayer" '
        "param_str: \"'feat_stride': 16\" } }\n"
    )
    return _model(text, dialect)


def test_proposal_layer_rfcn_train_config():
    """rfcn_end2end_ohem.yml: RPN_POST_NMS_TOP_N 300 in TRAIN (py-faster-rcnn's: 2000)."""
    rng = np.random.default_rng(0)
    feed = {"prob": rng.uniform(0, 1, (1, 18, 40, 40)), "pred": rng.normal(0, 0.1, (1, 36, 40, 40)),
            "info": [[640, 640, 1]]}  # fmt: skip
    rfcn, frcnn = (_run(_proposal_net(d), feed)["rois"] for d in ("rfcn", "frcnn"))
    assert rfcn.shape == (300, 5) and frcnn.shape == (2000, 5)
    np.testing.assert_array_equal(rfcn, frcnn[:300])  # the same NMS, fewer kept
