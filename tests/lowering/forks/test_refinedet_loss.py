"""RefineDet's MultiBoxLoss with the ARM's bottoms (lowering/forks/refinedet.py, form
``refinedet``): loss and backward, jitted inside value_and_grad, against a loop transcribed from
sfzhang15/RefineDet@52b6fe2 (multibox_loss_layer.cpp Forward_cpu/Backward_cpu; bbox_util.cpp
CasRegFindMatches, MineHardExamples with arm_conf, CasRegEncodeLocPrediction) over the
options the loss reads; the ARM bottoms get no diff; the refusals; and SGD steps through
runtime/train's compiled step on a tiny RefineDet net wired as the fork's generator
(examples/refinedet/VGG16_VOC2007_320.py: arm_loss with 4 bottoms and num_classes 2, odm_loss
with the softmaxed arm_conf and arm_loc) lowering both losses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering import multibox_oracle as fork
from tests.lowering.fork_nets import net

C = 4  # classes, 0 = background
RNG = np.random.default_rng(11)


def _priors(grid: int = 4) -> np.ndarray:
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
LOC = (RNG.standard_normal((2, P * 4)) * 0.8).astype(np.float32)
CONF = (RNG.standard_normal((2, P * C)) * 1.5).astype(np.float32)
ARM_LOC = (RNG.standard_normal((2, P * 4)) * 0.6).astype(np.float32)
_obj = RNG.uniform(0.0, 1.0, (2, P)).astype(np.float32)
ARM_CONF = np.stack([1 - _obj, _obj], -1).reshape(2, -1).astype(np.float32)


def fork_refinedet(loc, conf, prior, label, arm_conf, arm_loc, **overrides):
    """(loss, d/d loc, d/d conf) as RefineDet's Forward_cpu/Backward_cpu compute them (top diff
    1, share_location), loop by loop in float64; the plain SSD pieces are
    tests/lowering/multibox_oracle.py's transcriptions of the same C++ functions."""
    p = {**fork.DEFAULTS, "objectness_score": 0.01, **overrides}
    n, num_p, classes = loc.shape[0], prior.shape[-1] // 4, p["num_classes"]
    pri = np.asarray(prior, np.float64).reshape(2, num_p, 4)
    priors, variances = [list(b) for b in pri[0]], [list(v) for v in pri[1]]
    loc = np.asarray(loc, np.float64).reshape(n, num_p, 4)
    conf = np.asarray(conf, np.float64).reshape(n, num_p, classes)
    obj = np.asarray(arm_conf, np.float32).reshape(n, num_p, 2)[..., 1]
    gt, code, evit = fork.ground_truth(label, p), p["code_type"], p["encode_variance_in_target"]
    loc_sum = conf_sum = 0.0
    num_matches, dloc, dconf = 0, np.zeros_like(loc), np.zeros_like(conf)
    for i in range(n):
        if i not in gt:
            continue
        gts = gt[i]
        anchors = priors  # 5 bottoms: FindMatches / EncodeLocPrediction on the priors
        if arm_loc is not None:  # CasRegFindMatches: the priors decoded with arm_loc
            al = np.asarray(arm_loc, np.float64).reshape(n, num_p, 4)
            anchors = [fork.decode(priors[m], variances[m], al[i, m], code, evit)
                       for m in range(num_p)]  # fmt: skip
        match, best, mining_loc = _match(i, gts, anchors, priors, variances, loc, p)
        match, neg = _mine(match, best, mining_loc, conf[i], gts, obj[i], p)
        rows = []
        for m in range(num_p):
            if match[m] > -1:
                g = gts[match[m]]
                pr, tg = fork.loc_row(loc[i, m], anchors[m], variances[m], g["box"], p)
                f, df = fork.loc_f(pr - tg, p)
                loc_sum += float(np.sum(f))
                dloc[i, m] += df * p["loc_weight"]
                num_matches += 1
                rows.append((m, g["label"]))
        for m, t in rows + [(m, p["background_label_id"]) for m in neg]:
            e = np.exp(conf[i, m] - conf[i, m].max())
            prob = e / e.sum()
            conf_sum += -np.log(max(prob[t], fork.FLT_MIN))
            dconf[i, m] += prob - np.eye(classes)[t]
    norm = {"VALID": num_matches, "FULL": n * num_p, "BATCH_SIZE": n, "NONE": 1}
    norm = max(1.0, float(norm[p["normalization"]]))
    loss = p["loc_weight"] * loc_sum / norm + conf_sum / norm
    return loss, dloc.reshape(n, -1) / norm, dconf.reshape(n, -1) / norm


