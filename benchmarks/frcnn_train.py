"""py-faster-rcnn's VGG16 end-to-end Faster R-CNN, one training iteration on a 224×224 image:
caffe2jax (the fork's train prototxt with the built-in layers, one compiled step) vs a
hand-written PyTorch eager equivalent, in one run.

    python benchmarks/frcnn_train.py [--blocks 3]

Both sides: one image (224×224, 1–3 boxes of examples/detection/synthetic_boxes.py), 4 classes,
anchors (2, 4, 8)·16 px, conv1_x/conv2_x frozen (lr_mult 0, as the prototxt), RPN (256 anchors,
SmoothL1 σ 3), proposals (TRAIN: 12000 → NMS 0.7 → 2000), 128 sampled rois, 7×7 RoI max pooling,
fc6/fc7 (4096) with dropout, cls_score/bbox_pred, SGD momentum 0.9 and weight decay 5e-4, iter_size
1. caffe2jax: ``solver.step(1)`` of pycaffe's SGDSolver (the data read from the LMDB by the
built-in RoIDataLayer included). PyTorch: the net in ``torch.nn``, the anchor and proposal targets
in numpy on the host as py-faster-rcnn's Python layers do, NMS in torch, RoI pooling as a loop of
adaptive max pools over the rois (torchvision is not installed). Timings on a shared machine are
noisy: compare the ratio, measured in alternating blocks (benchmarks/harness.py)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Row, machine, measure, result_line, write  # noqa: E402

SIZE, CLASSES, SCALES = 224, 4, (2, 4, 8)


def ours(folder: Path):
    import caffe2jax as caffe
    from examples.detection.frcnn_train import train_prototxt
    from examples.detection.synthetic_boxes import make_boxes

    make_boxes(folder / "boxes_lmdb", count=8, size=SIZE, seed=0)
    (folder / "train.prototxt").write_text(train_prototxt(folder / "boxes_lmdb", SIZE))
    (folder / "solver.prototxt").write_text(
        f'train_net: "{folder / "train.prototxt"}"\nbase_lr: 0.001\nlr_policy: "fixed"\n'
        "momentum: 0.9\nweight_decay: 0.0005\ndisplay: 0\nsnapshot: 0\n"
        f'snapshot_prefix: "{folder / "snap"}"\nrandom_seed: 1\n'
    )
    solver = caffe.SGDSolver(str(folder / "solver.prototxt"))
    for blobs in solver.net.params.values():  # random "pretrained" weights (see frcnn_train)
        w = blobs[0].data
        if not w.any():
            w[...] = np.random.default_rng(0).normal(0, 0.01, w.shape)
    return lambda: solver.step(1)


# -- PyTorch peer -------------------------------------------------------------------------------


def _anchors() -> np.ndarray:
    out = []
    for r in (0.5, 1, 2):
        ws = np.round(np.sqrt(256 / r))
        hs = np.round(ws * r)
        for s in SCALES:
            w, h = ws * s, hs * s
            out.append([7.5 - (w - 1) / 2, 7.5 - (h - 1) / 2, 7.5 + (w - 1) / 2, 7.5 + (h - 1) / 2])
    return np.asarray(out)


def _overlaps(b, q):
    iw = np.minimum(b[:, None, 2], q[None, :, 2]) - np.maximum(b[:, None, 0], q[None, :, 0]) + 1
    ih = np.minimum(b[:, None, 3], q[None, :, 3]) - np.maximum(b[:, None, 1], q[None, :, 1]) + 1
    area_b = (b[:, 2] - b[:, 0] + 1) * (b[:, 3] - b[:, 1] + 1)
    area_q = (q[:, 2] - q[:, 0] + 1) * (q[:, 3] - q[:, 1] + 1)
    inter = np.where((iw > 0) & (ih > 0), iw * ih, 0.0)
    return inter / (area_b[:, None] + area_q[None] - inter)


def _deltas(ex, gt):
    ew, eh = ex[:, 2] - ex[:, 0] + 1.0, ex[:, 3] - ex[:, 1] + 1.0
    gw, gh = gt[:, 2] - gt[:, 0] + 1.0, gt[:, 3] - gt[:, 1] + 1.0
    dx = (gt[:, 0] + 0.5 * gw - ex[:, 0] - 0.5 * ew) / ew
    dy = (gt[:, 1] + 0.5 * gh - ex[:, 1] - 0.5 * eh) / eh
    return np.stack([dx, dy, np.log(gw / ew), np.log(gh / eh)], 1)


def anchor_targets(all_anchors, gt, size, rng):
    """py-faster-rcnn's anchor target rules, numpy (labels (K·A,), targets, in, out (K·A, 4))."""
    inside = np.where((all_anchors[:, :2] >= 0).all(1) & (all_anchors[:, 2:] < size).all(1))[0]
    ov = _overlaps(all_anchors[inside], gt[:, :4])
    arg, mx = ov.argmax(1), ov.max(1)
    labels = np.full(len(inside), -1.0)
    labels[mx < 0.3] = 0
    labels[np.where(ov == ov.max(0))[0]] = 1
    labels[mx >= 0.7] = 1
    fg = np.where(labels == 1)[0]
    if len(fg) > 128:
        labels[rng.choice(fg, len(fg) - 128, replace=False)] = -1
    bg = np.where(labels == 0)[0]
    if len(bg) > 256 - (labels == 1).sum():
        labels[rng.choice(bg, len(bg) - 256 + (labels == 1).sum(), replace=False)] = -1
    n = len(all_anchors)
    out_l = np.full(n, -1.0)
    out_l[inside] = labels
    t = np.zeros((n, 4))
    t[inside] = _deltas(all_anchors[inside], gt[arg, :4])
    w_in = np.zeros((n, 4))
    w_in[out_l == 1] = 1
    w_out = np.zeros((n, 4))
    w_out[out_l >= 0] = 1.0 / max((out_l >= 0).sum(), 1)
    return out_l, t, w_in, w_out


