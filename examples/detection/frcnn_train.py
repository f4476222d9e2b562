#!/usr/bin/env python
"""Train py-faster-rcnn's VGG16 end-to-end net on a synthetic box set with caffe2jax's
built-in Faster R-CNN layers, through the CLI, then evaluate it (VOC AP at IoU 0.5).

    python examples/detection/frcnn_train.py WORKDIR [--iters 2000] [--size 128] [--count 48]
        [--snapshot 100] [--resume-check] [--tiny [--seed 5]]

The net is read from ``../shared/forks/models/faster_rcnn_vgg16_train.prototxt`` (never copied
into the repository) and rewritten only in data paths and sizes:

* the RoIDataLayer's ``param_str`` gets the LMDB ``source``, ``scale`` = the image side (no
  resize) and ``num_classes`` 4 (background + 3 shapes); the ProposalTargetLayer's
  ``num_classes`` 4; ``cls_score`` / ``bbox_pred`` 4 / 16 outputs;
* the anchor target and proposal layers get ``'scales': (2, 4, 8)`` (anchors of 32–128 px
  instead of 128–512 px: the images are 128 px, not 600);

The solver is py-faster-rcnn's VGG16 end2end solver (base_lr 0.001, step, gamma 0.1,
stepsize 50000, momentum 0.9, weight_decay 0.0005, iter_size 2, display 20, average_loss
100) with ``max_iter`` and ``snapshot`` set here. Its train.py starts from ImageNet VGG16
weights (``--weights``); there are none here, so ``init.caffemodel`` holds random weights for
conv1_1 … conv5_3, fc6 and fc7, whose prototxt has no fillers (see :func:`init_weights`).

``--tiny`` trains examples/detection/frcnn_tiny_net.py's small net of the same layout instead (2000
iterations take about a minute). ``--resume-check`` trains 4 iterations straight and 2 + 2
resumed from the iteration-2 solverstate, and compares the final weights bit for bit. The
evaluation is examples/detection/frcnn_eval.py's (held-out synthetic images, VOC AP at IoU 0.5)
on the snapshots as written: their ``bbox_pred`` is un-normalized already, as py-faster-rcnn's
train.py writes it (lowering/forks/rcnn_targets.py ``bbox_pred_snapshot``).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples.detection.synthetic_boxes import make_boxes  # noqa: E402

MODEL = ROOT.parent / "shared" / "forks" / "models" / "faster_rcnn_vgg16_train.prototxt"
CLASSES = 4


def rewrite_data(text: str, lmdb: Path, size: int, classes: int = CLASSES) -> str:
    """A py-faster-rcnn / py-R-FCN train prototxt with the RoIDataLayer's ``param_str`` given
    the LMDB, ``scale`` = ``size`` and ``classes``, and anchor ``scales`` (2, 4, 8)."""
    data = (f"'num_classes': {classes} \\n'source': '{lmdb}' \\n'scale': {size} "
            f"\\n'max_size': {max(size, 1000)}")  # fmt: skip
    text = text.replace("param_str: \"'num_classes': 21\"", f'param_str: "{data}"', 1)
    return text.replace(
        "param_str: \"'feat_stride': 16\"",
        "param_str: \"'feat_stride': 16 \\n'scales': !!python/tuple [2, 4, 8]\"",
    )


def train_prototxt(lmdb: Path, size: int, source: Path = MODEL) -> str:
    """The fork's train prototxt with data paths and sizes rewritten (module docstring)."""
    text = rewrite_data(source.read_text(), lmdb, size)
    text = text.replace(
        "param_str: \"'num_classes': 21\"", f"param_str: \"'num_classes': {CLASSES}\""
    )
    text = re.sub(r"num_output: 21\b", f"num_output: {CLASSES}", text)
    return re.sub(r"num_output: 84\b", f"num_output: {4 * CLASSES}", text)


