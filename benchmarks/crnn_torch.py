"""The PyTorch peer of benchmarks/crnn_train.py: CRNN's train net (yalecyu/crnn.caffe) written
by hand in torch, holding copies of caffe2jax's initial weights.

Layer for layer: Convolution (``F.conv2d``), BatchNorm in training mode (batch statistics,
biased variance, eps 1e-5: ``F.batch_norm`` with ``training=True``), Scale, ReLU, max Pooling,
Reshape (N, C, H·W) and Permute to (T, N, C), the two LSTMs as ``nn.LSTM`` (Caffe's gates are
stored i, f, o, g; torch's i, f, g, o: the rows are reordered when copied; Caffe has one bias,
torch two: ``bias_hh`` is held at zero and frozen), fc1 over axis 2, and ``F.ctc_loss`` with
the fork's blank (10). Caffe's LSTM starts each forward from ``cont`` = 0 at t = 0, i.e. from a
zero state, as ``nn.LSTM`` does.

CtcLoss's forward is Σ_n CTC_n / N but its diff is warp-ctc's unscaled per-sequence gradient
(lowering/forks/crnn.py): the peer back-propagates the sum and reports the sum / N. A sequence
that cannot be aligned costs 0 (``zero_infinity``). The solver is Caffe's SGD with the net's
lr/decay multipliers (biases lr × 2, fc1's bias no decay) as torch parameter groups, and
``clip_gradients`` as ``clip_grad_norm_`` (Caffe scales by clip / ‖g‖ over all learnable
diffs before regularization; torch by clip / (‖g‖ + 1e-6)). LabelsequenceAccuracy's greedy
decoding is computed too (no gradient), as the net's train outputs include it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

BLANK = 10


def _gates_caffe_to_torch(w: np.ndarray) -> torch.Tensor:
    """Caffe's (4H, ·) rows [i f o g] → torch's [i f g o]."""
    i, f, o, g = np.split(np.asarray(w, np.float32), 4, axis=0)
    return torch.from_numpy(np.concatenate([i, f, g, o], axis=0).copy())


class Twin(nn.Module):
    """The net after its data layer, walked in the prototxt's order on copied blobs."""

    def __init__(self, net, params: dict[str, list]) -> None:
        super().__init__()
        self.layers = [la for la in net.layer if la.type not in ("Input", "HDF5Data")]
        self.blobs = nn.ParameterDict()
        self.lstms = nn.ModuleDict()
        for layer in self.layers:
            blobs = params.get(layer.name, [])
            if layer.type == "LSTM":
                self.lstms[layer.name] = self._lstm(blobs)
            elif layer.type in ("Convolution", "Scale", "InnerProduct"):
                for k, b in enumerate(blobs):
                    self.blobs[f"{layer.name}__{k}"] = nn.Parameter(torch.tensor(np.asarray(b)))

    @staticmethod
    def _lstm(blobs) -> nn.LSTM:
        w_xc, b_c, w_hc = (np.asarray(b) for b in blobs)
        hidden = w_hc.shape[1]
        lstm = nn.LSTM(w_xc.shape[1], hidden)
        with torch.no_grad():
            lstm.weight_ih_l0.copy_(_gates_caffe_to_torch(w_xc))
            lstm.weight_hh_l0.copy_(_gates_caffe_to_torch(w_hc))
            lstm.bias_ih_l0.copy_(_gates_caffe_to_torch(b_c))
            lstm.bias_hh_l0.zero_()
        lstm.bias_hh_l0.requires_grad_(False)
        return lstm

    def forward(self, data: torch.Tensor) -> dict[str, torch.Tensor]:
        env = {"data": data}
        for layer in self.layers:
            out = self._layer(layer, [env.get(b) for b in layer.bottom])
            if out is not None:
                env[layer.top[0]] = out
        return env

    def _layer(self, layer, xs):  # noqa: C901 - one branch per layer type, as torch_net.py
        kind, name = layer.type, layer.name
        if kind == "Convolution":
            p = layer.convolution_param
            w, b = self.blobs[f"{name}__0"], self.blobs[f"{name}__1"]
            return F.conv2d(xs[0], w, b, p.stride[0] if p.stride else 1, p.pad[0] if p.pad else 0)
        if kind == "BatchNorm":
            return F.batch_norm(xs[0], None, None, training=True, eps=layer.batch_norm_param.eps)
        if kind == "Scale":
            w, b = self.blobs[f"{name}__0"], self.blobs[f"{name}__1"]
            return xs[0] * w[:, None, None] + b[:, None, None]
        if kind == "ReLU":
            return F.relu(xs[0])
        if kind == "Pooling":
            p = layer.pooling_param
            return F.max_pool2d(xs[0], p.kernel_size, p.stride, ceil_mode=True)
        if kind == "Reshape":
            return xs[0].reshape(*layer.reshape_param.shape.dim)
        if kind == "Permute":
            return xs[0].permute(*layer.permute_param.order)
        if kind == "LSTM":
            return self.lstms[name](xs[0])[0]
        if kind == "InnerProduct":
            return xs[0] @ self.blobs[f"{name}__0"].t() + self.blobs[f"{name}__1"]
        return None  # ContinuationIndicator (nn.LSTM's zero start), CtcLoss, accuracy: below

    def groups(self, lr: float, decay: float) -> list[dict]:
        """Torch parameter groups with the net's lr/decay multipliers (layer param specs)."""
        specs = {la.name: list(la.param) for la in self.layers}
        groups = []
        for key, p in self.blobs.items():
            name, k = key.rsplit("__", 1)
            spec = specs[name][int(k)] if int(k) < len(specs[name]) else None
            lr_mult = spec.lr_mult if spec is not None and spec.HasField("lr_mult") else 1.0
            decay_mult = spec.decay_mult if spec is not None and spec.HasField("decay_mult") else 1
            groups.append({"params": [p], "lr": lr * lr_mult, "weight_decay": decay * decay_mult})
        lstm = [p for m in self.lstms.values() for p in m.parameters() if p.requires_grad]
        return groups + [{"params": lstm, "lr": lr, "weight_decay": decay}]