def proposal_targets(rois, gt, rng):
    """py-faster-rcnn's proposal target rules, numpy: 128 rois (≤ 32 fg), labels, targets."""
    rois = np.vstack([rois, gt[:, :4]])
    ov = _overlaps(rois, gt[:, :4])
    arg, mx = ov.argmax(1), ov.max(1)
    fg = np.where(mx >= 0.5)[0]
    fg = rng.choice(fg, min(32, len(fg)), replace=False)
    bg = np.where(mx < 0.5)[0]
    bg = rng.choice(bg, min(128 - len(fg), len(bg)), replace=False)
    keep = np.concatenate([fg, bg]).astype(int)
    labels = gt[arg[keep], 4].astype(int)
    labels[len(fg) :] = 0
    t = _deltas(rois[keep], gt[arg[keep], :4]) / np.array([0.1, 0.1, 0.2, 0.2])
    targets = np.zeros((len(keep), 4 * CLASSES))
    w = np.zeros_like(targets)
    for i, c in enumerate(labels):
        if c > 0:
            targets[i, 4 * c : 4 * c + 4] = t[i]
            w[i, 4 * c : 4 * c + 4] = 1
    return rois[keep], labels, targets, w


def peer():
    import torch
    import torch.nn.functional as F

    from examples.detection.synthetic_boxes import make_image

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    chw, boxes, labels = make_image(rng, SIZE)
    image = torch.tensor(chw[None].astype(np.float32) - 120)
    gt = np.hstack([boxes, labels[:, None]])
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512]
    layers, c = [], 3
    for v in cfg:
        if v == "M":
            layers.append(torch.nn.MaxPool2d(2, 2))
        else:
            layers += [torch.nn.Conv2d(c, v, 3, padding=1), torch.nn.ReLU(inplace=True)]
            c = v
    body = torch.nn.Sequential(*layers)
    for p in list(body.parameters())[:8]:
        p.requires_grad_(False)  # conv1_x, conv2_x: lr_mult 0
    a = len(_anchors())
    rpn = torch.nn.Conv2d(512, 512, 3, padding=1)
    rpn_cls, rpn_box = torch.nn.Conv2d(512, 2 * a, 1), torch.nn.Conv2d(512, 4 * a, 1)
    fc6, fc7 = torch.nn.Linear(512 * 49, 4096), torch.nn.Linear(4096, 4096)
    cls, box = torch.nn.Linear(4096, CLASSES), torch.nn.Linear(4096, 4 * CLASSES)
    mods = [body, rpn, rpn_cls, rpn_box, fc6, fc7, cls, box]
    params = [p for m in mods for p in m.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.001, momentum=0.9, weight_decay=0.0005)
    h = w = SIZE // 16
    sx, sy = np.meshgrid(np.arange(w) * 16, np.arange(h) * 16)
    shifts = np.stack([sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel()], 1)
    all_anchors = (_anchors()[None] + shifts[:, None]).reshape(-1, 4)

    def smooth_l1(pred, target, w_in, w_out, sigma):
        d = w_in * (pred - target)
        s2 = sigma**2
        f = torch.where(d.abs() < 1 / s2, 0.5 * s2 * d * d, d.abs() - 0.5 / s2)
        return (w_out * f).sum() / pred.shape[0]

    def step():
        opt.zero_grad()
        feat = body(image)
        r = F.relu(rpn(feat))
        score = rpn_cls(r)  # (1, 2A, H, W)
        deltas = rpn_box(r)
        lab, t, w_in, w_out = anchor_targets(all_anchors, gt, SIZE, rng)
        score_hw = score.view(1, 2, a, h, w).permute(0, 3, 4, 2, 1).reshape(-1, 2)
        d_hw = deltas.view(1, a, 4, h, w).permute(0, 3, 4, 1, 2).reshape(-1, 4)
        loss = F.cross_entropy(score_hw, torch.tensor(lab, dtype=torch.long), ignore_index=-1)
        loss = loss + smooth_l1(d_hw, *(torch.tensor(x, dtype=torch.float32) for x in (t, w_in,
                                w_out)), 3.0)  # fmt: skip
        with torch.no_grad():
            fg = F.softmax(score_hw, 1)[:, 1]
            props = _decode(torch.tensor(all_anchors, dtype=torch.float32), d_hw)
            props = props.clamp(0, SIZE - 1)
            order = fg.argsort(descending=True)[:12000]
            keep = _nms(props[order], 0.7)[:2000]
            rois = props[order][keep].numpy()
        rois, labels_r, targets, w_roi = proposal_targets(rois, gt, rng)
        pooled = _roi_pool(feat, torch.tensor(rois, dtype=torch.float32))
        x = F.dropout(F.relu(fc6(pooled.flatten(1))), 0.5, True)
        x = F.dropout(F.relu(fc7(x)), 0.5, True)
        loss = loss + F.cross_entropy(cls(x), torch.tensor(labels_r))
        tw = torch.tensor(w_roi, dtype=torch.float32)
        loss = loss + smooth_l1(box(x), torch.tensor(targets, dtype=torch.float32), tw, tw, 1.0)
        loss.backward()
        opt.step()
        return float(loss)

    return step


