"""A slow, loop-by-loop NumPy transcription of the SSD fork's MultiBoxLoss (weiliu89/caffe
multibox_loss_layer.cpp Forward_cpu/Backward_cpu with util/bbox_util.cpp GetGroundTruth,
MatchBBox, FindMatches, MineHardExamples, EncodeLocPrediction, EncodeConfPrediction): the
oracle for tests/lowering/forks/test_ssd_multibox_loss.py. Sorting among equal losses is stable
(lower prior first), the choice caffe2jax documents for the fork's unstable std::sort."""

from __future__ import annotations

import math

import numpy as np

DEFAULTS = dict(
    loc_loss_type="SMOOTH_L1", conf_loss_type="SOFTMAX", loc_weight=1.0, share_location=True,
    match_type="PER_PREDICTION", overlap_threshold=0.5, use_prior_for_matching=True,
    background_label_id=0, use_difficult_gt=True, neg_pos_ratio=3.0, neg_overlap=0.5,
    code_type="CORNER", encode_variance_in_target=False, map_object_to_agnostic=False,
    ignore_cross_boundary_bbox=False, bp_inside=False, mining_type="MAX_NEGATIVE",
    sample_size=64, normalization="VALID",
)  # fmt: skip
FLT_MIN = float(np.finfo(np.float32).tiny)


def size(b) -> float:
    return 0.0 if b[2] < b[0] or b[3] < b[1] else (b[2] - b[0]) * (b[3] - b[1])


def jaccard(a, b) -> float:
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return 0.0
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w > 0 and h > 0:
        return w * h / (size(a) + size(b) - w * h)
    return 0.0


def encode(prior, var, gt, code, var_in_target):
    v = [1.0] * 4 if var_in_target else var
    if code == "CORNER":
        return [(gt[k] - prior[k]) / v[k] for k in range(4)]
    pw, ph = prior[2] - prior[0], prior[3] - prior[1]
    if code == "CORNER_SIZE":
        return [(gt[k] - prior[k]) / (pw, ph)[k % 2] / v[k] for k in range(4)]
    pcx, pcy = (prior[0] + prior[2]) / 2, (prior[1] + prior[3]) / 2
    gw, gh = gt[2] - gt[0], gt[3] - gt[1]
    gcx, gcy = (gt[0] + gt[2]) / 2, (gt[1] + gt[3]) / 2
    return [(gcx - pcx) / pw / v[0], (gcy - pcy) / ph / v[1], math.log(gw / pw) / v[2],
            math.log(gh / ph) / v[3]]  # fmt: skip


def decode(prior, var, t, code, var_in_target):
    """DecodeBBox (no clipping)."""
    v = [1.0] * 4 if var_in_target else var
    if code == "CORNER":
        return [prior[k] + v[k] * t[k] for k in range(4)]
    pw, ph = prior[2] - prior[0], prior[3] - prior[1]
    if code == "CORNER_SIZE":
        return [prior[k] + v[k] * t[k] * (pw, ph)[k % 2] for k in range(4)]
    pcx, pcy = (prior[0] + prior[2]) / 2, (prior[1] + prior[3]) / 2
    cx, cy = v[0] * t[0] * pw + pcx, v[1] * t[1] * ph + pcy
    w, h = math.exp(v[2] * t[2]) * pw, math.exp(v[3] * t[3]) * ph
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def ground_truth(label, p):
    out: dict[int, list] = {}
    for row in np.asarray(label, np.float64).reshape(-1, 8):
        item = int(row[0])
        if item == -1:
            continue
        if not p["use_difficult_gt"] and bool(row[7]):
            continue
        out.setdefault(item, []).append(dict(label=int(row[1]), box=list(row[3:7])))
    return out