def _match(i, gts, anchors, priors, variances, loc, p):
    """(Cas)FindMatches for image i, and HARD_EXAMPLE's loc loss per matched prior."""
    code, evit, num_p = p["code_type"], p["encode_variance_in_target"], len(priors)
    boxes = anchors
    if not p["use_prior_for_matching"]:  # the fork decodes against the plain priors
        boxes = [fork.decode(priors[m], variances[m], loc[i, m], code, evit) for m in range(num_p)]
    match, best = fork.match_bbox(gts, boxes, p)
    mining_loc = [0.0] * num_p
    if p["mining_type"] == "HARD_EXAMPLE":  # EncodeLocPrediction: the plain priors
        for m in range(num_p):
            if match[m] > -1:
                g = gts[match[m]]["box"]
                pred, target = fork.loc_row(loc[i, m], priors[m], variances[m], g, p)
                mining_loc[m] = float(np.sum(fork.loc_f(pred - target, p)[0]))
    return match, best, mining_loc


def _mine(match, best, loc_loss, conf, gts, obj, p):
    """MineHardExamples for one image with arm_conf: a prior enters the pool only if
    arm_conf[2m + 1] ≥ objectness_score (float against float, as the fork)."""
    kind, bg = p["mining_type"], p["background_label_id"]
    loss = [fork.conf_row_loss(conf[m], gts[match[m]]["label"] if match[m] > -1 else bg, p)
            + loc_loss[m] for m in range(len(match))]  # fmt: skip
    if kind == "MAX_NEGATIVE":
        eligible = [m for m in range(len(match)) if match[m] == -1 and best[m] < p["neg_overlap"]]
    else:
        eligible = list(range(len(match)))
    eligible = [m for m in eligible if obj[m] >= np.float32(p["objectness_score"])]
    if kind == "MAX_NEGATIVE":
        num_pos = sum(1 for m in match if m > -1)
        num_sel = min(int(np.float32(num_pos) * np.float32(p["neg_pos_ratio"])), len(eligible))
    else:
        num_sel = min(p["sample_size"], len(eligible))
    sel = set(sorted(eligible, key=lambda m: -loss[m])[:num_sel])
    match, neg = list(match), []
    for m in range(len(match)):
        if match[m] > -1 and kind == "HARD_EXAMPLE" and m not in sel:
            match[m] = -1
        elif match[m] == -1 and m in sel:
            neg.append(m)
    return match, neg


def _text(param: str, bottoms: int = 6, **shapes) -> str:
    names = ["loc", "conf", "prior", "label", "arm_conf", "arm_loc"][:bottoms]
    layer = ('layer { name: "odm_loss" type: "MultiBoxLoss" '
             + "".join(f'bottom: "{b}" ' for b in names)
             + f'top: "loss" multibox_loss_param {{ num_classes: {C} {param} }} }}')  # fmt: skip
    shapes = {"loc": (2, P * 4), "conf": (2, P * C), "prior": PRIOR.shape, "label": LABEL.shape,
              "arm_conf": (2, P * 2), "arm_loc": (2, P * 4), **shapes}  # fmt: skip
    return net(layer, {k: shapes[k] for k in names})


def _ours(text: str, bottoms: int = 6):
    """Value and gradients w.r.t. every bottom but prior and label, jitted inside
    value_and_grad as the compiled train step takes them."""
    model = compile_net(text, phase="TRAIN")
    params, state = model.init(0)
    fixed = {"prior": jnp.asarray(PRIOR), "label": jnp.asarray(LABEL)}
    x = {"loc": LOC, "conf": CONF, "arm_conf": ARM_CONF, "arm_loc": ARM_LOC}
    x = {k: jnp.asarray(v) for k, v in list(x.items())[: bottoms - 2]}

    def loss(x):
        return model.apply(params, state, {**x, **fixed}, jax.random.key(0))[0]["loss"]

    value, grads = jitted.value_and_grad(loss)(x)
    return float(value), {k: np.asarray(v) for k, v in grads.items()}


CASES = [
    {"code_type": "CENTER_SIZE"},
    {"code_type": "CENTER_SIZE", "objectness_score": 0.4, "neg_pos_ratio": 5.0},
    {"objectness_score": 0.3},  # CORNER
    {"code_type": "CENTER_SIZE", "mining_type": "HARD_EXAMPLE", "sample_size": 10,
     "objectness_score": 0.3},
    {"code_type": "CENTER_SIZE", "use_prior_for_matching": False, "overlap_threshold": 0.3,
     "bp_inside": True},
    {"code_type": "CENTER_SIZE", "encode_variance_in_target": True, "bp_inside": True,
     "ignore_cross_boundary_bbox": True, "normalization": "FULL"},
    {"code_type": "CENTER_SIZE", "objectness_score": 0.3, "bottoms": 5},
]  # fmt: skip