def _decode(boxes, d):
    import torch

    w, h = boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1
    cx, cy = boxes[:, 0] + 0.5 * w, boxes[:, 1] + 0.5 * h
    pcx, pcy = d[:, 0] * w + cx, d[:, 1] * h + cy
    pw, ph = torch.exp(d[:, 2]) * w, torch.exp(d[:, 3]) * h
    return torch.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw, pcy + 0.5 * ph], 1)


def _nms(boxes, thresh):
    import torch

    x1, y1, x2, y2 = boxes.unbind(1)
    area = (x2 - x1 + 1) * (y2 - y1 + 1)
    iw = (torch.minimum(x2[:, None], x2) - torch.maximum(x1[:, None], x1) + 1).clamp(min=0)
    ih = (torch.minimum(y2[:, None], y2) - torch.maximum(y1[:, None], y1) + 1).clamp(min=0)
    iou = iw * ih / (area[:, None] + area - iw * ih)
    suppressed = torch.zeros(len(boxes), dtype=torch.bool)
    keep = []
    for i in range(len(boxes)):
        if not suppressed[i]:
            keep.append(i)
            suppressed |= iou[i] > thresh
    return torch.tensor(keep, dtype=torch.long)


def _roi_pool(feat, rois):
    import torch
    import torch.nn.functional as F

    out = []
    for x1, y1, x2, y2 in torch.round(rois / 16).long().tolist():
        patch = feat[0, :, max(y1, 0) : max(y2, y1) + 1, max(x1, 0) : max(x2, x1) + 1]
        out.append(F.adaptive_max_pool2d(patch, 7))
    return torch.stack(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=3)
    args = parser.parse_args()
    info = machine()
    with tempfile.TemporaryDirectory() as tmp:
        row = Row("VGG16 Faster R-CNN end2end train step, 224×224, iter_size 1", "PyTorch eager")
        row.note = "noisy: shared machine"
        measure(row, ours(Path(tmp)), peer, calls=1, blocks=args.blocks)
    write("frcnn_train", "Faster R-CNN (VGG16) training step", [row], info,
          "python benchmarks/frcnn_train.py")  # fmt: skip
    print(result_line("faster-rcnn-vgg16-train-224", row.ours_ms, row.peer_ms))


if __name__ == "__main__":
    main()