def ctc_sum(fc1: torch.Tensor, label: torch.Tensor, steps: int) -> torch.Tensor:
    """Σ_n CTC_n of the (T, N, C) scores against (N, L) labels padded with the blank."""
    keep = label != BLANK
    targets = label[keep].long()
    logp = F.log_softmax(fc1[:steps], dim=2)
    lengths = torch.full((fc1.shape[1],), steps, dtype=torch.long)
    return F.ctc_loss(logp, targets, lengths, keep.sum(1), blank=BLANK, reduction="sum",
                      zero_infinity=True)  # fmt: skip


def sequence_accuracy(fc1: torch.Tensor, label: torch.Tensor) -> float:
    """LabelsequenceAccuracy: greedy decoding (argmax, collapse repeats, drop blanks) equal to
    the label with its blanks removed."""
    best = fc1.argmax(2).t()  # (N, T)
    prev = torch.cat([torch.full_like(best[:, :1], BLANK), best[:, :-1]], 1)
    hits = 0
    for row, keep, truth in zip(best, (best != prev) & (best != BLANK), label.long()):
        hits += row[keep].tolist() == truth[truth != BLANK].tolist()
    return hits / len(best)


def torch_runner(net, params, x, label, solver):
    """One eager train step per call (forward, CTC sum backward, clip, SGD); returns the
    forward's loss (Σ CTC / N), as caffe2jax's step does."""
    torch.manual_seed(0)
    twin = Twin(net, params).train()
    opt = torch.optim.SGD(twin.groups(solver.base_lr, solver.weight_decay), lr=solver.base_lr,
                          momentum=solver.momentum)  # fmt: skip
    learnable = [p for g in opt.param_groups for p in g["params"]]
    ctc = next(la for la in net.layer if la.type == "CtcLoss").ctc_loss_param
    data, lab = torch.from_numpy(np.asarray(x)), torch.from_numpy(np.asarray(label))

    def run(i: int) -> float:
        opt.zero_grad()
        fc1 = twin(data)["fc1"]
        total = ctc_sum(fc1, lab, ctc.time_step)
        total.backward()
        with torch.no_grad():
            sequence_accuracy(fc1, lab)
        if solver.clip_gradients > 0:
            torch.nn.utils.clip_grad_norm_(learnable, solver.clip_gradients)
        opt.step()
        return float(total.detach()) / data.shape[0]

    return run