def match_bbox(gts, preds, p):
    """MatchBBox with label −1: (match indices, match overlaps)."""
    n = len(preds)
    match, best = [-1] * n, [0.0] * n
    if not gts:
        return match, best
    overlaps: dict[int, dict[int, float]] = {}
    for i in range(n):
        if p["ignore_cross_boundary_bbox"] and any(c < 0 or c > 1 for c in preds[i]):
            match[i] = -2
            continue
        for j, g in enumerate(gts):
            o = jaccard(preds[i], g["box"])
            if o > 1e-6:
                best[i] = max(best[i], o)
                overlaps.setdefault(i, {})[j] = o
    pool = list(range(len(gts)))
    while pool:
        mi, mj, mo = -1, -1, -1.0
        for i in sorted(overlaps):
            if match[i] != -1:
                continue
            for j in pool:
                if j in overlaps[i] and overlaps[i][j] > mo:
                    mi, mj, mo = i, j, overlaps[i][j]
        if mi == -1:
            break
        match[mi], best[mi] = mj, mo
        pool.remove(mj)
    if p["match_type"] == "PER_PREDICTION":
        for i in sorted(overlaps):
            if match[i] != -1:
                continue
            mj, mo = -1, -1.0
            for j in range(len(gts)):
                o = overlaps[i].get(j)
                if o is not None and o >= p["overlap_threshold"] and o > mo:
                    mj, mo = j, o
            if mj != -1:
                match[i], best[i] = mj, mo
    return match, best


def conf_row_loss(x, label, p) -> float:
    if p["conf_loss_type"] == "SOFTMAX":
        e = np.exp(x - x.max())
        return -math.log(max(e[label] / e.sum(), FLT_MIN))
    t = np.eye(len(x))[label]
    return float(np.sum(np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x)))))


def loc_row(loc_j, prior, var, gt, p):
    """EncodeLocPrediction for one matched prior: (prediction, target)."""
    target = encode(prior, var, gt, p["code_type"], p["encode_variance_in_target"])
    pred = list(loc_j)
    if p["bp_inside"]:
        box = prior
        if not p["use_prior_for_matching"]:
            box = decode(prior, var, loc_j, p["code_type"], p["encode_variance_in_target"])
        pred = [target[k] if (box[k] < 0 or box[k] > 1) else pred[k] for k in range(4)]
    if p["encode_variance_in_target"]:
        pred = [pred[k] / var[k] for k in range(4)]
        target = [target[k] / var[k] for k in range(4)]
    return np.array(pred), np.array(target)


def loc_f(d, p):
    if p["loc_loss_type"] == "L2":
        return 0.5 * d * d, d
    return np.where(np.abs(d) < 1, 0.5 * d * d, np.abs(d) - 0.5), np.where(
        np.abs(d) < 1, d, np.sign(d)
    )


def mine(i, match, best, loc_loss, conf, gts, p):
    """MineHardExamples for image i (share_location): (match, negatives)."""
    kind = p["mining_type"]
    if kind == "NONE":
        return match, []
    bg = p["background_label_id"]
    loss = []
    for m in range(len(match)):
        label = gts[match[m]]["label"] if match[m] > -1 else bg
        loss.append(conf_row_loss(conf[m], label, p) + loc_loss[m])
    if kind == "MAX_NEGATIVE":
        eligible = [m for m in range(len(match)) if match[m] == -1 and best[m] < p["neg_overlap"]]
        num_pos = sum(1 for m in match if m > -1)
        num_sel = min(int(np.float32(num_pos) * np.float32(p["neg_pos_ratio"])), len(eligible))
    else:
        eligible = list(range(len(match)))
        num_sel = min(p["sample_size"], len(eligible))
    ranked = sorted(eligible, key=lambda m: -loss[m])
    sel = set(ranked[:num_sel])
    match, neg = list(match), []
    for m in range(len(match)):
        if match[m] > -1:
            if kind == "HARD_EXAMPLE" and m not in sel:
                match[m] = -1
        elif match[m] == -1 and m in sel:
            neg.append(m)
    return match, neg