def solver_text(net: Path, prefix: Path, max_iter: int, snapshot: int) -> str:
    return (
        f'train_net: "{net}"\nbase_lr: 0.001\nlr_policy: "step"\ngamma: 0.1\n'
        "stepsize: 50000\ndisplay: 20\naverage_loss: 100\nmomentum: 0.9\n"
        f'weight_decay: 0.0005\nsnapshot: {snapshot}\nsnapshot_prefix: "{prefix}"\n'
        f"iter_size: 2\nmax_iter: {max_iter}\nrandom_seed: 1\n"
    )


def init_weights(net: Path, out: Path, seed: int = 7, conv_gain: float = 0.72) -> None:
    """Random weights for the layers train.py would load from ImageNet VGG16 (the prototxt
    gives conv1_1 … conv5_3, fc6 and fc7 no filler: all zeros): gaussian with std
    ``sqrt(2 / fan_in)`` (MSRA), times ``conv_gain`` for the convolutions so that conv5_3's
    activations are O(1) as a trained VGG16's are, not the ~50 of raw pixel values. Written
    with pycaffe's Net and ``net.save``."""
    import caffe2jax as caffe

    rng = np.random.default_rng(seed)
    model = caffe.Net(str(net), caffe.TRAIN)
    for blobs in model.params.values():
        w = blobs[0].data
        if w.any():
            continue  # a layer with a filler of its own (the RPN, cls_score, bbox_pred)
        gain = conv_gain if w.ndim == 4 else 1.0
        w[...] = rng.normal(0, gain * np.sqrt(2.0 / np.prod(w.shape[1:])), w.shape)
    model.save(str(out))


