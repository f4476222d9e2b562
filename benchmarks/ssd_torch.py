"""The PyTorch peer of benchmarks/ssd_train.py: MobileNet-SSD's train net as torch ops in the
prototxt's layer order, and SSD's MultiBoxLoss written for torch (the same matching, mining,
encoding and normalization as the fork; one image at a time, as torchvision's SSD loss)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

OVERLAP, NEG_RATIO, NEG_OVERLAP = 0.5, 3.0, 0.5


class Net(nn.Module):
    """Convolution / BatchNorm (training statistics) / Scale / ReLU / Permute / Flatten /
    Concat, run in order; PriorBox outputs are constants given to the loss."""

    def __init__(self, net) -> None:
        super().__init__()
        self.layers, self.mods = [], nn.ModuleDict()
        channels = {"data": 3}
        for layer in net.layer:
            kind, name = layer.type, layer.name.replace(".", "_")
            c = channels.get(layer.bottom[0]) if layer.bottom else None
            if kind == "Convolution":
                p = layer.convolution_param
                self.mods[name] = nn.Conv2d(
                    c, p.num_output, p.kernel_size[0], p.stride[0] if p.stride else 1,
                    p.pad[0] if p.pad else 0, groups=p.group, bias=p.bias_term)  # fmt: skip
                c = p.num_output
            elif kind == "BatchNorm":
                self.mods[name] = nn.BatchNorm2d(c, eps=1e-5, momentum=0.001, affine=False)
            elif kind == "Scale":
                self.mods[name] = Scale(c)
            if layer.top and c is not None:
                channels[layer.top[0]] = c
            self.layers.append((kind, name, layer))

    def forward(self, data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        blobs = {"data": data}
        for kind, name, layer in self.layers:
            ins = [blobs.get(b) for b in layer.bottom]
            if kind in ("Convolution", "BatchNorm", "Scale"):
                out = self.mods[name](ins[0])
            elif kind == "ReLU":
                out = F.relu(ins[0])
            elif kind == "Permute":
                out = ins[0].permute(*layer.permute_param.order)
            elif kind == "Flatten":
                out = ins[0].flatten(1)
            elif kind == "Concat" and all(t is not None for t in ins):
                out = torch.cat(ins, dim=layer.concat_param.axis)
            else:  # Input, PriorBox, the priors' Concat, MultiBoxLoss
                continue
            blobs[layer.top[0]] = out
        return blobs["mbox_loc"], blobs["mbox_conf"]


class Scale(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1, c, 1, 1))
        self.bias = nn.Parameter(torch.zeros(1, c, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + self.bias


def jaccard(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


def match(priors: torch.Tensor, gts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bipartite then per-prediction matching: (gt index or −1 per prior, best overlap)."""
    iou = jaccard(priors, gts)
    recorded = iou > 1e-6
    m = torch.full((len(priors),), -1, dtype=torch.long)
    used = torch.zeros(len(gts), dtype=torch.bool)
    for _ in range(len(gts)):
        score = torch.where(recorded & (m == -1)[:, None] & ~used[None, :], iou, -1.0)
        flat = int(torch.argmax(score))
        i, j = divmod(flat, len(gts))
        if score[i, j] <= -1:
            break
        m[i], used[j] = j, True
    score = torch.where(recorded & (iou >= OVERLAP), iou, -1.0)
    best, arg = score.max(1)
    m = torch.where((m == -1) & (best > -1), arg, m)
    return m, torch.where(recorded, iou, 0.0).max(1).values


def encode(priors, var, gt):
    pw, ph = priors[:, 2] - priors[:, 0], priors[:, 3] - priors[:, 1]
    pcx, pcy = (priors[:, 0] + priors[:, 2]) / 2, (priors[:, 1] + priors[:, 3]) / 2
    gw, gh = gt[:, 2] - gt[:, 0], gt[:, 3] - gt[:, 1]
    gcx, gcy = (gt[:, 0] + gt[:, 2]) / 2, (gt[:, 1] + gt[:, 3]) / 2
    t = torch.stack([(gcx - pcx) / pw, (gcy - pcy) / ph, torch.log(gw / pw), torch.log(gh / ph)], 1)
    return t / var


def multibox_loss(loc, conf, priors, var, label, classes: int) -> torch.Tensor:
    n = loc.shape[0]
    loc, conf = loc.view(n, -1, 4), conf.view(n, -1, classes)
    loc_sum, conf_sum, matches = loc.new_zeros(()), conf.new_zeros(()), 0
    for i in range(n):
        rows = label[label[:, 0] == i]
        if len(rows) == 0:
            continue
        m, overlap = match(priors, rows[:, 3:7])
        pos = m > -1
        target = torch.where(pos, rows[m.clamp(min=0), 1].long(), 0)
        logp = F.log_softmax(conf[i], -1)
        with torch.no_grad():
            mining = -logp[:, 0]
            eligible = (m == -1) & (overlap < NEG_OVERLAP)
            k = min(int(int(pos.sum()) * NEG_RATIO), int(eligible.sum()))
            order = torch.argsort(torch.where(eligible, -mining, float("inf")), stable=True)
            neg = torch.zeros_like(pos)
            neg[order[:k]] = True
        t = encode(priors[pos], var[pos], rows[m[pos], 3:7])
        loc_sum = loc_sum + F.smooth_l1_loss(loc[i][pos], t, reduction="sum", beta=1.0)
        sel = pos | neg
        conf_sum = conf_sum + F.nll_loss(logp[sel], target[sel], reduction="sum")
        matches += int(pos.sum())
    return (loc_sum + conf_sum) / max(1, matches)


def torch_runner(net, x, label, priors, lr, momentum, decay):
    """One eager train step per call (forward, loss, backward, SGD with weight decay)."""
    torch.manual_seed(0)
    model = Net(net).train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=decay)
    classes = next(la for la in net.layer if la.type == "MultiBoxLoss")
    classes = classes.multibox_loss_param.num_classes
    data = torch.from_numpy(x)
    rows = torch.from_numpy(np.asarray(label).reshape(-1, 8))
    rows = rows[rows[:, 0] != -1]
    pri = torch.from_numpy(np.array(priors).reshape(2, -1, 4))

    def run(i: int) -> float:
        opt.zero_grad()
        loc, conf = model(data)
        loss = multibox_loss(loc, conf, pri[0], pri[1], rows, classes)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return run