def _image_matches(i, gt, priors, variances, loc, conf, p):
    """FindMatches + MineHardExamples for image i: (match, negatives, per-class loc index)."""
    if i not in gt:
        return [-1] * len(priors), [], None
    gts = gt[i]
    boxes = priors
    if not p["use_prior_for_matching"]:
        boxes = [decode(priors[m], variances[m], loc[i, m, 0], p["code_type"],
                        p["encode_variance_in_target"]) for m in range(len(priors))]  # fmt: skip
    match, best = match_bbox(gts, boxes, p)
    loc_loss = [0.0] * len(priors)
    if p["mining_type"] == "HARD_EXAMPLE":
        for m in range(len(priors)):
            if match[m] > -1:
                pred, tgt = loc_row(loc[i, m, 0], priors[m], variances[m], gts[match[m]]["box"], p)
                loc_loss[m] = float(np.sum(loc_f(pred - tgt, p)[0]))
    match, neg = mine(i, match, best, loc_loss, conf[i], gts, p)
    return match, neg, gts


def fork_multibox(loc, conf, prior, label, **overrides):
    """(loss, d loss / d loc, d loss / d conf) as the fork computes them (top diff 1)."""
    p = {**DEFAULTS, **overrides}
    n, classes = loc.shape[0], p["num_classes"]
    num_p = prior.shape[-1] // 4
    pri = np.asarray(prior, np.float64).reshape(2, num_p, 4)
    priors, variances = [list(b) for b in pri[0]], [list(v) for v in pri[1]]
    lc = 1 if p["share_location"] else classes
    loc = np.asarray(loc, np.float64).reshape(n, num_p, lc, 4)
    conf = np.asarray(conf, np.float64).reshape(n, num_p, classes)
    gt = ground_truth(label, p)
    bg, logistic = p["background_label_id"], p["conf_loss_type"] == "LOGISTIC"
    loc_sum, conf_sum, num_matches = 0.0, 0.0, 0
    dloc, dconf = np.zeros_like(loc), np.zeros_like(conf)
    for i in range(n):
        match, neg, gts = _image_matches(i, gt, priors, variances, loc, conf, p)
        rows = []  # (prior, target label)
        for m in range(num_p):
            if match[m] > -1:
                g = gts[match[m]]
                c = 0 if p["share_location"] else g["label"]
                pred, tgt = loc_row(loc[i, m, c], priors[m], variances[m], g["box"], p)
                f, df = loc_f(pred - tgt, p)
                loc_sum += float(np.sum(f))
                dloc[i, m, c] += df * p["loc_weight"]
                num_matches += 1
                rows.append((m, bg + 1 if p["map_object_to_agnostic"] else g["label"]))
        rows += [(m, bg) for m in neg]
        if p["mining_type"] == "NONE":
            targets = {m: t for m, t in rows}
            rows = [(m, targets.get(m, bg)) for m in range(num_p)]
        for m, t in rows:
            x = conf[i, m]
            if logistic:
                tv = np.full(classes, float(bg))
                tv[t] = 1.0
                conf_sum += float(np.sum(np.maximum(x, 0) - x * tv + np.log1p(np.exp(-np.abs(x)))))
                dconf[i, m] += 1 / (1 + np.exp(-x)) - tv
            else:
                e = np.exp(x - x.max())
                prob = e / e.sum()
                conf_sum += -math.log(max(prob[t], FLT_MIN))
                dconf[i, m] += prob - np.eye(classes)[t]
    norm = {"VALID": num_matches, "FULL": n * num_p, "BATCH_SIZE": n, "NONE": 1}
    norm = max(1.0, float(norm[p["normalization"]]))
    loss = p["loc_weight"] * loc_sum / norm + conf_sum / norm
    return loss, dloc.reshape(n, -1) / norm, dconf.reshape(n, -1) / norm