def cli(*args: object, cwd: Path) -> str:
    """``caffe2jax ARGS`` in ``cwd``; its log (stderr) returned, a failure raised."""
    done = subprocess.run([sys.executable, "-m", "caffe2jax", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"caffe2jax {' '.join(map(str, args))} failed:\n{done.stderr[-3000:]}")
    return done.stderr


def losses(log: str) -> list[tuple[int, float]]:
    """(iteration, smoothed loss) of the solver's display lines."""
    found = re.findall(r"Iteration (\d+) \(.*\), loss = ([-\d.e+naif]+)", log)
    return [(int(i), float(v)) for i, v in found]


def prepare_work(work: Path, size: int, count: int, net_text, solver_for, init) -> Path:
    """The synthetic data set, the train prototxt ``net_text(lmdb)``, the solver
    ``solver_for(net, snap_dir)`` and init weights ``init(net, out)`` in ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    lmdb = work / "boxes_lmdb"
    if not lmdb.exists():
        make_boxes(lmdb, count=count, size=size, seed=0)
    net = work / "train.prototxt"
    net.write_text(net_text(lmdb.resolve()))
    (work / "snap").mkdir(exist_ok=True)
    solver = work / "solver.prototxt"
    solver.write_text(solver_for(net.resolve(), (work / "snap").resolve()))
    if not (work / "init.caffemodel").exists():
        init(net, work / "init.caffemodel")
    return solver


def prepare(work: Path, size: int, count: int, max_iter: int, snapshot: int) -> Path:
    """Data set, rewritten train prototxt, solver and random init weights in ``work``."""
    return prepare_work(work, size, count, lambda lmdb: train_prototxt(lmdb, size),
                        lambda net, snap: solver_text(net, snap / "vgg16", max_iter, snapshot),
                        init_weights)  # fmt: skip


def train_and_evaluate(work: Path, solver: Path, iters: int, size: int, prefix: str,
                       **evaluation) -> None:  # fmt: skip
    """``caffe2jax train`` from init.caffemodel, the loss curve, then each snapshot's VOC mAP
    (examples/detection/frcnn_eval.py's ``evaluate`` with ``evaluation``'s options)."""
    from examples.detection.frcnn_eval import evaluate

    start = time.time()
    log = cli("train", "--solver", solver, "--weights", "init.caffemodel", "--force", cwd=work)
    print(f"{iters} iterations in {time.time() - start:.0f} s")
    for it, value in losses(log):
        print(f"iteration {it}: loss {value:.4f}")
    for snap in sorted((work / "snap").glob(f"{prefix}_iter_*.caffemodel"),
                       key=lambda p: int(p.stem.split("_")[-1])):  # fmt: skip
        result = evaluate(work / "train.prototxt", snap, size=size, **evaluation)
        print(f"{snap.name}: mAP {result['mAP']:.3f} (11-point {result['mAP11']:.3f})")


def resume_check(work: Path, size: int) -> bool:
    """4 iterations straight vs 2, snapshot, resume to 4: the weights equal bit for bit."""
    from caffe2jax.frontend import caffe_pb2

    solver = prepare(work, size, 48, 4, 2)
    cli("train", "--solver", solver, "--weights", "init.caffemodel", "--force", cwd=work)
    final = work / "snap" / "vgg16_iter_4.caffemodel"
    straight = final.read_bytes()
    final.unlink()
    (work / "snap" / "vgg16_iter_4.solverstate").unlink()
    cli("train", "--solver", solver, "--snapshot", work / "snap" / "vgg16_iter_2.solverstate",
        cwd=work)  # fmt: skip
    a, b = caffe_pb2.NetParameter(), caffe_pb2.NetParameter()
    a.ParseFromString(straight)
    b.ParseFromString(final.read_bytes())
    return all(list(x.data) == list(y.data) for la, lb in zip(a.layer, b.layer)
               for x, y in zip(la.blobs, lb.blobs))  # fmt: skip


def tiny(work: Path, iters: int = 2000, seed: int = 5) -> None:
    """The small net of frcnn_tiny_net.py (64×64 images, 48 of them), same built-in
    layers, base_lr 0.01 (×0.1 after 3/4 of the iterations), iter_size 2, the solver's
    ``random_seed`` = ``seed`` (fillers and sampling), through the CLI; evaluated like the
    VGG16 run."""
    from examples.detection.frcnn_eval import evaluate
    from examples.detection.frcnn_tiny_net import net_text

    work.mkdir(parents=True, exist_ok=True)
    if not (work / "boxes_lmdb").exists():
        make_boxes(work / "boxes_lmdb", count=48, size=64, seed=0)
    net = work / "train.prototxt"
    net.write_text(net_text((work / "boxes_lmdb").resolve()))
    prefix = (work / "tiny").resolve()
    (work / "solver.prototxt").write_text(
        f'train_net: "{net.resolve()}"\nbase_lr: 0.01\nlr_policy: "step"\ngamma: 0.1\n'
        f"stepsize: {iters * 3 // 4}\ndisplay: 100\naverage_loss: 50\nmomentum: 0.9\n"
        f'weight_decay: 0.0005\nsnapshot: {iters // 4}\nsnapshot_prefix: "{prefix}"\n'
        f"iter_size: 2\nmax_iter: {iters}\nrandom_seed: {seed}\n"
    )
    start = time.time()
    log = cli("train", "--solver", work / "solver.prototxt", "--force", cwd=work)
    print(f"{iters} iterations in {time.time() - start:.0f} s (compile included)")
    for it, value in losses(log):
        print(f"iteration {it}: loss {value:.4f}")
    for snap in sorted(
        work.glob("tiny_iter_*.caffemodel"), key=lambda p: int(p.stem.split("_")[-1])
    ):
        result = evaluate(net, snap, count=48, size=64)
        print(f"{snap.name}: mAP {result['mAP']:.3f} (11-point {result['mAP11']:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--snapshot", type=int, default=100)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--count", type=int, default=48)
    parser.add_argument("--resume-check", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="frcnn_tiny_net.py's net")
    parser.add_argument("--seed", type=int, default=5, help="--tiny's solver random_seed")
    args = parser.parse_args()
    if args.tiny:
        tiny(args.work / "tiny", args.iters, args.seed)
        return
    if args.resume_check:
        print("resume exact:", resume_check(args.work / "resume", args.size))
        return
    solver = prepare(args.work, args.size, args.count, args.iters, args.snapshot)
    train_and_evaluate(args.work, solver, args.iters, args.size, "vgg16")


if __name__ == "__main__":
    main()
