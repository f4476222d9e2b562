"""The PyTorch peer of benchmarks/rfcn_train.py: py-R-FCN's ResNet-50 OHEM train net written by
hand in torch, on copies of caffe2jax's weights.

The net's layers are walked in the prototxt's order: Convolution (dilation included),
BatchNorm with its stored statistics (the net's ``use_global_stats: true``; mean and variance
divided by the scale factor blob, eps 1e-5), Scale, ReLU, Eltwise sum, Pooling (Caffe's
rounding up), Reshape (Caffe's 0 / −1 dims), Softmax, and the layers of R-FCN:

* py-faster-rcnn's AnchorTargetLayer (benchmarks/frcnn_train.py ``anchor_targets``, numpy,
  its own random fg/bg sampling) and SmoothL1Loss (σ 3, ÷ num) / SoftmaxWithLoss (ignore −1)
  of the RPN;
* py-R-FCN's ProposalLayer with rfcn_end2end_ohem.yml's TRAIN values (6000 → NMS 0.7 → 300,
  min size 16·scale): ``bbox_transform_inv`` (+1 widths), clip, filter, a stable sort by score,
  NMS by hand (torchvision is not a dependency: the IoU matrix in torch, the greedy pass over
  its rows in numpy), no gradient;
* py-R-FCN's ProposalTargetLayer (BATCH_SIZE −1, BG_THRESH_LO 0, AGONISTIC): every proposal
  and gt box kept, labels by max IoU ≥ 0.5, normalised deltas in slot 1;
* PSROIPooling without a loop over rois: each bin's row and column masks from the fork's float
  boundaries (C ``round`` half away from zero, ``floor``/``ceil``), one einsum over the maps
  viewed (output_dim, k, k, H, W), divided by the bin's area (0 for an empty bin);
* the OHEM layers: per-roi losses (−log p_label; Σ SmoothL1 over the box columns), the 128
  hardest rois (stable descending sort: ties to the lower index) relabelled/reweighted, then
  SoftmaxWithLoss over the kept (VALID) and SmoothL1LossOHEM ÷ 128 (PRE_FIXED).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.frcnn_train import _anchors, _deltas, _overlaps, anchor_targets

PRE_NMS, POST_NMS, NMS_THRESH, MIN_SIZE = 6000, 300, 0.7, 16
STDS = np.array([0.1, 0.1, 0.2, 0.2])
FLT_MIN = float(np.finfo(np.float32).tiny)


def c_round(x: torch.Tensor) -> torch.Tensor:
    """C's ``round``: halves away from zero."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def psroi_pool(x: torch.Tensor, rois: torch.Tensor, scale: float, dim: int, k: int):
    """R-FCN's PSROIPooling of (1, dim·k², H, W) maps over (R, 5) rois → (R, dim, k, k)."""
    height, width = x.shape[-2:]
    x1, y1 = c_round(rois[:, 1]) * scale, c_round(rois[:, 2]) * scale
    x2, y2 = (c_round(rois[:, 3]) + 1) * scale, (c_round(rois[:, 4]) + 1) * scale
    bin_w = torch.clamp(x2 - x1, min=0.1) / k
    bin_h = torch.clamp(y2 - y1, min=0.1) / k
    p = torch.arange(k, dtype=x.dtype)

    def masks(start, size, bins, limit):
        lo = torch.clamp(torch.floor(p[None] * bins[:, None] + start[:, None]), 0, limit)
        hi = torch.clamp(torch.ceil((p[None] + 1) * bins[:, None] + start[:, None]), 0, limit)
        cells = torch.arange(limit, dtype=x.dtype)
        return ((cells >= lo[..., None]) & (cells < hi[..., None])).to(x.dtype), hi - lo

    mh, nh = masks(y1, y2, bin_h, height)
    mw, nw = masks(x1, x2, bin_w, width)
    area = nh[:, :, None] * nw[:, None, :]  # (R, k, k)
    sums = torch.einsum("rih,rjw,cijhw->rcij", mh, mw, x[0].view(dim, k, k, height, width))
    return torch.where(area[:, None] > 0, sums / area.clamp(min=1)[:, None], 0.0)


