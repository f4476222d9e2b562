"""TextBoxes++' MultiBoxLoss with ``use_polygon`` (lowering/forks/textboxes.py, form
``textboxes``; lowering/boxes/coders.py ``encode_quads``): loss and backward, jitted inside
value_and_grad, against a loop transcribed from MhLiao/TextBoxes_plusplus@39d4898
(multibox_loss_layer.cpp Forward_cpu/Backward_cpu with use_polygon; bbox_util.cpp
GetGroundTruth's 16-value rows, EncodeBBoxPolygon, EncodeLocPredictionBboxPolygon; FindMatches
and MineHardExamples are SSD's, tests/lowering/multibox_oracle.py); the loc part's cap at 20
(value only); the refusals (SSD's 8-value label rows from caffe2jax's AnnotatedData, rotated
boxes, other code types); SGD steps through runtime/train's compiled step on a tiny
TextBoxes++ net fed from an Input."""

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

C = 3  # classes, 0 = background
RNG = np.random.default_rng(5)


def _priors(grid: int = 4) -> np.ndarray:
    boxes = []
    for y in range(grid):
        for x in range(grid):
            cx, cy = (x + 0.5) / grid, (y + 0.5) / grid
            for w, h in ((0.3, 0.15), (0.5, 0.25)):
                boxes.append([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    var = np.tile([0.1, 0.1, 0.2, 0.2], (len(boxes), 1))
    return np.stack([np.asarray(boxes), var]).reshape(1, 2, -1).astype(np.float32)


def _row(item, label, box, difficult=0, tilt=0.03):
    """A 16-value row: SSD's 8, then a quadrilateral inside the box, tilted."""
    x0, y0, x1, y1 = box
    quad = [x0, y0 + tilt, x1, y0, x1 - tilt, y1, x0 + tilt, y1]
    return [item, label, 0, *box, difficult, *quad]


PRIOR = _priors()
P = PRIOR.shape[-1] // 4
LABEL = np.array(
    [_row(0, 1, [0.10, 0.10, 0.45, 0.28]), _row(0, 2, [0.50, 0.60, 0.95, 0.80]),
     _row(0, 1, [0.20, 0.70, 0.40, 0.85], difficult=1), _row(1, 2, [0.05, 0.40, 0.60, 0.62]),
     _row(1, 1, [0.55, 0.05, 0.90, 0.22], tilt=-0.02)] + [[-1] * 16] * 3, np.float32,
).reshape(1, 1, -1, 16)  # fmt: skip
LOC = (RNG.standard_normal((2, P * 12)) * 0.7).astype(np.float32)
CONF = (RNG.standard_normal((2, P * C)) * 1.5).astype(np.float32)


def _encode_quad(prior, var, quad):
    """EncodeBBoxPolygon's 8 values (CENTER_SIZE, variances in the prior)."""
    pw, ph = prior[2] - prior[0], prior[3] - prior[1]
    corners = [(prior[0], prior[1]), (prior[2], prior[1]), (prior[2], prior[3]),
               (prior[0], prior[3])]  # fmt: skip
    out = []
    for k, (cx, cy) in enumerate(corners):
        out += [(quad[2 * k] - cx) / pw / var[0], (quad[2 * k + 1] - cy) / ph / var[1]]
    return out


INSIDE = [0, 1, 2, 3, 0, 1, 2, 3, 2, 3, 2, 3]  # EncodeLocPredictionBboxPolygon's bp_inside


def _ground_truth(label, p):
    """GetGroundTruth's 16-value rows (item −1 skipped, difficult dropped unless used)."""
    out: dict[int, list] = {}
    for row in np.asarray(label, np.float64).reshape(-1, 16):
        if int(row[0]) == -1 or (not p["use_difficult_gt"] and bool(row[7])):
            continue
        out.setdefault(int(row[0]), []).append(
            dict(label=int(row[1]), box=list(row[3:7]), quad=list(row[8:16]))
        )
    return out


def _image(i, gts, priors, variances, loc, conf, p):
    """FindMatches + MineHardExamples for image i (SSD's, on the 4 box values)."""
    boxes = priors
    if not p["use_prior_for_matching"]:
        boxes = [fork.decode(priors[m], variances[m], loc[i, m, :4], "CENTER_SIZE", False)
                 for m in range(len(priors))]  # fmt: skip
    match, best = fork.match_bbox(gts, boxes, p)
    mining_loc = [0.0] * len(priors)
    if p["mining_type"] == "HARD_EXAMPLE":  # SSD's EncodeLocPrediction on the boxes
        for m in range(len(priors)):
            if match[m] > -1:
                g = gts[match[m]]["box"]
                pred, tgt = fork.loc_row(loc[i, m, :4], priors[m], variances[m], g, p)
                mining_loc[m] = float(np.sum(fork.loc_f(pred - tgt, p)[0]))
    return fork.mine(i, match, best, mining_loc, conf[i], gts, p)


def fork_textboxes(loc, conf, prior, label, cap: float = 20.0, **overrides):
    """(loss, d/d loc, d/d conf) as TextBoxes++' Forward_cpu/Backward_cpu compute them with
    use_polygon (share_location, SOFTMAX, top diff 1), loop by loop in float64."""
    p = {**fork.DEFAULTS, "code_type": "CENTER_SIZE", **overrides}
    n, num_p, classes = loc.shape[0], prior.shape[-1] // 4, p["num_classes"]
    pri = np.asarray(prior, np.float64).reshape(2, num_p, 4)
    priors, variances = [list(b) for b in pri[0]], [list(v) for v in pri[1]]
    loc = np.asarray(loc, np.float64).reshape(n, num_p, 12)
    conf = np.asarray(conf, np.float64).reshape(n, num_p, classes)
    gt, loc_sum, conf_sum, num_matches = _ground_truth(label, p), 0.0, 0.0, 0
    dloc, dconf = np.zeros_like(loc), np.zeros_like(conf)
    for i in sorted(gt):
        match, neg = _image(i, gt[i], priors, variances, loc, conf, p)
        rows = []
        for m in range(num_p):
            if match[m] <= -1:
                continue
            g, pr, var = gt[i][match[m]], priors[m], variances[m]
            target = fork.encode(pr, var, g["box"], "CENTER_SIZE", False)
            target = np.array(target + _encode_quad(pr, var, g["quad"]))
            pred = loc[i, m].copy()
            if p["bp_inside"]:
                out = [pr[k] < 0 or pr[k] > 1 for k in INSIDE]
                pred = np.where(out, target, pred)
            f, df = fork.loc_f(pred - target, p)
            loc_sum, num_matches = loc_sum + float(np.sum(f)), num_matches + 1
            dloc[i, m] += df * p["loc_weight"]
            rows.append((m, g["label"]))
        for m, t in rows + [(m, p["background_label_id"]) for m in neg]:
            e = np.exp(conf[i, m] - conf[i, m].max())
            conf_sum += -np.log(max(e[t] / e.sum(), fork.FLT_MIN))
            dconf[i, m] += e / e.sum() - np.eye(classes)[t]
    norm = max(1.0, float(num_matches))  # VALID
    loc_part = min(float(np.float32(p["loc_weight"] * loc_sum / norm)), cap)  # the fork's cap
    return loc_part + conf_sum / norm, dloc.reshape(n, -1) / norm, dconf.reshape(n, -1) / norm


def _text(param: str, label_width: int = 16) -> str:
    layer = ('layer { name: "mbox_loss" type: "MultiBoxLoss" bottom: "loc" bottom: "conf" '
             'bottom: "prior" bottom: "label" top: "loss" multibox_loss_param { '
             f"num_classes: {C} use_polygon: true {param} }} }}")  # fmt: skip
    shapes = {"loc": (2, P * 12), "conf": (2, P * C), "prior": PRIOR.shape,
              "label": (1, 1, LABEL.shape[2], label_width)}  # fmt: skip
    return net(layer, shapes)


def _ours(text: str, loc=LOC):
    model = compile_net(text, phase="TRAIN")
    assert model.net.layer("mbox_loss").form == "textboxes"
    fixed = {"prior": jnp.asarray(PRIOR), "label": jnp.asarray(LABEL)}

    def loss(x):
        return model.apply({}, {}, {**x, **fixed}, jax.random.key(0))[0]["loss"]

    x = {"loc": jnp.asarray(loc), "conf": jnp.asarray(CONF)}
    value, grads = jitted.value_and_grad(loss)(x)
    return float(value), np.asarray(grads["loc"]), np.asarray(grads["conf"])


CASES = [
    {"code_type": "CENTER_SIZE"},
    {"code_type": "CENTER_SIZE", "bp_inside": True, "neg_pos_ratio": 2.0},
    {"code_type": "CENTER_SIZE", "mining_type": "HARD_EXAMPLE", "sample_size": 12},
    {"code_type": "CENTER_SIZE", "use_prior_for_matching": False, "overlap_threshold": 0.3,
     "use_difficult_gt": False},
    {"code_type": "CENTER_SIZE", "loc_weight": 40.0},  # the loc part past the cap
]  # fmt: skip


@pytest.mark.parametrize("opts", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_loss_and_backward_match_the_fork(opts):
    fields = " ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}"
                      for k, v in opts.items())  # fmt: skip
    value, gloc, gconf = _ours(_text(fields))
    ref, rloc, rconf = fork_textboxes(LOC, CONF, PRIOR, LABEL, num_classes=C, **opts)
    np.testing.assert_allclose(value, ref, rtol=2e-5)
    np.testing.assert_allclose(gloc, rloc, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gconf, rconf, rtol=1e-4, atol=1e-6)
    if opts.get("loc_weight") == 40.0:  # the cap bites: the value is capped, the diff not
        uncapped, *_ = fork_textboxes(LOC, CONF, PRIOR, LABEL, np.inf, num_classes=C, **opts)
        assert uncapped > value + 10.0


@pytest.mark.parametrize(
    ("param", "width", "message"),
    [("code_type: CENTER_SIZE", 8, "label rows are SSD's .8 values.*AnnotatedData"),
     ("code_type: CENTER_SIZE use_polygon: false", 16, "use_polygon: false"),
     ("code_type: CORNER", 16, "CENTER_SIZE"),
     ("code_type: CENTER_SIZE encode_variance_in_target: true", 16, "CENTER_SIZE")],
)  # fmt: skip
def test_refusals_name_the_layer(param, width, message):
    text = _text(param, width).replace("use_polygon: true code_type: CENTER_SIZE use_polygon",
                                       "code_type: CENTER_SIZE use_polygon")  # fmt: skip
    with pytest.raises(NetError, match=f"layer 'mbox_loss'.*{message}"):
        compile_net(text, phase="TRAIN").init(0)


def _head(name: str, out: int) -> str:
    return (
        f'layer {{ name: "{name}" type: "Convolution" bottom: "feat" top: "{name}" '
        f"convolution_param {{ num_output: {out} kernel_size: 3 pad: 1 "
        'weight_filler { type: "gaussian" std: 0.05 } } }\n'
        f'layer {{ name: "{name}_perm" type: "Permute" bottom: "{name}" top: "{name}_perm" '
        "permute_param { order: 0 order: 2 order: 3 order: 1 } }\n"
        f'layer {{ name: "{name}_flat" type: "Flatten" bottom: "{name}_perm" '
        f'top: "{name}_flat" flatten_param {{ axis: 1 }} }}\n'
    )


def test_a_textboxes_net_trains_through_the_train_step():
    """A conv feature, the fork's heads (12 locations per prior, denser priors), its loss on
    an Input-fed 16-value label: 40 SGD steps through runtime/train's compiled step lower the
    loss."""
    from caffe2jax.runtime.train.step import Trainer

    k = 4  # priors per cell: (min, ratio 2) and their denser copies
    text = net(
        'layer { name: "feat" type: "Convolution" bottom: "data" top: "feat" convolution_param '
        '{ num_output: 8 kernel_size: 3 stride: 2 pad: 1 weight_filler { type: "xavier" } } }\n'
        'layer { name: "relu" type: "ReLU" bottom: "feat" top: "feat" }\n'
        + _head("loc", k * 12) + _head("conf", k * C)
        + 'layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
        "prior_box_param { min_size: 6 aspect_ratio: 2 flip: false clip: false "
        "denser_prior_boxes: true variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 } }\n"
        'layer { name: "mbox_loss" type: "MultiBoxLoss" bottom: "loc_flat" bottom: "conf_flat" '
        'bottom: "pb" bottom: "label" top: "loss" propagate_down: true propagate_down: true '
        "propagate_down: false propagate_down: false multibox_loss_param { "
        f"num_classes: {C} use_polygon: true code_type: CENTER_SIZE overlap_threshold: 0.3 }} }}\n",
        {"data": (2, 3, 8, 8), "label": LABEL.shape},
    )  # fmt: skip
    model = compile_net(text, phase="TRAIN")
    assert model.net.layer("mbox_loss").form == "textboxes"
    params, state = model.init(0)
    solver = caffe_pb2.SolverParameter(base_lr=0.02, lr_policy="fixed", momentum=0.9)
    trainer = Trainer(model, solver, params, state)
    opt = trainer.init(params, state)
    batch = [{"data": RNG.standard_normal((2, 3, 8, 8)).astype(np.float32), "label": LABEL}]
    feed = {key: jnp.asarray(v) for key, v in batch[0].items()}
    losses = []
    for it in range(40):
        losses.append(float(jitted.forward(model, params, state, feed)[0]["loss"]))
        params, state, opt, *_ = trainer.step(params, state, opt, batch, jax.random.key(0), it)
    assert np.isfinite(losses).all() and losses[-1] < 0.6 * losses[0], losses


def test_encode_quads_inverts_decode_quads():
    """coders.encode_quads is EncodeBBoxPolygon, the inverse of DecodeBBoxPolygon."""
    from caffe2jax.lowering.boxes.coders import decode_quads, encode_quads

    pri = jnp.asarray(PRIOR.reshape(2, P, 4))
    quads = jnp.asarray(np.tile(LABEL[0, 0, :1, 8:16], (P, 1)))
    back = jax.jit(lambda q: decode_quads(pri[0], pri[1], encode_quads(pri[0], pri[1], q)))
    np.testing.assert_allclose(np.asarray(back(quads)), np.asarray(quads), atol=1e-6)
    want = [_encode_quad(list(PRIOR.reshape(2, P, 4)[0, 3]), [0.1, 0.1, 0.2, 0.2],
                         list(LABEL[0, 0, 0, 8:16]))]  # fmt: skip
    got = encode_quads(pri[0, 3:4], pri[1, 3:4], quads[:1])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
