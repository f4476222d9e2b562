"""py-R-FCN's ProposalTargetLayer and ProposalLayer config as built-ins (lowering/forks/rfcn.py,
the form rule in frontend/forks/forms.py): a hand-worked case, a numpy transcription of py-R-FCN's
``_sample_rois`` with BATCH_SIZE −1 and AGONISTIC, the padding rows, and which form the
forks' prototxts get."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.model import Model
from caffe2jax.lowering.python_layer import python_layers
from tests import jitted
from tests.forks import FORK_MODELS
from tests.lowering.forks.test_rcnn_targets import _np_overlaps, _np_transform

MODELS = FORK_MODELS
STDS = np.array([0.1, 0.1, 0.2, 0.2])


def _model(text: str, dialect: str = "rfcn", phase: str = "TRAIN") -> Model:
    return Model(load_net(text, phase, dialect=dialect), None, jnp.float32, None)


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
    """The R-FCN train prototxt's dialect is R-FCN's: its proposal, proposal target and anchor
    target layers take py-R-FCN's form; py-faster-rcnn's prototxt keeps the Faster R-CNN
    form."""
    rfcn = _forms("rfcn_resnet50_voc_train_ohem.prototxt")
    assert rfcn["proposal"] == rfcn["roi-data"] == rfcn["rpn-data"] == "rfcn"
    assert rfcn["input-data"] == ""
    frcnn = _forms("faster_rcnn_vgg16_train.prototxt")
    assert set(frcnn.values()) == {""}


def _proposal_net(dialect: str, phase: str = "TRAIN", c: int = 40) -> Model:
    text = (
        'layer { name: "input" type: "Input" top: "prob" top: "pred" top: "info" input_param {'
        f" shape {{ dim: 1 dim: 18 dim: {c} dim: {c} }}"
        f" shape {{ dim: 1 dim: 36 dim: {c} dim: {c} }}"
        " shape { dim: 1 dim: 3 } } }\n"
        'layer { name: "proposal" type: "Python" bottom: "prob" bottom: "pred" bottom: "info" '
        'top: "rois" python_param { module: "rpn.proposal_layer" layer: "ProposalLayer" '
        "param_str: \"'feat_stride': 16\" } }\n"
    )
    return _model(text, dialect, phase)


def test_proposal_layer_rfcn_train_config():
    """rfcn_end2end_ohem.yml: RPN_POST_NMS_TOP_N 300 in TRAIN (py-faster-rcnn's: 2000), and
    the deltas un-normalised first (RPN_NORMALIZE_TARGETS): the R-FCN form on ``pred`` is
    the Faster R-CNN form on ``pred`` × stds, cut to 300."""
    rng = np.random.default_rng(0)
    feed = {"prob": rng.uniform(0, 1, (1, 18, 40, 40)), "pred": rng.normal(0, 0.5, (1, 36, 40, 40)),
            "info": [[640, 640, 1]]}  # fmt: skip
    rfcn = _run(_proposal_net("rfcn"), feed)["rois"]
    scaled = dict(feed, pred=feed["pred"] * np.tile(STDS, 9).reshape(1, 36, 1, 1))
    frcnn = _run(_proposal_net("frcnn"), scaled)["rois"]
    assert rfcn.shape == (300, 5) and frcnn.shape == (2000, 5)
    np.testing.assert_allclose(rfcn, frcnn[:300], atol=1e-4)  # the same NMS, fewer kept


# -- py-R-FCN's RPN target normalisation (rfcn_end2end_ohem.yml's RPN_NORMALIZE_TARGETS) -------

USER = Path(__file__).parents[2] / "pycaffe"
USER_MODULES = ("rpn", "fast_rcnn", "roi_data_layer")


@pytest.fixture
def rfcn_user(tmp_path):
    """tests/pycaffe/rfcn_user's layers (py-R-FCN's lib/ as the user has it: frcnn_user's
    modules with rfcn_user's over them), imported; sys.path and sys.modules put back after."""

    def forget():
        for name in [m for m in sys.modules if m.split(".")[0] in USER_MODULES]:
            del sys.modules[name]

    forget()
    folder = tmp_path / "lib"
    shutil.copytree(USER / "frcnn_user", folder)
    shutil.copytree(USER / "rfcn_user", folder, dirs_exist_ok=True)
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(str(folder))
        forget()


class _Blob:
    """The blob a class-style layer is handed: ``data`` and ``reshape``."""

    def __init__(self, data=None):
        self.data = np.zeros(0, np.float32) if data is None else np.asarray(data, np.float32)

    def reshape(self, *shape):
        self.data = np.zeros(shape, np.float32)


def _user_forward(cls, param_str: str, phase: int, bottoms: list, tops: int) -> list:
    """One forward of the user's class-style layer ``cls`` on numpy ``bottoms``."""
    instance = cls()
    instance.param_str, instance.phase = param_str, phase
    bottom, top = [_Blob(b) for b in bottoms], [_Blob() for _ in range(tops)]
    instance.setup(bottom, top)
    instance.forward(bottom, top)
    return [t.data for t in top]


ANCHOR_PARAM = "'feat_stride': 16 \\n'scales': !!python/tuple [1, 2]"


def _anchor_net(dialect: str, h: int, w: int, g: int) -> Model:
    text = (
        'layer { name: "input" type: "Input" top: "score" top: "gt" top: "info" input_param { '
        f"shape {{ dim: 1 dim: 12 dim: {h} dim: {w} }} shape {{ dim: {g} dim: 5 }} "
        "shape { dim: 1 dim: 3 } } }\n"
        'layer { name: "rpn-data" type: "Python" bottom: "score" bottom: "gt" bottom: "info" '
        'top: "labels" top: "targets" top: "w_in" top: "w_out" python_param { module: '
        f'"rpn.anchor_target_layer" layer: "AnchorTargetLayer" param_str: "{ANCHOR_PARAM}" }} }}\n'
    )
    return _model(text, dialect)


def test_anchor_target_normalised_as_rfcn_user_layer(rfcn_user):
    """The R-FCN form's anchor targets equal py-R-FCN's AnchorTargetLayer (rfcn_user: targets
    (t − 0) / (0.1, 0.1, 0.2, 0.2)) on the same inputs, jitted; no anchor is subsampled
    (fewer than 256 labelled). The Faster R-CNN form is unchanged: raw targets, same labels
    and weights."""
    h, w = 5, 6
    gt = np.array([[10, 12, 40, 35, 1], [50, 20, 90, 70, 3]], np.float64)
    info = np.array([[h * 16 - 3, w * 16 - 1, 1.0]])
    feed = {"score": np.zeros((1, 12, h, w)), "gt": gt, "info": info}
    with python_layers("builtin"):  # the user's rpn module is importable here
        rfcn = _run(_anchor_net("rfcn", h, w, 2), feed)
        frcnn = _run(_anchor_net("frcnn", h, w, 2), feed)
    user = rfcn_user("rpn.anchor_target_layer").AnchorTargetLayer
    ref = _user_forward(user, ANCHOR_PARAM.replace("\\n", "\n"), 0,
                        [feed["score"], gt.reshape(2, 5, 1, 1), info], 4)  # fmt: skip
    for name, r in zip(("labels", "targets", "w_in", "w_out"), ref):
        np.testing.assert_allclose(rfcn[name], r, rtol=1e-5, atol=2e-5, err_msg=name)
    assert (rfcn["labels"] == 1).sum() >= 2 and np.abs(rfcn["targets"]).max() > 1
    for name in ("labels", "w_in", "w_out"):
        np.testing.assert_array_equal(frcnn[name], rfcn[name], err_msg=name)
    stds = np.tile(STDS, 6).reshape(1, 24, 1, 1)
    np.testing.assert_allclose(frcnn["targets"], rfcn["targets"] * stds, rtol=1e-5, atol=1e-6)


def _proposal_feed(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"prob": rng.uniform(0, 1, (1, 18, 12, 12)), "pred": rng.normal(0, 1, (1, 36, 12, 12)),
            "info": np.array([[192, 180, 1.0]])}  # fmt: skip


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_proposal_layer_as_rfcn_user_layer(rfcn_user, phase):
    """The R-FCN form's proposals equal py-R-FCN's ProposalLayer (rfcn_user) in each phase,
    jitted: in TRAIN the deltas un-normalised (× stds + means) before decoding, in TEST as
    they are (the two phases give other proposals from the same inputs). The rows after
    py-R-FCN's are the padding."""
    feed = _proposal_feed()
    with python_layers("builtin"):  # the user's rpn module is importable here
        ours = _run(_proposal_net("rfcn", phase, 12), feed)["rois"]
    user = rfcn_user("rpn.proposal_layer").ProposalLayer
    bottoms = [feed["prob"], feed["pred"], feed["info"]]
    ref = {p: _user_forward(user, "'feat_stride': 16", p, bottoms, 1)[0] for p in (0, 1)}
    mine = ref[0 if phase == "TRAIN" else 1]
    n = len(mine)
    assert 20 < n <= 300 and ours.shape == (300, 5)
    np.testing.assert_allclose(ours[:n], mine, rtol=1e-5, atol=1e-3)
    assert not ours[n:].any()
    assert len(ref[0]) != len(ref[1]) or not np.allclose(ref[0], ref[1], atol=1)
