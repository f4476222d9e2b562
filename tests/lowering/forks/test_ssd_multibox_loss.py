"""lowering/forks/ssd_multibox_loss.py (SSD's MultiBoxLoss), lowering/boxes/matching.py and SSD's
SmoothL1Loss (lowering/forks/ssd.py): hand-worked matching and mining cases from the fork's
rules, and loss and gradient against a loop-by-loop NumPy transcription of the fork
(tests/lowering/multibox_oracle.py) over every option the loss reads."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.forks.ssd_multibox_loss import Settings, match_image, mine
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import net
from tests.lowering.multibox_oracle import fork_multibox

C = 4  # classes, 0 = background


def _priors(grid: int = 4) -> np.ndarray:
    """(1, 2, P·4): two square priors per cell of a grid (one crossing the border)."""
    boxes = []
    for y in range(grid):
        for x in range(grid):
            cx, cy = (x + 0.5) / grid, (y + 0.5) / grid
            for s in (0.2, 0.45):
                boxes.append([cx - s / 2, cy - s / 2, cx + s / 2, cy + s / 2])
    var = np.tile([0.1, 0.1, 0.2, 0.2], (len(boxes), 1))
    return np.stack([np.asarray(boxes), var]).reshape(1, 2, -1).astype(np.float32)


PRIOR = _priors()
P = PRIOR.shape[-1] // 4
# rows [item, group label, instance, xmin, ymin, xmax, ymax, difficult], padded with −1
LABEL = np.array(
    [[0, 1, 0, 0.10, 0.10, 0.40, 0.45, 0], [0, 3, 1, 0.55, 0.50, 0.95, 0.90, 0],
     [0, 2, 2, 0.30, 0.60, 0.50, 0.80, 1], [1, 2, 0, 0.05, 0.55, 0.60, 0.95, 0],
     [1, 1, 1, 0.62, 0.05, 0.85, 0.30, 0]] + [[-1] * 8] * 3, np.float32,
).reshape(1, 1, -1, 8)  # fmt: skip
RNG = np.random.default_rng(7)
LOC = (RNG.standard_normal((2, P * 4)) * 0.8).astype(np.float32)
CONF = (RNG.standard_normal((2, P * C)) * 1.5).astype(np.float32)


def _text(param: str, loss_param: str = "", n: int = 2, loc_classes: int = 1, classes: int = C):
    layer = ('layer { name: "mbox" type: "MultiBoxLoss" bottom: "loc" bottom: "conf" '
             f'bottom: "prior" bottom: "label" top: "loss" multibox_loss_param {{ '
             f"num_classes: {classes} {param} }} loss_param {{ {loss_param} }} }}")  # fmt: skip
    shapes = {"loc": (n, P * 4 * loc_classes), "conf": (n, P * classes), "prior": PRIOR.shape,
              "label": LABEL.shape}  # fmt: skip
    return net(layer, shapes)


def _ours(text: str, loc, conf, label=LABEL):
    model = compile_net(text, phase="TRAIN")
    params, state = model.init(0)

    def f(x):
        feed = {**x, "prior": jnp.asarray(PRIOR), "label": jnp.asarray(label)}
        return jitted.forward(model, params, state, feed, jax.random.key(0))[0]["loss"]

    x = {"loc": jnp.asarray(loc), "conf": jnp.asarray(conf)}
    value, vjp = jax.vjp(f, x)
    g = vjp(jnp.ones((), value.dtype))[0]
    return float(value), np.asarray(g["loc"]), np.asarray(g["conf"])


ENUMS = {"SOFTMAX", "LOGISTIC", "SMOOTH_L1", "L2", "CORNER", "CENTER_SIZE", "CORNER_SIZE",
         "PER_PREDICTION", "BIPARTITE", "MAX_NEGATIVE", "HARD_EXAMPLE", "NONE"}  # fmt: skip


def _param_text(opts: dict) -> tuple[str, str]:
    fields, loss = [], ""
    for k, v in opts.items():
        if k == "normalization":
            loss = f"normalization: {v}"
        elif k == "normalize":
            loss = f"normalize: {str(v).lower()}"
        elif isinstance(v, bool):
            fields.append(f"{k}: {str(v).lower()}")
        else:
            fields.append(f"{k}: {v}")
    return " ".join(fields), loss


CASES = [
    {},
    {"code_type": "CENTER_SIZE", "normalization": "FULL"},
    {"code_type": "CORNER_SIZE", "loc_loss_type": "L2", "normalization": "BATCH_SIZE"},
    {"code_type": "CENTER_SIZE", "normalization": "NONE", "loc_weight": 2.5},
    {"match_type": "BIPARTITE", "neg_pos_ratio": 2.0, "neg_overlap": 0.3},
    {"overlap_threshold": 0.3, "use_difficult_gt": False, "code_type": "CENTER_SIZE"},
    {"mining_type": "HARD_EXAMPLE", "sample_size": 12, "code_type": "CENTER_SIZE"},
    {"mining_type": "NONE", "code_type": "CENTER_SIZE"},
    {"conf_loss_type": "LOGISTIC", "code_type": "CENTER_SIZE"},
    {"map_object_to_agnostic": True, "num_classes_override": 2},
    {"encode_variance_in_target": True, "code_type": "CENTER_SIZE"},
    {"ignore_cross_boundary_bbox": True, "bp_inside": True},
    {"use_prior_for_matching": False, "code_type": "CENTER_SIZE", "overlap_threshold": 0.3},
    {"use_prior_for_matching": False, "bp_inside": True, "ignore_cross_boundary_bbox": True},
    {"normalize": False},
]


@pytest.mark.parametrize("opts", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_loss_and_gradient_match_the_fork(opts):
    opts = dict(opts)
    classes = opts.pop("num_classes_override", C)
    loc, conf, label = LOC, CONF, LABEL
    if classes != C:  # agnostic: 2 classes (the fork CHECKs every gt label < num_classes)
        conf = CONF.reshape(2, P, C)[..., :classes].reshape(2, -1)
        label = LABEL.copy()
        label[..., :5, 1] = 1
    param, loss_param = _param_text(opts)
    text = _text(param, loss_param, classes=classes)
    value, gloc, gconf = _ours(text, loc, conf, label)
    if "normalize" in opts:  # the legacy field: false means BATCH_SIZE
        opts["normalization"] = "VALID" if opts.pop("normalize") else "BATCH_SIZE"
    ref, rloc, rconf = fork_multibox(loc, conf, PRIOR, label, num_classes=classes, **opts)
    np.testing.assert_allclose(value, ref, rtol=2e-5)
    np.testing.assert_allclose(gloc, rloc, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gconf, rconf, rtol=1e-4, atol=1e-6)


def test_share_location_false_uses_the_matched_class_predictions():
    loc = (RNG.standard_normal((2, P * 4 * C)) * 0.5).astype(np.float32)
    text = _text("share_location: false mining_type: NONE code_type: CENTER_SIZE",
                 loc_classes=C)  # fmt: skip
    value, gloc, gconf = _ours(text, loc, CONF)
    ref, rloc, rconf = fork_multibox(loc, CONF, PRIOR, LABEL, num_classes=C,
                                     share_location=False, mining_type="NONE",
                                     code_type="CENTER_SIZE")  # fmt: skip
    np.testing.assert_allclose(value, ref, rtol=2e-5)
    np.testing.assert_allclose(gloc, rloc, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gconf, rconf, rtol=1e-4, atol=1e-6)


# -- hand-worked matching and mining --------------------------------------------------------

BASE = Settings(
    classes=C, shared=True, background=0, per_prediction=True, threshold=0.5, use_prior=True,
    use_difficult=True, mining=1, ratio=3.0, neg_overlap=0.5, sample_size=64, code=1,
    var_in_target=False, agnostic=False, cross=False, bp_inside=False, l2=False,
    logistic=False, loc_weight=1.0, normalization=1, loc_on=True, conf_on=True,
)  # fmt: skip


def _strip(x0: float, x1: float) -> list[float]:
    """A full-height box: IoUs are interval overlaps."""
    return [x0, 0.0, x1, 1.0]


# priors A..E; g0 is A exactly; g1's best prior is A (0.905) but A goes to g0 (1.0) first
PRIORS = np.array([_strip(0, .4), _strip(.2, .6), _strip(.6, 1), _strip(.05, .45),
                   _strip(0, .38)], np.float32)  # fmt: skip
GTS = np.array([_strip(0, 0.4), _strip(0.02, 0.42), [-1, -1, -1, -1]], np.float32)


def _match(valid=(True, True, False), **kw):
    s = BASE.__class__(**{**BASE.__dict__, **kw})
    match, overlap = match_image(jnp.asarray(PRIORS), jnp.asarray(GTS), jnp.asarray(valid), s)
    return np.asarray(match).tolist(), np.asarray(overlap)


def test_bipartite_then_per_prediction_matching():
    # round 1: A–g0 (IoU 1); round 2: g1 cannot have A, takes D (0.860 > E's 0.857);
    # per prediction: E takes g0 (0.95 ≥ 0.5); B's best (g1, 0.379) is under the threshold
    match, overlap = _match()
    assert match == [0, -1, -1, 1, 0]
    np.testing.assert_allclose(overlap[1], 0.22 / 0.58, rtol=1e-5)
    assert overlap[2] == 0.0  # no recorded overlap


def test_bipartite_only_and_the_threshold_is_inclusive_of_its_best_gt():
    assert _match(per_prediction=False)[0] == [0, -1, -1, 1, -1]
    assert _match(threshold=0.37)[0] == [0, 1, -1, 1, 0]  # B: g1 0.379 ≥ 0.37, g0 0.333 not
    assert _match(threshold=0.38)[0] == [0, -1, -1, 1, 0]


def test_matching_ignores_padding_and_cross_boundary_priors():
    assert _match(valid=(False, False, False))[0] == [-1] * 5  # no gt: nothing is ignored
    assert _match(valid=(False, True, False))[0] == [1, -1, -1, 1, 1]
    priors = PRIORS.copy()
    priors[0, 0] = -0.01
    s = BASE.__class__(**{**BASE.__dict__, "cross": True})
    match, _ = match_image(jnp.asarray(priors), jnp.asarray(GTS), jnp.asarray([1, 1, 0], bool), s)
    assert np.asarray(match).tolist() == [-2, -1, -1, 1, 0]  # g0 goes to E in the bipartite stage


def _mine(match, overlap, loss, **kw):
    s = BASE.__class__(**{**BASE.__dict__, **kw})
    pos, neg = mine(jnp.asarray([match]), jnp.asarray([overlap], jnp.float32),
                    jnp.asarray([loss], jnp.float32), jnp.asarray([True]), s)  # fmt: skip
    return np.flatnonzero(pos[0]).tolist(), np.flatnonzero(neg[0]).tolist()


MATCH = [0, 1, -1, -1, -1, -1, -1, -1, -2]
OVERLAP = [0.9, 0.8, 0.1, 0.5, 0.49, 0.0, 0.3, 0.7, 0.0]
LOSS = [9.0, 9.0, 1.0, 8.0, 2.0, 3.0, 5.0, 7.0, 9.0]


def test_max_negative_count_and_eligibility():
    # eligible: unmatched (not −2) with overlap < 0.5 → priors 2, 4, 5, 6 (3 and 7 are not)
    assert _mine(MATCH, OVERLAP, LOSS) == ([0, 1], [2, 4, 5, 6])  # min(trunc(2·3), 4) = 4
    assert _mine(MATCH, OVERLAP, LOSS, ratio=1.5) == ([0, 1], [4, 5, 6])  # trunc(3.0) = 3
    assert _mine(MATCH, OVERLAP, LOSS, ratio=1.4) == ([0, 1], [5, 6])  # trunc(2.8) = 2
    # 3 (overlap 0.5 < 0.6) joins: 5 eligible, min(6, 5) = 5
    assert _mine(MATCH, OVERLAP, LOSS, neg_overlap=0.6) == ([0, 1], [2, 3, 4, 5, 6])


def test_max_negative_ties_pick_the_lower_prior():
    loss = [0, 0, 4.0, 4.0, 4.0, 1.0, 1.0, 1.0, 0]
    assert _mine(MATCH, [0.0] * 9, loss, ratio=1.0)[1] == [2, 3]


def test_hard_example_keeps_only_the_sampled_positives():
    # top 3 of all priors by loss: 0 (9), 1 (9), 8 (9; ignored −2: not a negative)
    assert _mine(MATCH, OVERLAP, LOSS, mining=2, sample_size=3) == ([0, 1], [])
    # top 5: 0, 1, 8, then 3 (8) and 7 (7): overlaps do not matter for HARD_EXAMPLE
    assert _mine(MATCH, OVERLAP, LOSS, mining=2, sample_size=5) == ([0, 1], [3, 7])
    loss = [1.0, 9.0, 5.0, 0, 0, 0, 0, 0, 0]
    assert _mine(MATCH, OVERLAP, loss, mining=2, sample_size=2) == ([1], [2])


@pytest.mark.parametrize(
    "param, n, message",
    [
        ("share_location: false", 2, "negative mining needs share_location"),
        ("nms_param { nms_threshold: 0.5 }", 2, "NMS among mined examples"),
        ("conf_loss_type: LOGISTIC mining_type: NONE", 2, "wrong offset"),
        ("do_neg_mining: false", 2, "do_neg_mining"),
        ("background_label_id: 4", 2, "background_label_id"),
    ],
)
def test_refused_configurations_name_the_layer(param, n, message):
    loc_classes = C if "share_location: false" in param else 1
    with pytest.raises(NetError, match=f"mbox.*{message}"):
        compile_net(_text(param, n=n, loc_classes=loc_classes), phase="TRAIN")


def test_a_background_gt_label_makes_the_loss_nan():
    label = LABEL.copy()
    label[0, 0, 0, 1] = 0  # the fork CHECK-fails on a background gt label
    assert np.isnan(_ours(_text(""), LOC, CONF, label)[0])


def test_propagate_down_false_drops_the_loc_term_from_the_loss():
    text = _text("code_type: CENTER_SIZE").replace(
        'top: "loss" multibox_loss_param',
        'top: "loss" propagate_down: false propagate_down: true propagate_down: false '
        "propagate_down: false multibox_loss_param",
    )
    value, gloc, gconf = _ours(text, LOC, CONF)
    ref, _, rconf = fork_multibox(LOC, CONF, PRIOR, LABEL, num_classes=C,
                                  code_type="CENTER_SIZE", loc_weight=0.0)  # fmt: skip
    np.testing.assert_allclose(value, ref, rtol=2e-5)
    assert not np.any(gloc)
    np.testing.assert_allclose(gconf, rconf, rtol=1e-4, atol=1e-6)