@pytest.mark.parametrize("opts", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_loss_and_backward_match_the_fork(opts):
    opts = dict(opts)
    bottoms = opts.pop("bottoms", 6)
    fields = " ".join(
        f"{k}: {str(v).lower() if isinstance(v, bool) else v}"
        for k, v in opts.items() if k != "normalization"
    )  # fmt: skip
    text = _text(fields, bottoms)
    if "normalization" in opts:
        text = text.replace("} }", f"}} loss_param {{ normalization: {opts['normalization']} }} }}")
    value, grads = _ours(text, bottoms)
    arm_loc = ARM_LOC if bottoms == 6 else None
    ref, rloc, rconf = fork_refinedet(LOC, CONF, PRIOR, LABEL, ARM_CONF, arm_loc,
                                      num_classes=C, **opts)  # fmt: skip
    assert ref > 0
    np.testing.assert_allclose(value, ref, rtol=2e-5)
    np.testing.assert_allclose(grads["loc"], rloc, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grads["conf"], rconf, rtol=1e-4, atol=1e-6)
    # the fork's Backward_cpu writes no diff to arm_conf or arm_loc
    for name in ("arm_conf", "arm_loc")[: bottoms - 4]:
        assert not np.any(grads[name]), name


def test_the_refined_anchors_and_the_objectness_change_the_loss():
    """Not SSD's loss in disguise: the refined anchors move the matches, the objectness filter
    the mined negatives."""
    ssd, *_ = fork.fork_multibox(LOC, CONF, PRIOR, LABEL, num_classes=C, code_type="CENTER_SIZE")
    six, _ = _ours(_text("code_type: CENTER_SIZE objectness_score: 0.3"))
    five, _ = _ours(_text("code_type: CENTER_SIZE objectness_score: 0.3", 5), 5)
    assert len({round(ssd, 4), round(six, 4), round(five, 4)}) == 3


def test_the_arm_loss_reads_class_labels_as_objects():
    """The ARM's loss (4 bottoms, num_classes 2, objectness_score set as the fork's generator
    copies it): RefineDet's GetGroundTruth reads labels >= 2 as 1; SSD's refuses them (NaN)."""
    conf = CONF.reshape(2, P, C)[..., :2].reshape(2, -1)
    layer = ('layer { name: "arm_loss" type: "MultiBoxLoss" bottom: "loc" bottom: "conf" '
             'bottom: "prior" bottom: "label" top: "loss" multibox_loss_param { num_classes: 2 '
             "code_type: CENTER_SIZE %s } }")  # fmt: skip
    shapes = {"loc": (2, P * 4), "conf": (2, P * 2), "prior": PRIOR.shape, "label": LABEL.shape}
    feed = {"prior": PRIOR, "label": LABEL, "conf": conf}
    out = {}
    for key, extra in (("refinedet", "objectness_score: 0.01"), ("ssd", "")):
        model = compile_net(net(layer % extra, shapes), phase="TRAIN")
        form = model.net.layer("arm_loss").form
        assert form == ("refinedet" if key == "refinedet" else "")

        def loss(x, model=model):
            inputs = {k: jnp.asarray(v) for k, v in {**feed, "loc": x}.items()}
            return model.apply({}, {}, inputs, jax.random.key(0))[0]["loss"]

        out[key] = jitted.value_and_grad(loss)(jnp.asarray(LOC))
    mapped = LABEL.copy()
    mapped[..., 1] = np.where(mapped[..., 1] >= 2, 1, mapped[..., 1])
    ref, rloc, _ = fork.fork_multibox(LOC, conf, PRIOR, mapped, num_classes=2,
                                      code_type="CENTER_SIZE")  # fmt: skip
    np.testing.assert_allclose(float(out["refinedet"][0]), ref, rtol=2e-5)
    np.testing.assert_allclose(np.asarray(out["refinedet"][1]), rloc, rtol=1e-4, atol=1e-6)
    assert np.isnan(float(out["ssd"][0]))


@pytest.mark.parametrize(
    ("param", "shapes", "message"),
    [("share_location: false mining_type: NONE", {"loc": (2, P * 4 * C)},
      "6 bottoms need share_location: true"),
     ("", {"arm_conf": (2, P)}, "arm_conf must hold 2 scores per prior"),
     ("", {"arm_loc": (2, P * 2)}, "arm_loc must hold 4 locations per prior")],
)  # fmt: skip
def test_refused_bottoms_name_the_layer(param, shapes, message):
    with pytest.raises(NetError, match=f"layer 'odm_loss'.*{message}"):
        compile_net(_text(param, **shapes), phase="TRAIN").init(0)


def _head(name: str, bottom: str, out: int) -> str:
    return (
        f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
        f"convolution_param {{ num_output: {out} kernel_size: 3 pad: 1 "
        'weight_filler { type: "gaussian" std: 0.05 } } }\n'
        f'layer {{ name: "{name}_perm" type: "Permute" bottom: "{name}" top: "{name}_perm" '
        "permute_param { order: 0 order: 2 order: 3 order: 1 } }\n"
        f'layer {{ name: "{name}_flat" type: "Flatten" bottom: "{name}_perm" '
        f'top: "{name}_flat" flatten_param {{ axis: 1 }} }}\n'
    )


LOSS = ("code_type: CENTER_SIZE overlap_threshold: 0.5 neg_pos_ratio: 3 neg_overlap: 0.5 "
        "objectness_score: 0.01 loc_weight: 1")  # fmt: skip


def _refinedet_train_net() -> str:
    """Two priors per cell on a 4×4 map; the fork generator's arm_loss and odm_loss wiring."""
    prior = ('layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
             "prior_box_param { min_size: 10 max_size: 20 clip: false variance: 0.1 "
             "variance: 0.1 variance: 0.2 variance: 0.2 } }\n")  # fmt: skip
    return net(
        'layer { name: "feat" type: "Convolution" bottom: "data" top: "feat" convolution_param '
        '{ num_output: 8 kernel_size: 3 stride: 2 pad: 1 weight_filler { type: "xavier" } } }\n'
        'layer { name: "relu" type: "ReLU" bottom: "feat" top: "feat" }\n'
        + _head("arm_loc", "feat", 8) + _head("arm_conf", "feat", 4)
        + _head("odm_loc", "feat", 8) + _head("odm_conf", "feat", 2 * C) + prior
        + 'layer { name: "arm_loss" type: "MultiBoxLoss" bottom: "arm_loc_flat" '
        'bottom: "arm_conf_flat" bottom: "pb" bottom: "label" top: "arm_loss" '
        "propagate_down: true propagate_down: true propagate_down: false propagate_down: false "
        f"multibox_loss_param {{ num_classes: 2 {LOSS} }} }}\n"
        'layer { name: "arm_r" type: "Reshape" bottom: "arm_conf_flat" top: "arm_r" '
        "reshape_param { shape { dim: 0 dim: -1 dim: 2 } } }\n"
        'layer { name: "arm_s" type: "Softmax" bottom: "arm_r" top: "arm_s" '
        "softmax_param { axis: 2 } }\n"
        'layer { name: "arm_f" type: "Flatten" bottom: "arm_s" top: "arm_f" }\n'
        'layer { name: "odm_loss" type: "MultiBoxLoss" bottom: "odm_loc_flat" '
        'bottom: "odm_conf_flat" bottom: "pb" bottom: "label" bottom: "arm_f" '
        'bottom: "arm_loc_flat" top: "odm_loss" propagate_down: true propagate_down: true '
        "propagate_down: false propagate_down: false propagate_down: false "
        f"propagate_down: false multibox_loss_param {{ num_classes: {C} {LOSS} }} }}\n",
        {"data": (2, 3, 8, 8), "label": LABEL.shape},
    )  # fmt: skip


def test_a_refinedet_net_trains_through_the_train_step():
    """40 SGD steps through runtime/train's compiled step lower the ARM's and the ODM's
    losses together."""
    from caffe2jax.runtime.train.step import Trainer

    model = compile_net(_refinedet_train_net(), phase="TRAIN")
    assert model.net.layer("odm_loss").form == "refinedet"
    params, state = model.init(0)
    solver = caffe_pb2.SolverParameter(base_lr=0.05, lr_policy="fixed", momentum=0.9)
    trainer = Trainer(model, solver, params, state)
    opt = trainer.init(params, state)
    batch = [{"data": RNG.standard_normal((2, 3, 8, 8)).astype(np.float32), "label": LABEL}]
    feed = {k: jnp.asarray(v) for k, v in batch[0].items()}
    losses = []
    for it in range(40):
        blobs, _ = jitted.forward(model, params, state, feed)
        losses.append((float(blobs["arm_loss"]), float(blobs["odm_loss"])))
        params, state, opt, *_ = trainer.step(params, state, opt, batch, jax.random.key(0), it)
    first, last = np.asarray(losses[0]), np.asarray(losses[-1])
    assert np.isfinite(losses).all() and (last < 0.6 * first).all(), losses