def nms(boxes: torch.Tensor, thresh: float) -> np.ndarray:
    """py_cpu_nms (+1 areas; a box is dropped by a kept one of IoU > thresh), in order."""
    x1, y1, x2, y2 = boxes.unbind(1)
    area = (x2 - x1 + 1) * (y2 - y1 + 1)
    iw = (torch.minimum(x2[:, None], x2) - torch.maximum(x1[:, None], x1) + 1).clamp(min=0)
    ih = (torch.minimum(y2[:, None], y2) - torch.maximum(y1[:, None], y1) + 1).clamp(min=0)
    over = (iw * ih / (area[:, None] + area - iw * ih) > thresh).numpy()
    dropped = np.zeros(len(boxes), bool)
    keep = []
    for i in range(len(boxes)):
        if not dropped[i]:
            keep.append(i)
            dropped |= over[i]
    return np.asarray(keep, np.int64)


def proposals(prob: torch.Tensor, deltas: torch.Tensor, info: np.ndarray) -> torch.Tensor:
    """py-R-FCN's ProposalLayer (TRAIN, rfcn_end2end_ohem.yml: deltas × RPN_NORMALIZE_STDS) → (R, 5)
    rois, no gradient."""
    a = len(_anchors())
    h, w = prob.shape[-2:]
    sx, sy = np.meshgrid(np.arange(w) * 16, np.arange(h) * 16)
    shifts = np.stack([sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel()], 1)
    anchors = torch.tensor((_anchors()[None] + shifts[:, None]).reshape(-1, 4), dtype=torch.float32)
    scores = prob[0, a:].permute(1, 2, 0).reshape(-1)
    # rfcn_end2end_ohem.yml's RPN_NORMALIZE_TARGETS: TRAIN un-normalises the deltas (× stds)
    d = deltas[0].permute(1, 2, 0).reshape(-1, 4) * torch.tensor(STDS, dtype=torch.float32)
    bw, bh = anchors[:, 2] - anchors[:, 0] + 1, anchors[:, 3] - anchors[:, 1] + 1
    cx, cy = anchors[:, 0] + 0.5 * bw, anchors[:, 1] + 0.5 * bh
    pcx, pcy = d[:, 0] * bw + cx, d[:, 1] * bh + cy
    pw, ph = torch.exp(d[:, 2]) * bw, torch.exp(d[:, 3]) * bh
    xs = torch.stack([pcx - 0.5 * pw, pcx + 0.5 * pw], 1).clamp(0, info[1] - 1)
    ys = torch.stack([pcy - 0.5 * ph, pcy + 0.5 * ph], 1).clamp(0, info[0] - 1)
    boxes = torch.stack([xs[:, 0], ys[:, 0], xs[:, 1], ys[:, 1]], 1)
    size = MIN_SIZE * info[2]
    ok = ((boxes[:, 2] - boxes[:, 0] + 1) >= size) & ((boxes[:, 3] - boxes[:, 1] + 1) >= size)
    boxes, scores = boxes[ok], scores[ok]
    order = torch.argsort(scores, descending=True, stable=True)[:PRE_NMS]
    boxes = boxes[order]
    boxes = boxes[torch.from_numpy(nms(boxes, NMS_THRESH)[:POST_NMS])]
    return torch.cat([torch.zeros(len(boxes), 1), boxes], 1)


def proposal_targets(rois: np.ndarray, gt: np.ndarray):
    """py-R-FCN's ProposalTargetLayer (every candidate kept, class-agnostic slot 1)."""
    rois = np.vstack([rois, np.hstack([np.zeros((len(gt), 1)), gt[:, :4]])])
    ov = _overlaps(rois[:, 1:], gt[:, :4])
    arg, best = ov.argmax(1), ov.max(1)
    labels = np.where(best >= 0.5, gt[arg, 4], 0).astype(np.int64)
    targets, weights = np.zeros((len(rois), 8)), np.zeros((len(rois), 8))
    fg = labels > 0
    targets[fg, 4:] = _deltas(rois[fg, 1:], gt[arg[fg], :4]) / STDS
    weights[fg, 4:] = 1
    return rois, labels, targets, weights


