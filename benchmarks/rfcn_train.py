"""py-R-FCN's ResNet-50 OHEM end-to-end train net (../shared/forks/models/
rfcn_resnet50_voc_train_ohem.prototxt, read in place): caffe2jax's train step vs a hand-written
PyTorch eager twin (benchmarks/rfcn_torch.py), in one run.

    python benchmarks/rfcn_train.py [--size 224] [--blocks 3] [--calls 1]

The net as examples/detection/rfcn_train.py rewrites it (synthetic box images of ``--size``²,
4 classes, anchors (2, 4, 8)·16 px) with its random "ImageNet" weights (BatchNorm statistics
measured on synthetic images); the solver is py-R-FCN's (lr 0.001, momentum 0.9, weight decay
5e-4) with **iter_size 1** (the recipe's 2 would time two passes). caffe2jax:
``solver.step(1)`` of pycaffe's SGDSolver (the built-in RoIDataLayer's LMDB read included).
PyTorch: the twin on copies of the same initial weights and the image caffe2jax's data layer
read first.

Agreement, checked before timing on that image at the shared weights: the rois the proposal
layer keeps, and R-FCN's OHEM losses ``loss_cls`` and ``loss_bbox`` (proposals → proposal
targets → PSROIPooling → per-roi losses → the 128 hardest → the losses: deterministic; the
proposal target layer's random order does not change them). The RPN's losses are not
compared: the anchor target layer samples 256 anchors at random on each side (caffe2jax's JAX
key, the twin's numpy generator). Timings on a shared machine are noisy: compare the ratio,
measured in alternating blocks (benchmarks/harness.py)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Row, machine, measure, result_line, write  # noqa: E402

LR, MOMENTUM, DECAY = 0.001, 0.9, 0.0005


def ours(work: Path, size: int):
    """pycaffe's SGDSolver on the rewritten net, at the random init weights."""
    import caffe2jax as caffe
    from examples.detection import rfcn_train

    if not rfcn_train.MODEL.exists():
        raise SystemExit(f"py-R-FCN's train net is missing: {rfcn_train.MODEL} (the fork set)")
    solver_path = rfcn_train.prepare(work, size, 8, max_iter=10**6, snapshot=0)
    text = solver_path.read_text().replace("iter_size: 2", "iter_size: 1")
    solver_path.write_text(text.replace("display: 20", "display: 0"))
    solver = caffe.SGDSolver(str(solver_path))
    solver.net.copy_from(str(work / "init.caffemodel"))
    return solver


def agreement(solver, twin_of) -> tuple[str, object]:
    """Forward caffe2jax's net once (its data layer reads an image), run the twin on that
    image and weights; (a line stating the agreement, the twin's step)."""
    import torch

    net = solver.net
    blobs = {name: [np.array(b.data) for b in bs] for name, bs in net.params.items()}
    net.forward()
    data = np.array(net.blobs["data"].data)
    info = np.array(net.blobs["im_info"].data).reshape(-1)
    gt = np.array(net.blobs["gt_boxes"].data).reshape(-1, 5)
    gt = gt[(gt[:, 2] > gt[:, 0]) & (gt[:, 3] > gt[:, 1])]
    twin, step = twin_of(blobs, data, info, gt)
    ours_rois = np.array(net.blobs["rpn_rois"].data).reshape(-1, 5)
    ours_rois = ours_rois[np.abs(ours_rois[:, 1:]).sum(1) > 0]
    with torch.no_grad():
        _, loss_cls, loss_bbox, per_roi = twin.losses(torch.tensor(data), info, gt,
                                                    np.random.default_rng(0))  # fmt: skip
        from benchmarks.rfcn_torch import proposals

        env = twin.forward({"data": torch.tensor(data)})
        rois = proposals(env["rpn_cls_prob_reshape"], env["rpn_bbox_pred"], info).numpy()
    same = len(rois) == len(ours_rois)
    as_set = [r[np.lexsort(r[:, ::-1].T)] for r in (rois, ours_rois)]  # near-tied scores
    roi_diff = float(np.abs(as_set[0] - as_set[1]).max()) if same else float("nan")
    theirs = np.sort(per_roi.numpy())[::-1]
    mine = np.sort(np.array(net.blobs["per_roi_loss"].data).reshape(-1))[::-1][: len(theirs)]
    per_roi_diff = float(np.abs(mine - theirs).max())
    pairs = [(float(net.blobs["loss_cls"].data), float(loss_cls)),
             (float(net.blobs["loss_bbox"].data), float(loss_bbox))]  # fmt: skip
    rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in pairs]
    line = (f"agreement at the shared weights: proposals {len(ours_rois)} / {len(rois)} rois "
            f"(as sets: max |Δ| {roi_diff:.1e} px); per-roi OHEM losses of the {len(theirs)} "
            f"proposal-target rois, sorted: max |Δ| {per_roi_diff:.1e}; loss_cls "
            f"{pairs[0][0]:.6f} / {pairs[0][1]:.6f} (rel {rel[0]:.1e}), loss_bbox "
            f"{pairs[1][0]:.6f} / {pairs[1][1]:.6f} (rel {rel[1]:.1e}) (caffe2jax / "
            "PyTorch)")  # fmt: skip
    return line, step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1)
    args = parser.parse_args()
    from google.protobuf import text_format

    from benchmarks.rfcn_torch import torch_runner
    from caffe2jax.frontend import caffe_pb2

    info = machine()
    with tempfile.TemporaryDirectory() as tmp:
        solver = ours(Path(tmp), args.size)
        text = (Path(tmp) / "train.prototxt").read_text()
        net = text_format.Parse(text, caffe_pb2.NetParameter())

        def twin_of(blobs, data, im_info, gt):
            return torch_runner(net, blobs, data, im_info, gt, LR, MOMENTUM, DECAY)

        line, peer_step = agreement(solver, twin_of)
        print(line)
        row = Row(f"R-FCN ResNet-50 OHEM train step, {args.size}×{args.size}, iter_size 1",
                  "PyTorch eager")  # fmt: skip
        row.note = "noisy: shared machine"
        measure(row, lambda: solver.step(1), lambda: peer_step, args.calls, args.blocks)
    write("rfcn_train", "R-FCN (ResNet-50, OHEM) training step", [row], info,
          "python benchmarks/rfcn_train.py")  # fmt: skip
    print(result_line(f"rfcn-resnet50-ohem-train-{args.size}", row.ours_ms, row.peer_ms))


if __name__ == "__main__":
    main()