def _smooth_l1(d: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    s2 = sigma * sigma
    return torch.where(d.abs() < 1 / s2, 0.5 * s2 * d * d, d.abs() - 0.5 / s2)


def rpn_losses(env: dict, gt: np.ndarray, size: int, rng) -> torch.Tensor:
    """The RPN's SoftmaxWithLoss and SmoothL1Loss (σ 3) on the anchor targets, normalised by
    RPN_NORMALIZE_STDS as rfcn_end2end_ohem.yml sets."""
    score = env["rpn_cls_score"]
    a, (h, w) = score.shape[1] // 2, score.shape[-2:]
    sx, sy = np.meshgrid(np.arange(w) * 16, np.arange(h) * 16)
    shifts = np.stack([sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel()], 1)
    labels, t, w_in, w_out = anchor_targets((_anchors()[None] + shifts[:, None]).reshape(-1, 4),
                                            gt, size, rng)  # fmt: skip
    t = t / STDS  # RPN_NORMALIZE_TARGETS: (t − means) / stds, means 0
    spatial = lambda v, c: torch.tensor(v.reshape(h, w, a * c).transpose(2, 0, 1)[None],  # noqa: E731
                                        dtype=torch.float32)  # fmt: skip
    lab = spatial(labels, 1).reshape(1, a * h, w).long()
    cls = F.cross_entropy(score.view(1, 2, a * h, w), lab, ignore_index=-1)
    d = spatial(w_in, 4) * (env["rpn_bbox_pred"] - spatial(t, 4))
    return cls + (spatial(w_out, 4) * _smooth_l1(d, 3.0)).sum()


def ohem_losses(env: dict, rois: np.ndarray, gt: np.ndarray) -> tuple[torch.Tensor, ...]:
    """Proposal targets, PSROIPooling, the OHEM selection and R-FCN's two losses."""
    rois, labels, targets, weights = proposal_targets(rois, gt)
    r = torch.tensor(rois, dtype=torch.float32)
    k = 7
    cls = psroi_pool(env["rfcn_cls"], r, 0.0625, env["rfcn_cls"].shape[1] // k**2, k)
    loc = psroi_pool(env["rfcn_bbox"], r, 0.0625, 8, k)
    cls_score, bbox_pred = cls.mean((2, 3)), loc.mean((2, 3))
    lab = torch.from_numpy(labels)
    t = torch.tensor(targets, dtype=torch.float32)
    w_in = torch.tensor(weights, dtype=torch.float32)
    with torch.no_grad():
        p = F.softmax(cls_score, 1).gather(1, lab[:, None])[:, 0]
        per_roi = -torch.log(p.clamp(min=FLT_MIN)) + _smooth_l1(w_in * (bbox_pred - t)).sum(1)
        hard = torch.argsort(per_roi, descending=True, stable=True)[:128]
        kept = torch.zeros(len(lab), dtype=torch.bool)
        kept[hard] = True
        lab_ohem = torch.where(kept, lab, -1)
        w_ohem = w_in * kept[:, None]
        (cls_score.argmax(1)[kept] == lab[kept]).float().mean()  # the net's Accuracy
    loss_cls = F.cross_entropy(cls_score, lab_ohem, ignore_index=-1)
    loss_bbox = _smooth_l1(w_ohem * (bbox_pred - t)).sum() / 128
    return loss_cls, loss_bbox, per_roi


def _pair(values, default: int) -> int:
    return int(values[0]) if len(values) else default


class Twin:
    """The layers with blobs or arithmetic, walked in order; the Python and OHEM layers are
    the functions above, called by :meth:`losses`."""

    SKIP = ("Python", "PSROIPooling", "SoftmaxWithLossOHEM", "SmoothL1LossOHEM", "Silence",
            "BoxAnnotatorOHEM", "SoftmaxWithLoss", "SmoothL1Loss", "Accuracy")  # fmt: skip

    def __init__(self, net, blobs: dict[str, list[np.ndarray]]) -> None:
        self.layers = [la for la in net.layer if la.type not in self.SKIP]
        self.blobs, self.groups = {}, []
        for layer in self.layers:
            specs = list(layer.param)
            for i, b in enumerate(blobs.get(layer.name, [])):
                spec = specs[i] if i < len(specs) else None
                lr = spec.lr_mult if spec is not None and spec.HasField("lr_mult") else 1.0
                decay = spec.decay_mult if spec is not None and spec.HasField("decay_mult") else 1.0
                learn = layer.type != "BatchNorm" and lr > 0
                t = torch.tensor(np.asarray(b), requires_grad=learn)
                self.blobs.setdefault(layer.name, []).append(t)
                if learn:
                    self.groups.append({"params": [t], "lr_mult": lr, "decay_mult": decay})

    def forward(self, env: dict) -> dict:
        for layer in self.layers:
            if any(b not in env for b in layer.bottom):
                continue  # the head after PSROIPooling: ohem_losses
            xs = [env[b] for b in layer.bottom]
            env[layer.top[0]] = self._layer(layer, self.blobs.get(layer.name, []), xs)
        return env

    @staticmethod
    def _layer(layer, w, xs):  # noqa: C901 - one branch per layer type
        kind = layer.type
        if kind == "Convolution":
            p = layer.convolution_param
            return F.conv2d(xs[0], w[0], w[1] if len(w) > 1 else None, _pair(p.stride, 1),
                            _pair(p.pad, 0), _pair(p.dilation, 1), p.group or 1)  # fmt: skip
        if kind == "BatchNorm":
            sf = float(w[2].reshape(-1)[0])
            sf = 0.0 if sf == 0 else 1 / sf
            return F.batch_norm(xs[0], w[0] * sf, w[1] * sf, training=False,
                                eps=layer.batch_norm_param.eps)  # fmt: skip
        if kind == "Scale":
            return xs[0] * w[0][:, None, None] + (w[1][:, None, None] if len(w) > 1 else 0)
        if kind == "ReLU":
            return F.relu(xs[0])
        if kind == "Eltwise":
            return sum(xs[1:], xs[0])
        if kind == "Pooling":
            p = layer.pooling_param
            pool = F.max_pool2d if p.pool == 0 else F.avg_pool2d
            return pool(xs[0], p.kernel_size, p.stride, p.pad, ceil_mode=True)
        if kind == "Reshape":
            dims = layer.reshape_param.shape.dim
            dims = [xs[0].shape[i] if d == 0 else d for i, d in enumerate(dims)]
            return xs[0].reshape(dims)
        if kind == "Softmax":
            return F.softmax(xs[0], 1)
        raise NotImplementedError(f"layer '{layer.name}' of type {kind} has no torch twin")

    def losses(self, data, info, gt, rng) -> tuple[torch.Tensor, ...]:
        """(RPN losses, R-FCN's loss_cls, loss_bbox, per-roi losses) of one image."""
        env = self.forward({"data": data})
        with torch.no_grad():
            rois = proposals(env["rpn_cls_prob_reshape"], env["rpn_bbox_pred"], info).numpy()
        rpn = rpn_losses(env, gt, data.shape[-1], rng)
        return (rpn, *ohem_losses(env, rois, gt))


def torch_runner(net, blobs, data, info, gt, lr, momentum, decay):
    """(twin, step): one eager train step per call (forward, backward, SGD with the net's
    lr/decay multipliers), returning the summed loss."""
    torch.manual_seed(0)
    twin = Twin(net, blobs)
    groups = [{"params": g["params"], "lr": lr * g["lr_mult"],
               "weight_decay": decay * g["decay_mult"]} for g in twin.groups]  # fmt: skip
    opt = torch.optim.SGD(groups, lr=lr, momentum=momentum)
    x = torch.tensor(np.asarray(data, np.float32))
    rng = np.random.default_rng(0)

    def step() -> float:
        opt.zero_grad()
        rpn, loss_cls, loss_bbox, _ = twin.losses(x, info, gt, rng)
        loss = rpn + loss_cls + loss_bbox
        loss.backward()
        opt.step()
        return float(loss.detach())

    return twin, step
